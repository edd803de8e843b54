"""Nodes and a scheduler over their allocatable resources, like kube-scheduler's fit and spread."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubesim.config import SimConfig
from kubesim.quantity import parse_quantity


@dataclass
class NodeUsage:
    name: str
    index: int
    cpu: Decimal
    memory: Decimal
    pods: int
    kvm: int
    used_cpu: Decimal = Decimal(0)
    used_memory: Decimal = Decimal(0)
    used_pods: int = 0
    used_kvm: int = 0
    unschedulable: bool = False  # cordoned
    free_ips: list[int] = field(default_factory=lambda: list(range(254, 1, -1)))

    def shortfalls(self, cpu: Decimal, memory: Decimal, kvm: int = 1) -> list[str]:
        if self.unschedulable:
            return ["node(s) were unschedulable"]
        reasons = []
        if self.used_pods + 1 > self.pods:
            reasons.append("Too many pods")
        if self.used_cpu + cpu > self.cpu:
            reasons.append("Insufficient cpu")
        if self.used_memory + memory > self.memory:
            reasons.append("Insufficient memory")
        if kvm and self.used_kvm + kvm > self.kvm:
            reasons.append("Insufficient devices.kubevirt.io/kvm")
        return reasons


def decimal_si(count: int) -> str:
    """A count as the kubelet writes a device plugin's (``resource.NewQuantity(n, DecimalSI)``): 1000 is ``1k``."""
    for suffix, factor in (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if count and count % factor == 0:
            return f"{count // factor}{suffix}"
    return str(count)


def render_node(config: SimConfig, index: int, name: str) -> dict[str, Any]:
    # virt-handler's device plugins advertise 1000 devices each (cmd/virt-handler/virt-handler.go, maxDevices);
    # none of KVM where guests cannot use it.
    devices = decimal_si(config.node_kvm_devices)
    kvm = devices if config.accelerator != "tcg" else "0"
    allocatable = {
        "cpu": config.node_cpu,
        "memory": config.node_memory,
        "pods": str(config.node_pods),
        "ephemeral-storage": "100Gi",
        "devices.kubevirt.io/kvm": kvm,
        "devices.kubevirt.io/tun": devices,
        "devices.kubevirt.io/vhost-net": devices,
        "hugepages-2Mi": "0",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "kubevirt.io/schedulable": "true",
                "node-role.kubernetes.io/worker": "",
            },
            "annotations": {"kubevirt.io/heartbeat": ""},
        },
        "spec": {"podCIDR": f"10.244.{index}.0/24", "podCIDRs": [f"10.244.{index}.0/24"]},
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "addresses": [
                {"type": "InternalIP", "address": f"192.168.122.{10 + index}"},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "nodeInfo": {
                "kubeletVersion": config.kubernetes_version,
                "kubeProxyVersion": config.kubernetes_version,
                "containerRuntimeVersion": config.container_runtime_version(),
                "operatingSystem": "linux",
                "architecture": "amd64",
                "osImage": "Ubuntu 24.04.2 LTS",
                "kernelVersion": "6.8.0-60-generic",
                "machineID": f"{index:032x}",
                "systemUUID": f"00000000-0000-0000-0000-{index:012x}",
                "bootID": f"{index:032x}",
            },
        },
    }


class Scheduler:
    """Bookkeeping of what each node has left, and the choice of a node for a pod."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeUsage] = {}
        # pod uid → (node, cpu, memory, ip, KVM devices)
        self._bound: dict[str, tuple[str, Decimal, Decimal, int, int]] = {}

    def add_node(self, node: dict[str, Any], index: int) -> None:
        allocatable = node["status"]["allocatable"]
        self.nodes[node["metadata"]["name"]] = NodeUsage(
            name=node["metadata"]["name"],
            index=index,
            cpu=parse_quantity(allocatable["cpu"]),
            memory=parse_quantity(allocatable["memory"]),
            pods=int(allocatable["pods"]),
            kvm=int(parse_quantity(allocatable.get("devices.kubevirt.io/kvm", "0"))),
        )

    def cordon(self, name: str, unschedulable: bool) -> None:
        if name in self.nodes:
            self.nodes[name].unschedulable = unschedulable

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        for uid, (node, *_rest) in list(self._bound.items()):
            if node == name:
                del self._bound[uid]

    def pick(self, cpu: Decimal, memory: Decimal, kvm: int = 1) -> tuple[str | None, str]:
        """The least-allocated node that fits, or None and the scheduler's FailedScheduling message."""
        best, best_score, reasons = None, None, {}
        for usage in self.nodes.values():
            shortfalls = usage.shortfalls(cpu, memory, kvm)
            if shortfalls:
                for reason in shortfalls:
                    reasons[reason] = reasons.get(reason, 0) + 1
                continue
            score = (usage.used_memory + memory) / usage.memory + (usage.used_cpu + cpu) / usage.cpu
            if best_score is None or score < best_score:
                best, best_score = usage.name, score
        if best is not None:
            return best, ""
        total = len(self.nodes)
        detail = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        message = f"0/{total} nodes are available: {detail}." if detail else f"0/{total} nodes are available."
        message += f" preemption: 0/{total} nodes are available: {total} No preemption victims found for incoming pod."
        return None, message

    def bind(self, pod_uid: str, node: str, cpu: Decimal, memory: Decimal, kvm: int = 1) -> str:
        usage = self.nodes[node]
        usage.used_cpu += cpu
        usage.used_memory += memory
        usage.used_pods += 1
        usage.used_kvm += kvm
        host = usage.free_ips.pop() if usage.free_ips else 255
        self._bound[pod_uid] = (node, cpu, memory, host, kvm)
        return f"10.244.{usage.index}.{host}"

    def release(self, pod_uid: str) -> bool:
        bound = self._bound.pop(pod_uid, None)
        if bound is None:
            return False
        node, cpu, memory, host, kvm = bound
        usage = self.nodes.get(node)
        if usage is not None:
            usage.used_cpu -= cpu
            usage.used_memory -= memory
            usage.used_pods -= 1
            usage.used_kvm -= kvm
            if host != 255:
                usage.free_ips.append(host)
        return True
