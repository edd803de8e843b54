"""The virt-launcher pod virt-controller renders for a VMI: labels, requests and limits, security context and the
serial console log container (KubeVirt v1.9.0 ``pkg/virt-controller/services/template.go``, ``rendercontainer.go``,
``serialconsolelog.go``, ``renderresources.go``; overhead ``pkg/hypervisor/kvm/hypervisorbackend.go``)."""

from __future__ import annotations

import math
import random
import string
from decimal import Decimal
from typing import Any

from kubesim.featuregates import developer_configuration
from kubesim.quantity import format_cpu, format_memory, parse_quantity

MI = Decimal(2**20)
NON_ROOT_UID = 107  # util.NonRootUID: the qemu user the non-root launcher runs as
CONSOLE_LOG_CONTAINER = "guest-console-log"
CONSOLE_LOG_REQUESTS = {"cpu": "5m", "memory": "35M"}
CONSOLE_LOG_LIMITS = {"cpu": "15m", "memory": "60M"}


def vcpu_count(spec: dict[str, Any]) -> int:
    domain = spec.get("domain") or {}
    cpu = domain.get("cpu")
    if cpu:
        return max(1, int(cpu.get("sockets") or 1) * int(cpu.get("cores") or 1) * int(cpu.get("threads") or 1))
    resources = domain.get("resources") or {}
    explicit = (resources.get("limits") or {}).get("cpu") or (resources.get("requests") or {}).get("cpu")
    if explicit:
        return max(1, math.ceil(parse_quantity(explicit)))
    return 1


def launcher_requests(
    spec: dict[str, Any], *, developer: dict[str, Any], fixed_overhead: str, overhead_ratio: str | None = None
) -> tuple[Decimal, Decimal]:
    """CPU cores and memory bytes the compute container requests.

    CPU: an explicit request wins, else vCPUs / cpuAllocationRatio. Memory: the guest request plus the
    overhead of KvmHypervisorBackend.GetMemoryOverhead (guest/512 + fixed daemons + 8Mi per vCPU + 8Mi IOThread
    + 32Mi video RAM).
    """
    domain = spec.get("domain") or {}
    resources = domain.get("resources") or {}
    requests = resources.get("requests") or {}
    vcpus = vcpu_count(spec)
    ratio = Decimal(str(developer.get("cpuAllocationRatio") or 10))
    cpu = parse_quantity(requests["cpu"]) if requests.get("cpu") else Decimal(vcpus) / ratio
    if requests.get("memory"):
        guest = parse_quantity(requests["memory"])
    else:
        overcommit = Decimal(str(developer.get("memoryOvercommit") or 100))
        guest = parse_quantity((domain.get("memory") or {}).get("guest") or "0") * 100 / overcommit
    # One byte of page table per 512 of guest memory, computed as resource.Quantity does: bytes rounded up to kB.
    pagetable = Decimal(math.ceil(guest / 1000) * 1000 // 512)
    overhead = pagetable + parse_quantity(fixed_overhead) + vcpus * 8 * MI + 8 * MI
    if (domain.get("devices") or {}).get("autoattachGraphicsDevice", True) is not False:
        overhead += 32 * MI
    if overhead_ratio:
        overhead *= Decimal(overhead_ratio)
    if resources.get("overcommitGuestOverhead"):
        overhead = Decimal(0)
    return cpu, guest + overhead


def configuration(kubevirt: dict[str, Any] | None) -> dict[str, Any]:
    return (((kubevirt or {}).get("spec") or {}).get("configuration")) or {}


def serial_console_log_enabled(spec: dict[str, Any], kubevirt: dict[str, Any] | None) -> bool:
    """serialconsolelog.go: off with the serial console, then the VMI's choice, then the cluster's."""
    devices = (spec.get("domain") or {}).get("devices") or {}
    if devices.get("autoattachSerialConsole") is False:
        return False
    if devices.get("logSerialConsole") is not None:
        return bool(devices["logSerialConsole"])
    return (configuration(kubevirt).get("virtualMachineOptions") or {}).get("disableSerialConsoleLog") is None


def seccomp_profile(kubevirt: dict[str, Any] | None) -> dict[str, Any] | None:
    """template.go: the pod's seccomp profile comes only from seccompConfiguration.virtualMachineInstanceProfile."""
    profile = (
        (configuration(kubevirt).get("seccompConfiguration") or {}).get("virtualMachineInstanceProfile") or {}
    ).get("customProfile") or {}
    if profile.get("localhostProfile"):
        return {"type": "Localhost", "localhostProfile": profile["localhostProfile"]}
    if profile.get("runtimeDefaultProfile"):
        return {"type": "RuntimeDefault"}
    return None


def _non_root_context(*add: str) -> dict[str, Any]:
    """rendercontainer.go's securityContext for a non-root launcher's containers."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if add:
        capabilities = {"add": list(add), "drop": ["ALL"]}
    return {
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": capabilities,
    }


def _pod_suffix(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))


def render_pod(
    vmi: dict[str, Any],
    *,
    cpu: Decimal,
    memory: Decimal,
    kubevirt_version: str,
    rng: random.Random,
    kubevirt: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta = vmi["metadata"]
    name = meta["name"]
    spec = vmi.get("spec") or {}
    hostname = (spec.get("hostname") or name.split(".")[0])[:63]
    labels = dict(meta.get("labels") or {})
    labels.update(
        {
            "kubevirt.io": "virt-launcher",
            "kubevirt.io/created-by": meta["uid"],
            "vm.kubevirt.io/name": hostname,
            "vmi.kubevirt.io/id": name
            if len(name) <= 63
            else "".join(rng.choice(string.hexdigits.lower()) for _ in range(63)),
        }
    )
    grace = int(spec.get("terminationGracePeriodSeconds", 30))
    resources = spec.get("domain", {}).get("resources") or {}
    limits: dict[str, str] = {"devices.kubevirt.io/tun": "1"}
    if not developer_configuration(kubevirt).get("useEmulation"):  # renderresources.go, getRequiredResources
        limits.update({"devices.kubevirt.io/kvm": "1", "devices.kubevirt.io/vhost-net": "1"})
    if (resources.get("limits") or {}).get("memory"):
        limits["memory"] = format_memory(memory)
    if (resources.get("limits") or {}).get("cpu"):
        limits["cpu"] = str(resources["limits"]["cpu"])
    containers = [
        {
            "name": "compute",
            "image": f"quay.io/kubevirt/virt-launcher:{kubevirt_version}",
            "command": [
                "/usr/bin/virt-launcher-monitor",
                "--qemu-timeout",
                "339s",
                "--name",
                name,
                "--uid",
                meta["uid"],
                "--namespace",
                meta.get("namespace", ""),
                "--kubevirt-share-dir",
                "/var/run/kubevirt",
                "--ephemeral-disk-dir",
                "/var/run/kubevirt-ephemeral-disks",
                "--container-disk-dir",
                "/var/run/kubevirt/container-disks",
                "--grace-period-seconds",
                str(grace + 15),
                "--hook-sidecars",
                "0",
            ],
            "resources": {
                "requests": {"cpu": format_cpu(cpu), "memory": format_memory(memory), "ephemeral-storage": "50M"},
                "limits": limits,
            },
            "imagePullPolicy": "IfNotPresent",
            "securityContext": _non_root_context("NET_BIND_SERVICE"),
        }
    ]
    for volume in spec.get("volumes") or ():
        container_disk = volume.get("containerDisk")
        if container_disk:
            containers.append(
                {
                    "name": f"volume{volume['name']}",
                    "image": container_disk.get("image", ""),
                    "command": ["/usr/bin/container-disk"],
                    "imagePullPolicy": container_disk.get("imagePullPolicy", "IfNotPresent"),
                    "securityContext": _non_root_context(),
                }
            )
    init_containers = []
    if serial_console_log_enabled(spec, kubevirt):
        # A sidecar (restartPolicy Always): its requests add to the pod's, for the scheduler and for quotas.
        init_containers.append(
            {
                "name": CONSOLE_LOG_CONTAINER,
                "image": f"quay.io/kubevirt/virt-launcher:{kubevirt_version}",
                "command": ["/usr/bin/virt-tail"],
                "args": ["--logfile", f"/var/run/kubevirt-private/{meta['uid']}/virt-serial0-log"],
                "resources": {"requests": dict(CONSOLE_LOG_REQUESTS), "limits": dict(CONSOLE_LOG_LIMITS)},
                "restartPolicy": "Always",
                "imagePullPolicy": "IfNotPresent",
                "securityContext": _non_root_context(),
            }
        )
    pod_context: dict[str, Any] = {
        "fsGroup": NON_ROOT_UID,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "runAsNonRoot": True,
    }
    profile = seccomp_profile(kubevirt)
    if profile:
        pod_context["seccompProfile"] = profile
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"virt-launcher-{name}-{_pod_suffix(rng)}",
            "generateName": f"virt-launcher-{name}-",
            "namespace": meta.get("namespace"),
            "labels": labels,
            "annotations": {
                "kubevirt.io/domain": name,
                "kubectl.kubernetes.io/default-container": "compute",
                "kubevirt.io/vm-generation": "1",
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": name,
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": containers,
            "initContainers": init_containers,
            "securityContext": pod_context,
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": grace + 15,
            "hostname": hostname,
            "nodeSelector": {"kubevirt.io/schedulable": "true", "cpumanager": "false"}
            if spec.get("domain", {}).get("cpu", {}).get("dedicatedCpuPlacement")
            else {"kubevirt.io/schedulable": "true"},
            "readinessGates": [{"conditionType": "kubevirt.io/virtual-machine-unpaused"}],
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": False,
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }
