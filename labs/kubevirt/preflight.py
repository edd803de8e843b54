"""Preflight: can this cluster run the portal's VMs? Findings in plain words, each with the fix.

:func:`gather` reads what it needs (``/version``, the KubeVirt CR, the nodes) in three requests; :func:`assess`
is pure and turns those facts into findings. Used by ``manage.py cluster_check`` and by the Django system check
tagged ``cluster`` (run with ``manage.py check --deploy``).

What it knows (reference §6, §8):
- a VM needs a node advertising ``devices.kubevirt.io/kvm`` unless KubeVirt emulates (slowly);
- from KubeVirt v1.9 Beta feature gates are on by default, ImageVolume among them; on a container runtime without
  image volumes (containerd before 2.3, CRI-O before 1.31, Kubernetes before 1.31) the containerDisk volume mounts
  empty and every VM fails with ``container-disk ... no such file or directory``. The fix is
  ``disabledFeatureGates: [ImageVolume]`` in the KubeVirt CR (or a newer runtime);
- ``spec.running`` is deprecated (admission warns since v1.4); the portal sends ``runStrategy: Always``;
- a tenant namespace enforcing Pod Security ``restricted`` refuses every launcher pod unless the KubeVirt CR sets a
  seccomp profile (``labs.kubevirt.podsecurity``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.utils.translation import gettext as _
from kubernetes.utils import parse_quantity

from labs.kubevirt import client, podsecurity, tenant_namespaces
from labs.kubevirt.operations import REQUEST_TIMEOUT, ClusterError, cluster_error

ERROR = "error"
WARNING = "warning"
INFO = "info"

KVM_RESOURCE = "devices.kubevirt.io/kvm"
IMAGE_VOLUME_GATE = "ImageVolume"
BETA_ON_BY_DEFAULT_SINCE = (1, 9, 0)
# First releases whose runtime mounts OCI image volumes (reference §6: k3s's containerd 2.2.3 does not, 2.3.2 does).
IMAGE_VOLUME_RUNTIMES = {"containerd": (2, 3, 0), "cri-o": (1, 31, 0)}
IMAGE_VOLUME_KUBERNETES = (1, 31, 0)


@dataclass(frozen=True)
class Finding:
    level: str
    code: str
    message: str
    fix: str = ""


@dataclass
class ClusterFacts:
    server_version: str = ""
    kubevirt: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)
    # The tenant namespaces the portal knows of, as the cluster has them, and those whose objects it may not manage
    # (namespace, tenant name, what the cluster said).
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    forbidden: list[tuple[str, str, str]] = field(default_factory=list)
    # Problems met while reading (unreachable API, missing permission), already as findings.
    problems: list[Finding] = field(default_factory=list)


def parse_version(text: str) -> tuple[int, int, int] | None:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def gather() -> ClusterFacts:
    """Read the server version, the KubeVirt CR and the nodes. Never raises for cluster trouble: it is a finding."""
    facts = ClusterFacts()
    try:
        response = client.version_api().get_code(_preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        facts.server_version = json.loads(response.data).get("gitVersion", "")
    except Exception as exc:
        error = _as_cluster_error(exc, doing="reading /version")
        facts.problems.append(
            Finding(
                ERROR,
                "unreachable",
                _("Cannot talk to the cluster API: %(error)s") % {"error": error.message},
                _("Check KUBECONFIG (or the in-cluster service account) and that the API server is reachable."),
            )
        )
        return facts
    try:
        facts.kubevirt = _read_kubevirt()
    except ClusterError as unreadable:
        facts.problems.append(
            Finding(
                ERROR,
                "kubevirt_unreadable",
                _("Cannot read the KubeVirt resource: %(error)s") % {"error": unreadable.message},
                _("Grant the portal get/list on kubevirts.kubevirt.io, or check that KubeVirt is installed."),
            )
        )
    try:
        response = client.core_v1().list_node(_preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        facts.nodes = list(json.loads(response.data).get("items") or [])
    except Exception as exc:
        error = _as_cluster_error(exc, doing="listing nodes")
        facts.problems.append(
            Finding(
                WARNING,
                "nodes_unreadable",
                _(
                    "Cannot list the cluster's nodes, so KVM support and the container runtime are not checked: "
                    "%(error)s"
                )
                % {"error": error.message},
                _("Grant the portal's service account list on nodes to enable these checks."),
            )
        )
    tenants = tenant_namespaces.read()
    facts.namespaces = tenants.namespaces
    facts.forbidden = tenants.forbidden
    facts.problems.extend(
        Finding(
            WARNING,
            "namespace_unreadable",
            _("Cannot read tenant namespace %(namespace)s, so its Pod Security level is not checked: %(error)s")
            % {"namespace": name, "error": said},
            _("Grant the portal's service account get on namespaces."),
        )
        for name, said in tenants.unreadable
    )
    if tenants.unchecked:
        facts.problems.append(
            Finding(
                INFO,
                "namespaces_unchecked",
                _("Tenant namespaces were not checked: the portal's database cannot be read (%(error)s).")
                % {"error": tenants.unchecked},
                _("Run the check again once the database is migrated."),
            )
        )
    return facts


def _as_cluster_error(exc: Exception, *, doing: str) -> ClusterError:
    try:
        return cluster_error(exc, doing=doing)
    except Exception as other:  # anything else the client raised still ends up as a finding, not a traceback
        return ClusterError(f"{doing}: {other.__class__.__name__}: {other}")


def _read_kubevirt() -> dict[str, Any] | None:
    """The KubeVirt CR: listed cluster-wide, or in ``settings.KUBEVIRT_NAMESPACE`` when that is all RBAC allows."""
    api = client.custom_objects()
    try:
        response = api.list_cluster_custom_object(
            client.KUBEVIRT_GROUP,
            client.KUBEVIRT_VERSION,
            "kubevirts",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
    except Exception as exc:
        error = _as_cluster_error(exc, doing="listing KubeVirt resources")
        if error.status not in (401, 403):
            raise error from exc
        try:
            response = api.list_namespaced_custom_object(
                client.KUBEVIRT_GROUP,
                client.KUBEVIRT_VERSION,
                settings.KUBEVIRT_NAMESPACE,
                "kubevirts",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except Exception as inner:
            raise _as_cluster_error(inner, doing="listing KubeVirt resources") from inner
    items = json.loads(response.data).get("items") or []
    return items[0] if items else None


def developer_configuration(kubevirt: Mapping[str, Any] | None) -> dict[str, Any]:
    configuration = ((kubevirt or {}).get("spec") or {}).get("configuration") or {}
    return configuration.get("developerConfiguration") or {}


def kubevirt_version(kubevirt: Mapping[str, Any] | None) -> str:
    status = (kubevirt or {}).get("status") or {}
    return status.get("observedKubeVirtVersion") or status.get("targetKubeVirtVersion") or ""


def image_volume_enabled(kubevirt: Mapping[str, Any] | None) -> bool:
    """KubeVirt's rule: explicit enable, then explicit disable, then Beta on by default from v1.9."""
    developer = developer_configuration(kubevirt)
    if IMAGE_VOLUME_GATE in (developer.get("featureGates") or ()):
        return True
    if IMAGE_VOLUME_GATE in (developer.get("disabledFeatureGates") or ()):
        return False
    version = parse_version(kubevirt_version(kubevirt))
    return version is not None and version >= BETA_ON_BY_DEFAULT_SINCE


def runtime_mounts_image_volumes(runtime: str) -> bool | None:
    """True or False for runtimes whose support is known by version; None when the runtime is not one of them."""
    name, _sep, version_text = (runtime or "").partition("://")
    minimum = IMAGE_VOLUME_RUNTIMES.get(name.lower())
    version = parse_version(version_text)
    if minimum is None or version is None:
        return None
    return version >= minimum


def _node_allocatable(node: Mapping[str, Any], resource: str) -> int:
    """A node's allocatable count, read as the quantity it is (the kubelet writes 1000 devices as ``1k``)."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
    try:
        return int(parse_quantity(value))
    except ValueError:
        return 0


def assess(facts: ClusterFacts) -> list[Finding]:
    """Findings for these facts, most severe first."""
    findings = list(facts.problems)
    if any(f.code == "unreachable" for f in findings):
        return findings
    kubevirt = facts.kubevirt
    if kubevirt is None and not any(f.code == "kubevirt_unreadable" for f in findings):
        findings.append(
            Finding(
                ERROR,
                "kubevirt_missing",
                _("KubeVirt is not installed: the cluster has no KubeVirt resource."),
                _("Install the KubeVirt operator and its KubeVirt CR (see kubevirt.io/user-guide)."),
            )
        )
    version_text = kubevirt_version(kubevirt)
    developer = developer_configuration(kubevirt)

    if kubevirt is not None:
        phase = ((kubevirt.get("status") or {}).get("phase")) or ""
        if phase != "Deployed":
            findings.append(
                Finding(
                    WARNING,
                    "kubevirt_not_deployed",
                    _("KubeVirt reports phase %(phase)s, not Deployed: VMs may not start.") % {"phase": phase or "?"},
                    _("Wait for the operator to finish, or look at the KubeVirt resource's conditions."),
                )
            )

    if facts.nodes:
        kvm_nodes = [n for n in facts.nodes if _node_allocatable(n, KVM_RESOURCE) > 0]
        if not kvm_nodes:
            if developer.get("useEmulation"):
                findings.append(
                    Finding(
                        WARNING,
                        "software_emulation",
                        _("No node offers KVM; KubeVirt emulates the CPU in software, so lab VMs will be very slow."),
                        _("Run the portal's VMs on nodes with hardware virtualisation."),
                    )
                )
            else:
                findings.append(
                    Finding(
                        ERROR,
                        "no_kvm",
                        _("No node offers KVM (allocatable %(resource)s), so no VM can be scheduled.")
                        % {"resource": KVM_RESOURCE},
                        _(
                            "Enable hardware virtualisation (or nested virtualisation) on the nodes and check that "
                            "virt-handler runs there; for a test cluster only, set useEmulation in the KubeVirt CR."
                        ),
                    )
                )
    else:
        kvm_nodes = []

    findings.extend(_pod_security_findings(facts.namespaces, kubevirt))
    findings.extend(
        Finding(
            ERROR,
            "tenant_role_missing",
            _(
                "The portal may not manage tenant namespace %(namespace)s (tenant %(tenant)s): its Role and "
                "RoleBinding are not applied, so no lab of that tenant can start. The cluster says: %(error)s"
            )
            % {"namespace": namespace, "tenant": tenant, "error": said},
            _('As a cluster admin, run: python manage.py tenant_manifests "%(tenant)s" | kubectl apply -f -')
            % {"tenant": tenant},
        )
        for namespace, tenant, said in facts.forbidden
    )

    if kubevirt is not None and image_volume_enabled(kubevirt):
        findings.extend(_image_volume_findings(facts, kvm_nodes or facts.nodes, version_text))

    if kubevirt is not None:
        findings.append(
            Finding(
                INFO,
                "running_deprecated",
                _(
                    "KubeVirt %(version)s deprecates spec.running (admission warns about it since v1.4); the portal's "
                    "VMs use spec.runStrategy: Always, so nothing needs doing."
                )
                % {"version": version_text or "?"},
            )
        )
    order = {ERROR: 0, WARNING: 1, INFO: 2}
    return sorted(findings, key=lambda f: order.get(f.level, 3))


def _pod_security_findings(namespaces: list[dict[str, Any]], kubevirt: Mapping[str, Any] | None) -> list[Finding]:
    return [
        Finding(
            ERROR,
            "namespace_pod_security",
            _(
                'Tenant namespace %(namespace)s enforces Pod Security "restricted", which refuses KubeVirt\'s '
                "virt-launcher pods (the KubeVirt resource sets no seccomp profile for them): no lab VM can start "
                'there; each Start stays Pending with FailedCreate "it needs a privileged namespace to run".'
            )
            % {"namespace": name},
            _(
                "Run: %(command)s (or set spec.configuration.seccompConfiguration.virtualMachineInstanceProfile in the "
                "KubeVirt resource)."
            )
            % {"command": podsecurity.fix_command(name)},
        )
        for name in podsecurity.refusing_namespaces(namespaces, kubevirt)
    ]


def _image_volume_findings(facts: ClusterFacts, nodes: list[dict[str, Any]], version_text: str) -> list[Finding]:
    fix = _(
        "Add ImageVolume to spec.configuration.developerConfiguration.disabledFeatureGates in the KubeVirt resource "
        '(kubectl -n kubevirt patch kubevirt kubevirt --type=json -p \'[{"op":"add","path":'
        '"/spec/configuration/developerConfiguration/disabledFeatureGates","value":["ImageVolume"]}]\'), '
        "or upgrade the container runtime (containerd 2.3 or later)."
    )
    server = parse_version(facts.server_version)
    runtimes = sorted(
        {((n.get("status") or {}).get("nodeInfo") or {}).get("containerRuntimeVersion", "") for n in nodes}
    )
    verdicts = [runtime_mounts_image_volumes(r) for r in runtimes]
    what = _(
        "KubeVirt %(version)s has the ImageVolume feature gate on (Beta gates are on by default from v1.9), so "
        "containerDisk VMs get their disk through a Kubernetes image volume."
    ) % {"version": version_text or "?"}
    failure = _(
        "On a runtime without image volumes the volume mounts empty and every lab VM fails with "
        "'container-disk ... no such file or directory'."
    )
    if server is not None and server < IMAGE_VOLUME_KUBERNETES:
        return [
            Finding(
                ERROR,
                "image_volume_unsupported",
                " ".join(
                    [
                        what,
                        _("Kubernetes %(server)s has no image volumes (they arrived in 1.31).")
                        % {"server": facts.server_version},
                        failure,
                    ]
                ),
                fix,
            )
        ]
    if runtimes and all(v is False for v in verdicts):
        return [
            Finding(
                ERROR,
                "image_volume_unsupported",
                " ".join(
                    [
                        what,
                        _("The nodes' container runtime (%(runtimes)s) cannot mount image volumes.")
                        % {"runtimes": ", ".join(runtimes)},
                        failure,
                    ]
                ),
                fix,
            )
        ]
    if any(v is False for v in verdicts):
        lacking = [r for r, v in zip(runtimes, verdicts, strict=True) if v is False]
        return [
            Finding(
                WARNING,
                "image_volume_unsupported",
                " ".join(
                    [
                        what,
                        _(
                            "Some nodes run a container runtime that cannot mount image volumes (%(runtimes)s); VMs "
                            "scheduled there will fail."
                        )
                        % {"runtimes": ", ".join(lacking)},
                        failure,
                    ]
                ),
                fix,
            )
        ]
    if not runtimes or any(v is None for v in verdicts):
        return [
            Finding(
                WARNING,
                "image_volume_unverified",
                " ".join(
                    [
                        what,
                        _(
                            "The portal cannot tell whether the nodes' container runtime (%(runtimes)s) mounts image "
                            "volumes."
                        )
                        % {"runtimes": ", ".join(r for r in runtimes if r) or "?"},
                        failure,
                    ]
                ),
                fix,
            )
        ]
    return []


def blocking(findings: list[Finding]) -> bool:
    return any(f.level == ERROR for f in findings)


def findings_as_json(findings: list[Finding]) -> list[dict[str, str]]:
    return [asdict(f) for f in findings]
