"""Which Pod Security level admits KubeVirt v1.9's virt-launcher pods: ``baseline`` does; ``restricted`` also needs
the KubeVirt CR's seccomp profile (``virtualMachineInstanceProfile``), or the VMI stays Pending with FailedCreate.
The portal's namespaces enforce ``privileged``, as KubeVirt's functional tests label theirs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
# The level the portal's namespaces enforce; audit and warn at restricted show operators what would tighten it.
ENFORCE_LEVEL = "privileged"
AUDIT_LEVEL = "restricted"


def seccomp_profile_configured(kubevirt: Mapping[str, Any] | None) -> bool:
    configuration = ((kubevirt or {}).get("spec") or {}).get("configuration") or {}
    profile = (configuration.get("seccompConfiguration") or {}).get("virtualMachineInstanceProfile") or {}
    custom = profile.get("customProfile") or {}
    return bool(custom.get("localhostProfile") or custom.get("runtimeDefaultProfile"))


def enforced_level(namespace: Mapping[str, Any]) -> str:
    """The namespace's enforced level; no label means the cluster's default (privileged unless configured)."""
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    return labels.get(ENFORCE_LABEL, "")


def refuses_launcher(level: str, kubevirt: Mapping[str, Any] | None) -> bool:
    return level == "restricted" and not seccomp_profile_configured(kubevirt)


def fix_command(namespace: str) -> str:
    return f"kubectl label --overwrite namespace {namespace} {ENFORCE_LABEL}={ENFORCE_LEVEL}"


def refusing_namespaces(namespaces: Sequence[Mapping[str, Any]], kubevirt: Mapping[str, Any] | None) -> list[str]:
    """Names of the namespaces whose enforced level would refuse launcher pods, sorted."""
    return sorted(n["metadata"]["name"] for n in namespaces if refuses_launcher(enforced_level(n), kubevirt))
