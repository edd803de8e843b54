"""The resource types kubesim serves, with the discovery documents kubectl and the clients read."""

from __future__ import annotations

from dataclasses import dataclass, field

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
READ_VERBS = ("get", "list", "watch")
COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class ResourceType:
    """One REST resource: where it lives, what it is called, what clients may do with it."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    field_selectors: frozenset[str] = field(default=COMMON_FIELDS)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """The identifier used for storage, counters and fault rules (``virtualmachineinstances``)."""
        return self.plural

    @property
    def group_resource(self) -> str:
        """How the API server names the resource in error messages (``virtualmachines.kubevirt.io``)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


_POD_FIELDS = COMMON_FIELDS | {
    "spec.nodeName",
    "status.phase",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "status.podIP",
    "status.nominatedNodeName",
}
_EVENT_FIELDS = COMMON_FIELDS | {
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.fieldPath",
    "involvedObject.resourceVersion",
    "reason",
    "reportingComponent",
    "source",
    "type",
}

RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
        status_subresource=True,
        field_selectors=COMMON_FIELDS | {"status.phase"},
    ),
    ResourceType("", "v1", "secrets", "secret", "Secret", field_selectors=COMMON_FIELDS | {"type"}),
    ResourceType("", "v1", "configmaps", "configmap", "ConfigMap", short_names=("cm",)),
    ResourceType("", "v1", "events", "event", "Event", short_names=("ev",), field_selectors=_EVENT_FIELDS),
    # virt-launcher pods belong to kubesim's virt-controller: clients may read them, and delete them (which
    # kills the VMI, as on a cluster), but not create or change them.
    ResourceType(
        "",
        "v1",
        "pods",
        "pod",
        "Pod",
        short_names=("po",),
        categories=("all",),
        verbs=("delete", "get", "list", "watch"),
        field_selectors=_POD_FIELDS,
    ),
    ResourceType(
        "",
        "v1",
        "nodes",
        "node",
        "Node",
        namespaced=False,
        short_names=("no",),
        verbs=READ_VERBS,
        field_selectors=COMMON_FIELDS | {"spec.unschedulable"},
    ),
    ResourceType(
        "", "v1", "resourcequotas", "resourcequota", "ResourceQuota", short_names=("quota",), status_subresource=True
    ),
    ResourceType("", "v1", "limitranges", "limitrange", "LimitRange", short_names=("limits",)),
    ResourceType(
        "networking.k8s.io", "v1", "networkpolicies", "networkpolicy", "NetworkPolicy", short_names=("netpol",)
    ),
    ResourceType("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", short_names=("sa",)),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "role", "Role"),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding"),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", namespaced=False),
    ResourceType(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    # Answered from the RBAC rules for the caller (rbac.py), never stored.
    ResourceType(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        "SelfSubjectAccessReview",
        namespaced=False,
        verbs=("create",),
    ),
    ResourceType(
        "kubevirt.io",
        "v1",
        "virtualmachines",
        "virtualmachine",
        "VirtualMachine",
        short_names=("vm", "vms"),
        categories=("all",),
        status_subresource=True,
    ),
    ResourceType(
        "kubevirt.io",
        "v1",
        "virtualmachineinstances",
        "virtualmachineinstance",
        "VirtualMachineInstance",
        short_names=("vmi", "vmis"),
        categories=("all",),
    ),
    ResourceType(
        "kubevirt.io",
        "v1",
        "kubevirts",
        "kubevirt",
        "KubeVirt",
        short_names=("kv", "kvs"),
        categories=("all",),
        status_subresource=True,
    ),
)

BY_PATH: dict[tuple[str, str, str], ResourceType] = {(r.group, r.version, r.plural): r for r in RESOURCES}
BY_KEY: dict[str, ResourceType] = {r.key: r for r in RESOURCES}
BY_KIND: dict[str, ResourceType] = {r.kind: r for r in RESOURCES}

