"""Shared pieces of the controllers: resource types, conditions, phases and per-VMI runtime state."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from kubesim.profiles import PhasePlan
from kubesim.quantity import format_cpu, format_memory
from kubesim.resources import BY_KEY
from kubesim.store import now_rfc3339

VM = BY_KEY["virtualmachines"]
VMI = BY_KEY["virtualmachineinstances"]
POD = BY_KEY["pods"]
NODE = BY_KEY["nodes"]
EVENT = BY_KEY["events"]
NAMESPACE = BY_KEY["namespaces"]
KUBEVIRT = BY_KEY["kubevirts"]
QUOTA = BY_KEY["resourcequotas"]
FINAL_PHASES = ("Succeeded", "Failed")
CONTAINER_DISK_ERROR = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
    "runc create failed: unable to start container process: error during container init: "
    'exec: "/container-disk-binary/usr/bin/container-disk": stat '
    "/container-disk-binary/usr/bin/container-disk: no such file or directory: unknown"
)
GUEST_OS = {
    "fedora": {
        "name": "Fedora Linux",
        "id": "fedora",
        "version": "42 (Cloud Edition)",
        "versionId": "42",
        "prettyName": "Fedora Linux 42 (Cloud Edition)",
        "kernelRelease": "6.14.0-63.fc42.x86_64",
    },
    "ubuntu": {
        "name": "Ubuntu",
        "id": "ubuntu",
        "version": "24.04.2 LTS (Noble Numbat)",
        "versionId": "24.04",
        "prettyName": "Ubuntu 24.04.2 LTS",
        "kernelRelease": "6.8.0-60-generic",
    },
    "debian": {
        "name": "Debian GNU/Linux",
        "id": "debian",
        "version": "12 (bookworm)",
        "versionId": "12",
        "prettyName": "Debian GNU/Linux 12 (bookworm)",
        "kernelRelease": "6.1.0-37-cloud-amd64",
    },
    "centos": {
        "name": "CentOS Stream",
        "id": "centos",
        "version": "10",
        "versionId": "10",
        "prettyName": "CentOS Stream 10",
        "kernelRelease": "6.12.0-55.el10.x86_64",
    },
}


def new_condition(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    condition = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def set_condition(obj: dict[str, Any], condition: dict[str, Any]) -> None:
    """Set a condition, keeping lastTransitionTime when the status does not change."""
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    for index, existing in enumerate(conditions):
        if existing.get("type") == condition["type"]:
            if (existing.get("status"), existing.get("reason"), existing.get("message")) == (
                condition["status"],
                condition.get("reason"),
                condition.get("message"),
            ):
                return
            if existing.get("status") == condition["status"]:
                condition["lastTransitionTime"] = existing.get("lastTransitionTime")
            conditions[index] = condition
            return
    conditions.append(condition)


def drop_condition(obj: dict[str, Any], type_: str) -> None:
    conditions = obj.get("status", {}).get("conditions")
    if conditions:
        obj["status"]["conditions"] = [c for c in conditions if c.get("type") != type_]


def get_condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or ():
        if condition.get("type") == type_:
            return condition
    return None


def set_phase(vmi: dict[str, Any], phase: str) -> None:
    status = vmi.setdefault("status", {})
    status["phase"] = phase
    stamps = status.setdefault("phaseTransitionTimestamps", [])
    if not any(stamp.get("phase") == phase for stamp in stamps):
        stamps.append({"phase": phase, "phaseTransitionTimestamp": now_rfc3339()})


def run_strategy(vm: dict[str, Any]) -> str:
    spec = vm.get("spec") or {}
    if spec.get("runStrategy"):
        return spec["runStrategy"]
    return "Always" if spec.get("running") else "Halted"


def owner_reference(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


@dataclass
class VmiRuntime:
    """What virt-controller and virt-handler remember about one VMI beyond its object."""

    uid: str
    namespace: str
    name: str
    next_at: float = 0.0
    pod_name: str | None = None
    node: str | None = None
    ip: str | None = None
    agent_at: float | None = None
    stop_at: float | None = None
    pulled: bool = False
    image_pulls: int = 0  # failed pulls so far: kubelet's back-off doubles with each
    image_backing_off: bool = False
    image_next_at: float | None = None
    create_refused: bool = False
    plan: PhasePlan | None = None  # the delays drawn for this VMI under a timing profile


def format_quantity(resource: str, value: Decimal) -> str:
    if "memory" in resource:
        return format_memory(value)
    if "cpu" in resource:
        return format_cpu(value)
    return str(int(value))


def parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
