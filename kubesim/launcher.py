"""The virt-launcher pod virt-controller renders for a VMI: labels, requests and limits (reference §2, §8)."""

from __future__ import annotations

import math
import random
import string
from decimal import Decimal
from typing import Any

from kubesim.quantity import format_cpu, format_memory, parse_quantity

MI = Decimal(2**20)


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


def launcher_requests(spec: dict[str, Any], *, developer: dict[str, Any], fixed_overhead: str,
                      overhead_ratio: str | None = None) -> tuple[Decimal, Decimal]:
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
    overhead = guest / 512 + parse_quantity(fixed_overhead) + vcpus * 8 * MI + 8 * MI
    if (domain.get("devices") or {}).get("autoattachGraphicsDevice", True) is not False:
        overhead += 32 * MI
    if overhead_ratio:
        overhead *= Decimal(overhead_ratio)
    if resources.get("overcommitGuestOverhead"):
        overhead = Decimal(0)
    return cpu, guest + overhead


def _pod_suffix(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))


def render_pod(vmi: dict[str, Any], *, cpu: Decimal, memory: Decimal, kubevirt_version: str,
               rng: random.Random) -> dict[str, Any]:
    meta = vmi["metadata"]
    name = meta["name"]
    spec = vmi.get("spec") or {}
    hostname = (spec.get("hostname") or name.split(".")[0])[:63]
    labels = dict(meta.get("labels") or {})
    labels.update({"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": meta["uid"],
                   "vm.kubevirt.io/name": hostname, "vmi.kubevirt.io/id": name if len(name) <= 63 else
                   "".join(rng.choice(string.hexdigits.lower()) for _ in range(63))})
    grace = int(spec.get("terminationGracePeriodSeconds", 30))
    resources = spec.get("domain", {}).get("resources") or {}
    limits: dict[str, str] = {"devices.kubevirt.io/kvm": "1", "devices.kubevirt.io/tun": "1",
                              "devices.kubevirt.io/vhost-net": "1"}
    if (resources.get("limits") or {}).get("memory"):
        limits["memory"] = format_memory(memory)
    if (resources.get("limits") or {}).get("cpu"):
        limits["cpu"] = str(resources["limits"]["cpu"])
    containers = [{
        "name": "compute", "image": f"quay.io/kubevirt/virt-launcher:{kubevirt_version}",
        "command": ["/usr/bin/virt-launcher-monitor", "--qemu-timeout", "339s", "--name", name, "--uid",
                    meta["uid"], "--namespace", meta.get("namespace", ""), "--kubevirt-share-dir",
                    "/var/run/kubevirt", "--ephemeral-disk-dir", "/var/run/kubevirt-ephemeral-disks",
                    "--container-disk-dir", "/var/run/kubevirt/container-disks", "--grace-period-seconds",
                    str(grace + 15), "--hook-sidecars", "0"],
        "resources": {"requests": {"cpu": format_cpu(cpu), "memory": format_memory(memory),
                                   "ephemeral-storage": "50M"}, "limits": limits},
        "imagePullPolicy": "IfNotPresent",
    }]
    for volume in spec.get("volumes") or ():
        container_disk = volume.get("containerDisk")
        if container_disk:
            containers.append({"name": f"volume{volume['name']}", "image": container_disk.get("image", ""),
                               "command": ["/usr/bin/container-disk"], "imagePullPolicy":
                               container_disk.get("imagePullPolicy", "IfNotPresent")})
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"virt-launcher-{name}-{_pod_suffix(rng)}", "generateName": f"virt-launcher-{name}-",
            "namespace": meta.get("namespace"), "labels": labels,
            "annotations": {"kubevirt.io/domain": name, "kubectl.kubernetes.io/default-container": "compute",
                            "kubevirt.io/vm-generation": "1"},
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": name,
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"containers": containers, "restartPolicy": "Never", "schedulerName": "default-scheduler",
                 "serviceAccountName": "default", "automountServiceAccountToken": False,
                 "terminationGracePeriodSeconds": grace + 15, "hostname": hostname,
                 "nodeSelector": {"kubevirt.io/schedulable": "true", "cpumanager": "false"}
                 if spec.get("domain", {}).get("cpu", {}).get("dedicatedCpuPlacement")
                 else {"kubevirt.io/schedulable": "true"},
                 "readinessGates": [{"conditionType": "kubevirt.io/virtual-machine-unpaused"}],
                 "dnsPolicy": "ClusterFirst", "enableServiceLinks": False},
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }
