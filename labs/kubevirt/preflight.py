"""Preflight: can this cluster run the portal's VMs? ``assess`` turns what ``cluster_facts.gather`` read into
findings in plain words, each with its fix (reference §6, §8). Used by ``manage.py cluster_check`` and the system
check tagged ``cluster``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.utils.translation import gettext as _
from kubernetes.utils import parse_quantity

from labs.kubevirt.cluster_facts import ERROR, INFO, WARNING, ClusterFacts, Finding

KVM_RESOURCE = "devices.kubevirt.io/kvm"
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
IMAGE_VOLUME_GATE = "ImageVolume"
BETA_ON_BY_DEFAULT_SINCE = (1, 9, 0)
# First releases whose runtime mounts OCI image volumes (reference §6: k3s's containerd 2.2.3 does not, 2.3.2 does).
IMAGE_VOLUME_RUNTIMES = {"containerd": (2, 3, 0), "cri-o": (1, 31, 0)}
IMAGE_VOLUME_KUBERNETES = (1, 31, 0)


def parse_version(text: str) -> tuple[int, int, int] | None:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)) if match else None


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
    return int(parse_quantity(((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")))


def assess(facts: ClusterFacts) -> list[Finding]:
    """Findings for these facts, most severe first."""
    findings = list(facts.problems)
    if any(f.code == "unreachable" for f in findings):
        return findings
    kubevirt = facts.kubevirt
    version_text = kubevirt_version(kubevirt)
    if kubevirt is None and not any(f.code == "kubevirt_unreadable" for f in findings):
        findings.append(
            Finding(
                ERROR,
                "kubevirt_missing",
                _("KubeVirt is not installed: the cluster has no KubeVirt resource."),
                _("Install the KubeVirt operator and its KubeVirt CR (see kubevirt.io/user-guide)."),
            )
        )
    elif kubevirt is not None:
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

    kvm_nodes = [n for n in facts.nodes if _node_allocatable(n, KVM_RESOURCE) > 0]
    if facts.nodes and not kvm_nodes and developer_configuration(kubevirt).get("useEmulation"):
        findings.append(
            Finding(
                WARNING,
                "software_emulation",
                _("No node offers KVM; KubeVirt emulates the CPU in software, so lab VMs will be very slow."),
                _("Run the portal's VMs on nodes with hardware virtualisation."),
            )
        )
    elif facts.nodes and not kvm_nodes:
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

    order = {ERROR: 0, WARNING: 1, INFO: 2}
    return sorted(findings, key=lambda f: order.get(f.level, 3))


def _pod_security_findings(namespaces: list[dict[str, Any]], kubevirt: Mapping[str, Any] | None) -> list[Finding]:
    """Namespaces enforcing ``restricted`` refuse KubeVirt v1.9's virt-launcher pods unless the KubeVirt CR sets their
    seccomp profile (``virtualMachineInstanceProfile``); ``baseline`` admits them."""
    configuration = ((kubevirt or {}).get("spec") or {}).get("configuration") or {}
    profile = (configuration.get("seccompConfiguration") or {}).get("virtualMachineInstanceProfile") or {}
    custom = profile.get("customProfile") or {}
    if custom.get("localhostProfile") or custom.get("runtimeDefaultProfile"):
        return []
    levels = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(ENFORCE_LABEL) for n in namespaces}
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
            % {"command": f"kubectl label --overwrite namespace {name} {ENFORCE_LABEL}=privileged"},
        )
        for name in sorted(levels)
        if levels[name] == "restricted"
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
        level, code = ERROR, "image_volume_unsupported"
        why = _("Kubernetes %(server)s has no image volumes (they arrived in 1.31).") % {"server": facts.server_version}
    elif runtimes and all(v is False for v in verdicts):
        level, code = ERROR, "image_volume_unsupported"
        why = _("The nodes' container runtime (%(runtimes)s) cannot mount image volumes.") % {
            "runtimes": ", ".join(runtimes)
        }
    elif any(v is False for v in verdicts):
        level, code = WARNING, "image_volume_unsupported"
        why = _(
            "Some nodes run a container runtime that cannot mount image volumes (%(runtimes)s); VMs "
            "scheduled there will fail."
        ) % {"runtimes": ", ".join(r for r, v in zip(runtimes, verdicts, strict=True) if v is False)}
    elif not runtimes or any(v is None for v in verdicts):
        level, code = WARNING, "image_volume_unverified"
        why = _("The portal cannot tell whether the nodes' container runtime (%(runtimes)s) mounts image volumes.") % {
            "runtimes": ", ".join(r for r in runtimes if r) or "?"
        }
    else:
        return []
    return [Finding(level, code, " ".join([what, why, failure]), fix)]


def blocking(findings: list[Finding]) -> bool:
    return any(f.level == ERROR for f in findings)
