"""The manifests under deploy/: least-privilege RBAC, a locked-down tenant namespace, hardened portal pods.

Every YAML file in deploy/ is parsed (templates rendered with sample values). The RBAC checks are written as
functions that return the problems they find, and each is shown to catch a bad manifest, so a pass means
something.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from labs.kubevirt import manifests

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SAMPLE = {
    "TENANT_NAMESPACE": "lab-tenant-a-1a2b3c",
    "TENANT_ID": "7",
    "QUOTA_VMS": "10",
    "QUOTA_REQUESTS_CPU": "2050m",
    "QUOTA_REQUESTS_MEMORY": "40960Mi",
    "PORTAL_NAMESPACE": "lab-portal",
    "KUBEVIRT_NAMESPACE": "kubevirt",
}
PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")

# What the portal may do in a tenant namespace, and nothing more: (apiGroup, resource) -> verbs.
TENANT_GRANTS = {
    ("kubevirt.io", "virtualmachines"): {"create", "get", "list", "watch", "delete", "patch"},
    ("kubevirt.io", "virtualmachineinstances"): {"get", "list", "watch", "patch"},
    ("subresources.kubevirt.io", "virtualmachines/start"): {"update"},
    ("subresources.kubevirt.io", "virtualmachines/stop"): {"update"},
    ("subresources.kubevirt.io", "virtualmachineinstances/console"): {"get"},
    ("subresources.kubevirt.io", "virtualmachineinstances/portforward"): {"get"},
    ("", "secrets"): {"create", "get", "list", "patch", "delete"},
    ("", "events"): {"get", "list"},
    ("networking.k8s.io", "networkpolicies"): {"create", "get"},
    ("", "resourcequotas"): {"create", "get", "patch"},
    ("", "limitranges"): {"create", "get"},
}
CLUSTER_GRANTS = {
    ("", "namespaces"): {"get", "create"},
    ("", "nodes"): {"get", "list"},
    ("kubevirt.io", "kubevirts"): {"get", "list"},
}
ESCALATION_VERBS = {"bind", "escalate", "impersonate"}
RBAC_RESOURCES = {"roles", "rolebindings", "clusterroles", "clusterrolebindings"}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def render(text: str) -> str:
    unknown = sorted(set(PLACEHOLDER.findall(text)) - set(SAMPLE))
    assert not unknown, f"template variables without a sample value: {unknown}"
    return PLACEHOLDER.sub(lambda match: SAMPLE[match.group(1)], text)


def deploy_files() -> list[Path]:
    return sorted(path for path in DEPLOY.rglob("*") if path.suffix in {".yaml", ".yml"})


def load_all() -> list[dict[str, Any]]:
    documents = []
    for path in deploy_files():
        for document in yaml.safe_load_all(render(path.read_text())):
            if document is not None:
                document["__file__"] = path.name
                documents.append(document)
    return documents


def of_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [document for document in documents if document.get("kind") == kind]


def rule_problems(role: dict[str, Any]) -> list[str]:
    """Everything wrong with a Role or ClusterRole, in words."""
    problems = []
    cluster_wide = role["kind"] == "ClusterRole"
    name = f"{role['kind']} {role['metadata']['name']}"
    if role.get("aggregationRule"):
        problems.append(f"{name} aggregates other roles")
    for rule in role.get("rules") or []:
        resources = rule.get("resources") or []
        verbs = set(rule.get("verbs") or [])
        if rule.get("nonResourceURLs"):
            problems.append(f"{name} grants non-resource URLs")
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            if any("*" in str(value) for value in rule.get(field) or []):
                problems.append(f"{name} has a wildcard in {field}")
        for resource in resources:
            base = resource.split("/")[0]
            if base == "pods" and (verbs & WRITE_VERBS or "/" in resource):
                problems.append(f"{name} may {sorted(verbs)} {resource}")
            if cluster_wide and base == "secrets":
                problems.append(f"{name} grants Secrets cluster-wide")
            if base in RBAC_RESOURCES and verbs & (WRITE_VERBS | ESCALATION_VERBS):
                problems.append(f"{name} may change RBAC ({resource})")
        if verbs & ESCALATION_VERBS:
            problems.append(f"{name} has escalation verbs {sorted(verbs & ESCALATION_VERBS)}")
    return problems


def grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    table: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules") or []:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                table.setdefault((group, resource), set()).update(rule.get("verbs") or [])
    return table


@pytest.fixture(scope="module")
def documents() -> list[dict[str, Any]]:
    return load_all()


def test_every_deploy_file_parses_and_is_a_kubernetes_object(documents):
    assert {path.name for path in deploy_files()} >= {"rbac.yaml", "tenant-namespace.yaml", "portal.yaml"}
    for document in documents:
        if document["__file__"] == "kustomization.yaml":
            continue
        assert document.get("apiVersion") and document.get("kind"), document["__file__"]
        assert document["metadata"].get("name"), document


def test_no_role_in_deploy_has_a_wildcard_pod_write_or_cluster_wide_secret(documents):
    roles = of_kind(documents, "Role") + of_kind(documents, "ClusterRole")
    assert roles, "deploy/ defines no Role or ClusterRole"
    for role in roles:
        assert rule_problems(role) == [], role["metadata"]["name"]


@pytest.mark.parametrize(
    ("rule", "kind", "expected"),
    [
        ({"apiGroups": ["*"], "resources": ["virtualmachines"], "verbs": ["get"]}, "Role", "wildcard in apiGroups"),
        ({"apiGroups": ["kubevirt.io"], "resources": ["*"], "verbs": ["get"]}, "Role", "wildcard in resources"),
        ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}, "Role", "wildcard in verbs"),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}, "Role", "may ['create'] pods"),
        ({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get"]}, "Role", "pods/exec"),
        ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}, "ClusterRole", "Secrets cluster-wide"),
        (
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["create"]},
            "Role",
            "may change RBAC",
        ),
        ({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]}, "Role", "escalation"),
    ],
)
def test_the_rbac_checks_catch_what_they_look_for(rule, kind, expected):
    problems = rule_problems({"kind": kind, "metadata": {"name": "bad"}, "rules": [rule]})
    assert any(expected in problem for problem in problems), problems


def test_tenant_role_grants_exactly_what_the_portal_needs(documents):
    (role,) = [r for r in of_kind(documents, "Role") if r["metadata"]["name"] == "lab-portal"]
    assert role["metadata"]["namespace"] == SAMPLE["TENANT_NAMESPACE"]
    assert grants(role) == TENANT_GRANTS
    assert not any(resource.startswith("pods") for _group, resource in grants(role))


def test_cluster_role_is_read_only_except_namespace_bootstrap(documents):
    (cluster_role,) = of_kind(documents, "ClusterRole")
    assert grants(cluster_role) == CLUSTER_GRANTS


def test_bindings_give_the_roles_to_the_portal_service_account_only(documents):
    accounts = {(sa["metadata"]["namespace"], sa["metadata"]["name"]) for sa in of_kind(documents, "ServiceAccount")}
    assert ("lab-portal", "lab-portal") in accounts
    bindings = of_kind(documents, "RoleBinding") + of_kind(documents, "ClusterRoleBinding")
    assert {b["kind"] for b in bindings} == {"RoleBinding", "ClusterRoleBinding"}
    for binding in bindings:
        assert binding["roleRef"]["name"] == "lab-portal", "only the portal's own roles, never admin/edit/cluster-admin"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "lab-portal", "namespace": "lab-portal"}]
    (role_binding,) = of_kind(documents, "RoleBinding")
    assert role_binding["roleRef"]["kind"] == "Role"
    assert role_binding["metadata"]["namespace"] == SAMPLE["TENANT_NAMESPACE"]


def tenant_objects(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in documents if d["__file__"] == "tenant-namespace.yaml"]


def test_tenant_namespace_enforces_the_pod_security_level_launcher_pods_need(documents):
    (namespace,) = of_kind(tenant_objects(documents), "Namespace")
    labels = namespace["metadata"]["labels"]
    # KubeVirt v1.9's launcher pods carry no seccomp profile by default: "restricted" refuses them.
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    (default_account,) = [sa for sa in of_kind(tenant_objects(documents), "ServiceAccount")]
    assert default_account["metadata"]["name"] == "default"
    assert default_account["automountServiceAccountToken"] is False


def test_tenant_ingress_is_denied_except_the_agent_port_from_virt_api_and_the_portal(documents):
    policies = {p["metadata"]["name"]: p for p in of_kind(tenant_objects(documents), "NetworkPolicy")}
    deny = policies["lab-portal-default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and not deny.get("ingress")
    agent = policies["lab-portal-allow-agent"]["spec"]
    (rule,) = agent["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8787}]
    for peer in rule["from"]:
        # Both selectors in one peer: pods matching the label IN that namespace, never "any namespace".
        assert peer["namespaceSelector"]["matchLabels"] and peer["podSelector"]["matchLabels"]
        assert "ipBlock" not in peer


def test_tenant_egress_blocks_cloud_metadata_and_private_ranges(documents):
    policies = {p["metadata"]["name"]: p for p in of_kind(tenant_objects(documents), "NetworkPolicy")}
    egress = policies["lab-portal-restrict-egress"]["spec"]
    assert egress["podSelector"] == {} and egress["policyTypes"] == ["Egress"]
    blocks = [peer["ipBlock"] for rule in egress["egress"] for peer in rule["to"] if "ipBlock" in peer]
    assert blocks == [
        {
            "cidr": "0.0.0.0/0",
            "except": [
                "169.254.0.0/16",
                "10.0.0.0/8",
                "172.16.0.0/12",
                "192.168.0.0/16",
                "100.64.0.0/10",
            ],
        }
    ]


def test_tenant_quota_and_limit_range_exist(documents):
    (quota,) = of_kind(tenant_objects(documents), "ResourceQuota")
    assert quota["spec"]["hard"]["requests.cpu"] == SAMPLE["QUOTA_REQUESTS_CPU"]
    (limit_range,) = of_kind(tenant_objects(documents), "LimitRange")
    (container,) = limit_range["spec"]["limits"]
    assert container["type"] == "Container" and container["defaultRequest"] and container["max"]
    # A default memory limit below the largest lab's launcher pod would kill that lab's guest.
    assert container["default"]["memory"] == container["max"]["memory"] == "20Gi"


def _without_file(document: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != "__file__"}


def test_template_matches_what_the_portal_creates_itself(documents):
    """The operator's template and the portal's own bootstrap (labs.kubevirt.manifests) build the same objects,
    so whichever runs first, the other finds them as it would have made them."""
    objects = tenant_objects(documents)
    tenant_id = int(SAMPLE["TENANT_ID"])
    (namespace,) = of_kind(objects, "Namespace")
    assert _without_file(namespace) == manifests.namespace(name=SAMPLE["TENANT_NAMESPACE"], tenant_id=tenant_id)
    ours = {p["metadata"]["name"]: _without_file(p) for p in of_kind(objects, "NetworkPolicy")}
    for policy in manifests.network_policies(
        namespace=SAMPLE["TENANT_NAMESPACE"],
        tenant_id=tenant_id,
        agent_port=8787,
        kubevirt_namespace=SAMPLE["KUBEVIRT_NAMESPACE"],
        portal_namespace=SAMPLE["PORTAL_NAMESPACE"],
    ):
        assert ours[policy["metadata"]["name"]] == policy
    (quota,) = of_kind(objects, "ResourceQuota")
    built = manifests.resource_quota(
        namespace=SAMPLE["TENANT_NAMESPACE"], tenant_id=tenant_id, max_vms=10, max_vcpus=20, max_memory_mib=40960
    )
    assert _without_file(quota) == built


def test_portal_pods_run_unprivileged_with_resources(documents):
    deployments = of_kind(documents, "Deployment")
    assert {d["metadata"]["name"] for d in deployments} == {"lab-portal-web", "lab-portal-worker", "lab-portal-beat"}
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not pod.get("hostNetwork") and not pod.get("hostPID")
        for container in pod.get("initContainers", []) + pod["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]
            assert not security.get("privileged")
            assert container["resources"]["requests"] and container["resources"]["limits"]
        uses_cluster = pod.get("serviceAccountName") == "lab-portal"
        assert uses_cluster or pod.get("automountServiceAccountToken") is False


@pytest.mark.django_db
def test_tenant_manifests_command_fills_the_template_with_the_tenants_figures(tenant_a, settings):
    from io import StringIO

    from django.core.management import call_command

    settings.PORTAL_NAMESPACE = "lab-portal"
    output = StringIO()
    call_command("tenant_manifests", tenant_a.name, stdout=output)
    objects = [d for d in yaml.safe_load_all(output.getvalue()) if d]
    (namespace,) = of_kind(objects, "Namespace")
    assert namespace == manifests.namespace(name=tenant_a.namespace, tenant_id=tenant_a.pk)
    (quota,) = of_kind(objects, "ResourceQuota")
    assert quota == manifests.resource_quota(
        namespace=tenant_a.namespace,
        tenant_id=tenant_a.pk,
        max_vms=tenant_a.max_concurrent_vms,
        max_vcpus=tenant_a.max_vcpus,
        max_memory_mib=tenant_a.max_memory_mib,
    )
    policies = {p["metadata"]["name"]: p for p in of_kind(objects, "NetworkPolicy")}
    for policy in manifests.network_policies(
        namespace=tenant_a.namespace,
        tenant_id=tenant_a.pk,
        agent_port=settings.AGENT_PORT,
        kubevirt_namespace=settings.KUBEVIRT_NAMESPACE,
        portal_namespace="lab-portal",
    ):
        assert policies[policy["metadata"]["name"]] == policy
    (role,) = of_kind(objects, "Role")
    assert role["metadata"]["namespace"] == tenant_a.namespace and grants(role) == TENANT_GRANTS


@pytest.mark.django_db
def test_tenant_manifests_command_refuses_an_unknown_tenant(tenant_a):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No tenant") as refusal:
        call_command("tenant_manifests", "No Such University")
    assert f'Tenants: {tenant_a.pk} "{tenant_a.name}".' in str(refusal.value)  # what to type instead


@pytest.mark.django_db
def test_tenant_manifests_command_finds_a_tenant_by_name_in_any_case_or_by_namespace(tenant_a):
    from io import StringIO

    from django.core.management import call_command

    for given in (tenant_a.name.upper(), tenant_a.namespace):
        output = StringIO()
        call_command("tenant_manifests", given, stdout=output)
        assert f"name: {tenant_a.namespace}\n" in output.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "said"), [("name: ${NO_SUCH}\n", "does not know: 'NO_SUCH'"), ("cost: $ 5\n", "stray '\\$'")]
)
def test_tenant_manifests_command_names_what_is_wrong_with_a_broken_template(
    tenant_a, tmp_path, monkeypatch, text, said
):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from api.management.commands import tenant_manifests

    template = tmp_path / "tenant-namespace.yaml"
    template.write_text(text)
    monkeypatch.setattr(tenant_manifests, "TEMPLATE", template)
    with pytest.raises(CommandError, match=said):
        call_command("tenant_manifests", tenant_a.name)


# Every call the portal's code makes to the Kubernetes API must be granted above, so a new call in the lifecycle
# cannot reach production without its RBAC line (and a review of why it is needed).
SOURCE_DIRS = ("labs", "grading", "portal")
CORE_RESOURCES = {
    "namespace": ("", "namespaces"),
    "node": ("", "nodes"),
    "secret": ("", "secrets"),
    "event": ("", "events"),
    "resource_quota": ("", "resourcequotas"),
    "limit_range": ("", "limitranges"),
    "pod": ("", "pods"),
    "service_account": ("", "serviceaccounts"),
    "config_map": ("", "configmaps"),
    "network_policy": ("networking.k8s.io", "networkpolicies"),
}
CLIENT_VERBS = {
    "create": "create",
    "delete": "delete",
    "patch": "patch",
    "replace": "update",
    "read": "get",
    "list": "list",
}
# ``.create_namespaced_secret(`` or a method named in a string, as in ``_kubevirt("create_namespaced_...")``.
CLIENT_CALL = re.compile(
    r"[.\"](create|delete|patch|replace|read|list)_(namespaced_|cluster_)?([a-z_]+?)(_for_all_namespaces)?[(\"]"
)
# The custom objects the portal reads and writes, by the client's generic method (plural passed as argument).
CUSTOM_OBJECT_CALLS = {
    ("namespaced", "create"): [("kubevirt.io", "virtualmachines")],
    ("namespaced", "get"): [("kubevirt.io", "virtualmachines")],
    ("namespaced", "delete"): [("kubevirt.io", "virtualmachines")],
    ("namespaced", "list"): [("kubevirt.io", "virtualmachines"), ("kubevirt.io", "virtualmachineinstances")],
    # A warm pool's VM labelled with the attempt that claimed it (operations.vm_label): the VM and its VMI.
    ("namespaced", "patch"): [("kubevirt.io", "virtualmachines"), ("kubevirt.io", "virtualmachineinstances")],
    ("cluster", "list"): [("kubevirt.io", "kubevirts")],
}


def portal_sources() -> list[Path]:
    root = DEPLOY.parent
    return [
        path
        for directory in SOURCE_DIRS
        for path in (root / directory).rglob("*.py")
        if "tests" not in path.parts and "migrations" not in path.parts
    ]


def kubernetes_client_methods() -> set[str]:
    from kubernetes import client

    apis = (
        client.CoreV1Api,
        client.NetworkingV1Api,
        client.CustomObjectsApi,
        client.RbacAuthorizationV1Api,
        client.AppsV1Api,
        client.BatchV1Api,
    )
    return {name for api in apis for name in dir(api) if not name.startswith("_")}


def ungranted_calls(
    text: str, *, where: str, namespaced: dict, cluster_wide: dict, seen_custom: set | None = None
) -> list[str]:
    """The Kubernetes API calls in ``text`` that the Role (namespaced) or ClusterRole does not grant."""
    methods = kubernetes_client_methods()
    missing = []
    for verb, scope, kind, all_namespaces in CLIENT_CALL.findall(text):
        method = f"{verb}_{scope}{kind}{all_namespaces}"
        if method not in methods:
            continue  # not a Kubernetes API call (asyncio's create_task, the admin's delete_model...)
        rbac_verb = CLIENT_VERBS[verb]
        if kind == "custom_object":
            if seen_custom is not None:
                seen_custom.add((scope.rstrip("_"), rbac_verb))
            targets = CUSTOM_OBJECT_CALLS.get((scope.rstrip("_"), rbac_verb))
            if targets is None:
                missing.append(f"{where}: {method}: a custom-object call this test does not know; map and grant it")
                continue
            table = namespaced if scope == "namespaced_" else cluster_wide
            missing += [f"{where}: {method}: {t} {rbac_verb}" for t in targets if rbac_verb not in table.get(t, ())]
            continue
        if kind not in CORE_RESOURCES:
            missing.append(f"{where}: {method}: unknown resource {kind!r}; add it here and grant it in deploy/")
            continue
        target = CORE_RESOURCES[kind]
        table = namespaced if scope == "namespaced_" and not all_namespaces else cluster_wide
        if rbac_verb not in table.get(target, ()):
            missing.append(f"{where}: {method}: {target} {rbac_verb} is not granted")
    return missing


def rbac_tables(documents) -> tuple[dict, dict]:
    (role,) = [r for r in of_kind(documents, "Role") if r["metadata"]["name"] == "lab-portal"]
    (cluster_role,) = of_kind(documents, "ClusterRole")
    return grants(role), grants(cluster_role)


def test_every_cluster_call_in_the_code_is_granted(documents):
    namespaced, cluster_wide = rbac_tables(documents)
    missing: list[str] = []
    seen_custom: set = set()
    for path in portal_sources():
        missing += ungranted_calls(
            path.read_text(),
            where=str(path.relative_to(DEPLOY.parent)),
            namespaced=namespaced,
            cluster_wide=cluster_wide,
            seen_custom=seen_custom,
        )
    assert missing == [], "\n".join(missing)
    # The scan itself found the calls this test is about.
    assert {("namespaced", "create"), ("namespaced", "list"), ("cluster", "list")} <= seen_custom


@pytest.mark.parametrize(
    "snippet",
    [
        "core.create_namespaced_pod(namespace, body)",
        "core.list_secret_for_all_namespaces()",
        'api("replace_namespaced_custom_object")(group, version, ns, "virtualmachines", name, body)',
        "core.delete_namespace(name)",
        "core.create_namespaced_config_map(namespace, body)",
    ],
)
def test_the_call_scan_catches_an_ungranted_call(documents, snippet):
    namespaced, cluster_wide = rbac_tables(documents)
    assert ungranted_calls(snippet, where="snippet", namespaced=namespaced, cluster_wide=cluster_wide)
