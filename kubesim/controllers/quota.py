"""What each namespace's pods ask for, kept up to date as the pods change: a ResourceQuota's ``used``.

The quota controller and quota admission both need a namespace's usage, and a pod is admitted, scheduled and
started once per VMI: summing every pod of the namespace each time made a burst of VMI starts quadratic. The
store tells its listeners of every write as it happens, so each pod's requests are counted once when it is written
and the namespace's totals move by the difference. A pod in a final phase (Succeeded, Failed) counts for nothing,
as Kubernetes' quota evaluator does not count terminal pods.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubesim.controllers.objects import FINAL_PHASES
from kubesim.quantity import parse_quantity
from kubesim.store import Store, WatchEvent

ZERO = Decimal(0)


def pod_requests(pod: dict[str, Any]) -> tuple[Decimal, Decimal] | None:
    """The CPU and memory a pod requests, or None for a pod in a final phase (it counts for nothing)."""
    if (pod.get("status") or {}).get("phase") in FINAL_PHASES:
        return None
    return effective_requests(pod)


def _requests(container: dict[str, Any]) -> tuple[Decimal, Decimal]:
    requests = (container.get("resources") or {}).get("requests") or {}
    return parse_quantity(requests.get("cpu", "0")), parse_quantity(requests.get("memory", "0"))


def effective_requests(pod: dict[str, Any]) -> tuple[Decimal, Decimal]:
    """The pod's requests as the scheduler and quota count them: its containers plus its sidecars (init containers
    with ``restartPolicy: Always``), or a plain init container's if larger (``resourcehelper.PodRequests``)."""
    spec = pod.get("spec") or {}
    cpu = memory = ZERO
    for container in spec.get("containers") or ():
        c, m = _requests(container)
        cpu, memory = cpu + c, memory + m
    init_cpu = init_memory = ZERO
    for container in spec.get("initContainers") or ():
        c, m = _requests(container)
        if container.get("restartPolicy") == "Always":
            cpu, memory = cpu + c, memory + m
        else:
            init_cpu, init_memory = max(init_cpu, c), max(init_memory, m)
    return max(cpu, init_cpu), max(memory, init_memory)


class PodUsage:
    """Per namespace: pods counted, CPU and memory requested, by every pod not in a final phase."""

    def __init__(self, store: Store) -> None:
        self._counted: dict[str, tuple[str, Decimal, Decimal]] = {}  # pod uid → (namespace, cpu, memory)
        self._totals: dict[str, list[Decimal]] = {}  # namespace → [pods, cpu, memory]
        for entry in store.entries("pods"):
            self._count(entry.obj)
        store.listeners.append(self._on_change)

    def usage(self, namespace: str) -> dict[str, Decimal]:
        """The namespace's usage under every name a quota may give it (``pods`` and ``count/pods``, ...)."""
        pods, cpu, memory = self._totals.get(namespace) or (ZERO, ZERO, ZERO)
        return {
            "pods": pods,
            "count/pods": pods,
            "requests.cpu": cpu,
            "cpu": cpu,
            "requests.memory": memory,
            "memory": memory,
        }

    def _on_change(self, resource: str, event: WatchEvent) -> None:
        if resource != "pods":
            return
        pod = event.entry.obj
        self._forget(pod["metadata"]["uid"])
        if event.type != "DELETED":
            self._count(pod)

    def _count(self, pod: dict[str, Any]) -> None:
        requests = pod_requests(pod)
        if requests is None:
            return
        meta = pod["metadata"]
        namespace = meta.get("namespace", "")
        cpu, memory = requests
        self._counted[meta["uid"]] = (namespace, cpu, memory)
        totals = self._totals.setdefault(namespace, [ZERO, ZERO, ZERO])
        totals[0] += 1
        totals[1] += cpu
        totals[2] += memory

    def _forget(self, uid: str) -> None:
        counted = self._counted.pop(uid, None)
        if counted is None:
            return
        namespace, cpu, memory = counted
        totals = self._totals[namespace]
        totals[0] -= 1
        totals[1] -= cpu
        totals[2] -= memory
        if not totals[0]:
            del self._totals[namespace]
