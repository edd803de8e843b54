"""The cluster's controllers: virt-controller (VM → VMI → virt-launcher pod), kube-scheduler, kubelet and
virt-handler (pod and VMI phases, the guest), the namespace controller and the event recorder.

Controllers are level-triggered: a store change queues the affected keys, and reconciling a key reads the
current objects and moves them one step on. Phase delays are timers that queue the key again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from kubesim.apiserver import ApiServer
from kubesim.config import SimConfig
from kubesim.controllers.images import ImagePullController
from kubesim.controllers.objects import EVENT, KUBEVIRT, NAMESPACE, NODE, POD, VmiRuntime
from kubesim.controllers.quota import PodUsage
from kubesim.controllers.vm import VirtualMachineController
from kubesim.controllers.vmi import VirtualMachineInstanceController
from kubesim.featuregates import default_kubevirt
from kubesim.profiles import PROFILES, PhasePlan, profile_rng
from kubesim.resources import BY_KEY
from kubesim.scheduler import Scheduler, render_node
from kubesim.store import Store, WatchEvent, now_rfc3339

log = logging.getLogger("kubesim.controller")


@dataclass
class Counters:
    """How much of the simulated cluster's work happened, for the admin endpoint."""

    reconciles: int = 0
    vmis_started: int = 0
    errors: int = 0
    last_error: str = ""