GROUP_VERSIONS: dict[str, list[str]] = {}
for _resource in RESOURCES:
    GROUP_VERSIONS.setdefault(_resource.group, [])
    if _resource.version not in GROUP_VERSIONS[_resource.group]:
        GROUP_VERSIONS[_resource.group].append(_resource.version)

SUBRESOURCE_GROUP = "subresources.kubevirt.io"
SUBRESOURCE_VERSIONS = ("v1", "v1alpha3")

# (name, kind, verbs) as virt-api lists them in its APIResourceList.
_SUBRESOURCES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("virtualmachineinstances/console", "VirtualMachineInstance", ("get",)),
    ("virtualmachineinstances/vnc", "VirtualMachineInstance", ("get",)),
    ("virtualmachineinstances/portforward", "VirtualMachineInstance", ("get",)),
    ("virtualmachineinstances/pause", "VirtualMachineInstance", ("update",)),
    ("virtualmachineinstances/unpause", "VirtualMachineInstance", ("update",)),
    ("virtualmachineinstances/guestosinfo", "VirtualMachineInstance", ("get",)),
    ("virtualmachineinstances/userlist", "VirtualMachineInstance", ("get",)),
    ("virtualmachineinstances/filesystemlist", "VirtualMachineInstance", ("get",)),
    ("virtualmachineinstances/softreboot", "VirtualMachineInstance", ("update",)),
    ("virtualmachines/start", "VirtualMachine", ("update",)),
    ("virtualmachines/stop", "VirtualMachine", ("update",)),
    ("virtualmachines/restart", "VirtualMachine", ("update",)),
    ("virtualmachines/portforward", "VirtualMachine", ("get",)),
)


def resource_list(group: str, version: str) -> dict | None:
    """The ``APIResourceList`` for one group version, or None when kubesim does not serve it."""
    if group == SUBRESOURCE_GROUP:
        if version not in SUBRESOURCE_VERSIONS:
            return None
        entries = [
            {"name": name, "singularName": "", "namespaced": True, "kind": kind, "verbs": list(verbs)}
            for name, kind, verbs in _SUBRESOURCES
        ]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}",
            "resources": entries,
        }
    entries = []
    for resource in RESOURCES:
        if resource.group != group or resource.version != version:
            continue
        entry = {
            "name": resource.plural,
            "singularName": resource.singular,
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": list(resource.verbs),
        }
        if resource.short_names:
            entry["shortNames"] = list(resource.short_names)
        if resource.categories:
            entry["categories"] = list(resource.categories)
        entries.append(entry)
        if resource.plural == "pods":
            entries.append(
                {
                    "name": "pods/eviction",
                    "singularName": "",
                    "namespaced": True,
                    "group": "policy",
                    "version": "v1",
                    "kind": "Eviction",
                    "verbs": ["create"],
                }
            )
        if resource.status_subresource:
            entries.append(
                {
                    "name": f"{resource.plural}/status",
                    "singularName": "",
                    "namespaced": resource.namespaced,
                    "kind": resource.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    if not entries:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1" if group else "",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": entries,
    }


def group_list() -> dict:
    """The ``APIGroupList`` served at ``/apis``."""
    groups = []
    for group, versions in GROUP_VERSIONS.items():
        if not group:
            continue
        groups.append(_group(group, versions))
    groups.append(_group(SUBRESOURCE_GROUP, list(SUBRESOURCE_VERSIONS)))
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _group(group: str, versions: list[str]) -> dict:
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": listed, "preferredVersion": listed[0]}


def group_document(group: str) -> dict | None:
    """The ``APIGroup`` served at ``/apis/{group}``."""
    if group == SUBRESOURCE_GROUP:
        return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, list(SUBRESOURCE_VERSIONS))}
    if group in GROUP_VERSIONS and group:
        return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, GROUP_VERSIONS[group])}
    return None
