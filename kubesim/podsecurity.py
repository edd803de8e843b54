"""Pod Security admission for the pods kubesim creates: the namespace's ``enforce`` level against the pod.

Follows Kubernetes' pod-security-admission checks (``k8s.io/pod-security-admission/policy``) for the fields a
virt-launcher pod carries, and its refusal text: ``violates PodSecurity "restricted:latest": <check> (<detail>), …``.
"""

from __future__ import annotations

from typing import Any

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")
# Capabilities the baseline level allows a container to add (policy/check_capabilities_baseline.go).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or ()) + list(spec.get("containers") or ())


def _names(containers: list[dict[str, Any]]) -> str:
    quoted = ", ".join(f'"{c.get("name", "")}"' for c in containers)
    return f"container {quoted}" if len(containers) == 1 else f"containers {quoted}"


def _baseline(pod: dict[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    problems = []
    host = [f"{field}=true" for field in ("hostNetwork", "hostPID", "hostIPC") if spec.get(field)]
    if host:
        problems.append(f"host namespaces ({', '.join(host)})")
    privileged = [c for c in _containers(pod) if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        problems.append(f"privileged ({_names(privileged)} must not set securityContext.privileged=true)")
    added = sorted(
        {
            cap
            for c in _containers(pod)
            for cap in (((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or ())
            if cap not in BASELINE_CAPABILITIES
        }
    )
    if added:
        problems.append(
            f"non-default capabilities (containers must not include {', '.join(added)} in "
            "securityContext.capabilities.add)"
        )
    host_paths = [v.get("name", "") for v in spec.get("volumes") or () if "hostPath" in v]
    if host_paths:
        problems.append(f"hostPath volumes (volumes {', '.join(repr(n) for n in host_paths)})")
    return problems


def _restricted(pod: dict[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    pod_context = spec.get("securityContext") or {}
    containers = _containers(pod)
    problems = []
    escalating = [
        c for c in containers if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]
    if escalating:
        problems.append(
            f"allowPrivilegeEscalation != false ({_names(escalating)} must set "
            "securityContext.allowPrivilegeEscalation=false)"
        )
    not_dropping = [
        c
        for c in containers
        if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {}).get("drop") or ())
    ]
    if not_dropping:
        problems.append(
            f'unrestricted capabilities ({_names(not_dropping)} must set securityContext.capabilities.drop=["ALL"])'
        )
    volumes = sorted({key for v in spec.get("volumes") or () for key in v if key != "name"} - RESTRICTED_VOLUMES)
    if volumes:
        problems.append(f"restricted volume types (volume types {', '.join(volumes)} are not allowed)")
    if not pod_context.get("runAsNonRoot"):
        root = [c for c in containers if not (c.get("securityContext") or {}).get("runAsNonRoot")]
        if root:
            problems.append(f"runAsNonRoot != true (pod or {_names(root)} must set securityContext.runAsNonRoot=true)")
    if ((pod_context.get("seccompProfile") or {}).get("type")) not in ("RuntimeDefault", "Localhost"):
        unset = [
            c
            for c in containers
            if ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
            not in ("RuntimeDefault", "Localhost")
        ]
        if unset:
            problems.append(
                f"seccompProfile (pod or {_names(unset)} must set securityContext.seccompProfile.type "
                'to "RuntimeDefault" or "Localhost")'
            )
    return problems


def namespace_level(namespace: dict[str, Any] | None) -> tuple[str, str]:
    """The namespace's enforced level and version; an absent or unknown label is the default, privileged."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    return (level if level in LEVELS else "privileged"), labels.get(ENFORCE_VERSION_LABEL, "latest")


def violations(pod: dict[str, Any], level: str) -> list[str]:
    """What keeps ``pod`` from meeting ``level``, in pod-security-admission's words; empty when it is admitted."""
    if level == "privileged":
        return []
    problems = _baseline(pod)
    if level == "restricted":
        problems += _restricted(pod)
    return problems


def denial(pod: dict[str, Any], namespace: dict[str, Any] | None, *, pod_name: str) -> str | None:
    """The API server's 403 message for creating ``pod`` in ``namespace``, or None when it is admitted."""
    level, version = namespace_level(namespace)
    problems = violations(pod, level)
    if not problems:
        return None
    return f'pods "{pod_name}" is forbidden: violates PodSecurity "{level}:{version}": {", ".join(problems)}'