class Cluster(VirtualMachineController, VirtualMachineInstanceController, ImagePullController):
    """Owns the controllers and the scheduler; wired to the store as a listener."""

    def __init__(self, *, store: Store, api: ApiServer, config: SimConfig, guests: Any) -> None:
        self.store = store
        self.api = api
        self.config = config
        self.guests = guests
        self.rng = random.Random(config.seed)
        self.profile_rng = profile_rng(config.seed)
        self.scheduler = Scheduler()
        self.runtimes: dict[str, VmiRuntime] = {}
        self._runtime_uids: dict[tuple[str, str], str] = {}  # (namespace, name) → uid of the VMI known by it
        self.counters = Counters()
        self._queue: dict[tuple[str, str, str], None] = {}
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unschedulable: set[tuple[str, str]] = set()
        self._event_keys: deque[tuple[str, str]] = deque()
        self._event_index: dict[tuple[str, str, str, str], str] = {}
        self._node_index = 0
        api.vmi_mutator = self._mutate_new_vmi
        api.kubevirt_getter = self.kubevirt
        self.pod_usage = PodUsage(store)  # ResourceQuota usage, kept as pods change
        store.listeners.append(self._on_change)

    # ---- bootstrapping -----------------------------------------------------------------------------------
    def bootstrap(self) -> None:
        for name in ("default", "kube-system", "kube-public", "kube-node-lease", "kubevirt"):
            self.api.create(NAMESPACE, "", {"metadata": {"name": name}}, internal=True)
        self.api.create(KUBEVIRT, "kubevirt", default_kubevirt(self.config), internal=True)
        for _ in range(self.config.nodes):
            self.add_node()

    def add_node(self, name: str | None = None) -> dict[str, Any]:
        self._node_index += 1
        name = name or f"node{self._node_index:02d}"
        node = self.api.create(NODE, "", render_node(self.config, self._node_index, name), internal=True)[0]
        self.scheduler.add_node(node, self._node_index)
        self._requeue_unschedulable()
        return node

    def kubevirt(self) -> dict[str, Any] | None:
        return self.store.get("kubevirts", "kubevirt", "kubevirt")

    # ---- the work queue ----------------------------------------------------------------------------------
    def _on_change(self, resource: str, event: WatchEvent) -> None:
        obj = event.entry.obj
        meta = obj["metadata"]
        if resource == "virtualmachines":
            self.enqueue("vm", meta["namespace"], meta["name"])
        elif resource == "virtualmachineinstances":
            self.enqueue("vmi", meta["namespace"], meta["name"])
            for ref in meta.get("ownerReferences") or ():
                if ref.get("kind") == "VirtualMachine":
                    self.enqueue("vm", meta["namespace"], ref["name"])
        elif resource == "pods":
            if event.type == "DELETED" and self.scheduler.release(meta["uid"]):
                self._requeue_unschedulable()
            elif event.type != "DELETED" and meta.get("deletionTimestamp"):
                self.enqueue("pod", meta["namespace"], meta["name"])
            for ref in meta.get("ownerReferences") or ():
                if ref.get("kind") == "VirtualMachineInstance":
                    self.enqueue("vmi", meta["namespace"], ref["name"])
            self.enqueue("quota", meta["namespace"], "")
        elif resource == "namespaces" and meta.get("deletionTimestamp"):
            self.enqueue("namespace", "", meta["name"])
        elif resource == "resourcequotas" and event.type != "DELETED":
            self.enqueue("quota", meta["namespace"], "")

    def enqueue(self, kind: str, namespace: str, name: str) -> None:
        self._queue[(kind, namespace, name)] = None
        if not self._draining:
            self._draining = True
            self.loop.call_soon(self._drain)

    def enqueue_later(self, delay: float, kind: str, namespace: str, name: str) -> None:
        self.loop.call_later(max(0.0, delay), self.enqueue, kind, namespace, name)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _drain(self) -> None:
        try:
            # Bounded batches keep the event loop responsive while hundreds of VMs start at once.
            for _ in range(2000):
                if not self._queue:
                    break
                key = next(iter(self._queue))
                del self._queue[key]
                self._reconcile(*key)
        finally:
            if self._queue:
                self.loop.call_soon(self._drain)
            else:
                self._draining = False

    def _reconcile(self, kind: str, namespace: str, name: str) -> None:
        self.counters.reconciles += 1
        try:
            if kind == "vm":
                self.reconcile_vm(namespace, name)
            elif kind == "vmi":
                self.reconcile_vmi(namespace, name)
            elif kind == "namespace":
                self.reconcile_namespace(name)
            elif kind == "quota":
                self.reconcile_quotas(namespace)
            elif kind == "pod":
                self.reconcile_pod(namespace, name)
        except Exception as exc:  # a controller bug must not stop the other controllers; it is logged loudly
            self.counters.errors += 1
            self.counters.last_error = f"{kind} {namespace}/{name}: {exc!r}"
            log.exception("reconcile %s %s/%s failed", kind, namespace, name)

    def _delay(self, base: float) -> float:
        if base <= 0 and self.config.jitter <= 0:
            return 0.0
        return max(0.0, base + self.rng.uniform(0, self.config.jitter))

    def _draw_plan(self) -> PhasePlan | None:
        """A new VMI's delays under the timing profile, or None without one."""
        profile = PROFILES.get(self.config.profile)
        return profile.draw(self.profile_rng) if profile else None

    def _phase_delay(self, runtime: VmiRuntime, phase: str) -> float:
        """Seconds the VMI spends in ``phase`` (pending, scheduling, scheduled, agent): its plan's or the flags'."""
        if runtime.plan is not None:
            return float(getattr(runtime.plan, phase))
        return self._delay(getattr(self.config, f"{phase}_delay"))

    # ---- events ------------------------------------------------------------------------------------------
    def record(
        self, obj: dict[str, Any], type_: str, reason: str, message: str, component: str, host: str | None = None
    ) -> None:
        """Emit a core/v1 Event about ``obj``; a repeat of the same event bumps its count, as the recorder does."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        index_key = (meta.get("uid", ""), reason, message, component)
        existing_name = self._event_index.get(index_key)
        stamp = now_rfc3339()
        if existing_name:

            def bump(event: dict[str, Any]) -> None:
                event["count"] = event.get("count", 1) + 1
                event["lastTimestamp"] = stamp

            if self.api.mutate(EVENT, namespace, existing_name, bump) is not None:
                return
        name = f"{meta['name']}.{time.time_ns():x}"
        source = {"component": component}
        if host:
            source["host"] = host
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "kind": obj["kind"],
                "namespace": meta.get("namespace"),
                "name": meta["name"],
                "uid": meta.get("uid"),
                "apiVersion": obj["apiVersion"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "source": source,
            "type": type_,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "eventTime": None,
            "reportingComponent": component,
            "reportingInstance": host or "",
        }
        try:
            self.api.create(EVENT, namespace, event, internal=True)
        except Exception:  # the namespace may be terminating; events are best effort, as in client-go
            return
        self._event_index[index_key] = name
        self._event_keys.append((namespace, name))
        while len(self._event_keys) > self.config.event_limit:
            old_namespace, old_name = self._event_keys.popleft()
            gone = self.store.remove("events", old_namespace, old_name)
            if gone is not None:
                involved = gone.get("involvedObject", {})
                self._event_index.pop(
                    (
                        involved.get("uid", ""),
                        gone.get("reason"),
                        gone.get("message"),
                        gone.get("source", {}).get("component"),
                    ),
                    None,
                )

    # ---- nodes -------------------------------------------------------------------------------------------
    def remove_node(self, name: str) -> bool:
        """The node disappears: its launcher pods go and its VMIs fail, as when virt-handler stops answering."""
        if self.store.get("nodes", "", name) is None:
            return False
        self.api.remove(NODE, "", name)
        self.scheduler.remove_node(name)
        for runtime in list(self.runtimes.values()):
            if runtime.node != name:
                continue
            pod = self._pod_for(runtime)
            self.fail_vmi(
                runtime.namespace,
                runtime.name,
                reason="NodeUnresponsive",
                message="virt-handler on node " + name + " is not responsive",
            )
            if pod is not None:
                self.api.remove(POD, runtime.namespace, pod["metadata"]["name"])
        return True

    # ---- namespaces --------------------------------------------------------------------------------------
    def reconcile_namespace(self, name: str) -> None:
        namespace = self.store.get("namespaces", "", name)
        if namespace is None or not namespace["metadata"].get("deletionTimestamp"):
            return
        remaining = False
        for resource in BY_KEY.values():
            if not resource.namespaced:
                continue
            for obj in list(self.store.objects(resource.key, name)):
                remaining = True
                if not obj["metadata"].get("deletionTimestamp"):
                    self.api.delete(resource, name, obj["metadata"]["name"], internal=True)
        if remaining and self.store.namespaces_in_use(name):
            self.enqueue_later(0.05, "namespace", "", name)
            return

        def finalize(o: dict[str, Any]) -> None:
            o["spec"]["finalizers"] = []

        self.api.mutate(NAMESPACE, "", name, finalize)
        current = self.store.get("namespaces", "", name)
        if current is not None and not current["metadata"].get("finalizers"):
            self.api.remove(NAMESPACE, "", name)
