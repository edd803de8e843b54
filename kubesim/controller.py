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
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from kubesim.apiserver import VM_FINALIZER, VMI_FINALIZER, ApiServer
from kubesim.config import SimConfig
from kubesim.featuregates import default_kubevirt, developer_configuration, gate_enabled
from kubesim.launcher import launcher_requests, render_pod
from kubesim.quantity import parse_quantity
from kubesim.resources import BY_KEY
from kubesim.scheduler import Scheduler, render_node
from kubesim.store import Store, WatchEvent, now_rfc3339

log = logging.getLogger("kubesim.controller")

VM = BY_KEY["virtualmachines"]
VMI = BY_KEY["virtualmachineinstances"]
POD = BY_KEY["pods"]
NODE = BY_KEY["nodes"]
EVENT = BY_KEY["events"]
NAMESPACE = BY_KEY["namespaces"]
KUBEVIRT = BY_KEY["kubevirts"]
QUOTA = BY_KEY["resourcequotas"]
FINAL_PHASES = ("Succeeded", "Failed")
CONTAINER_DISK_ERROR = ('failed to create containerd task: failed to create shim task: OCI runtime create failed: '
                        'runc create failed: unable to start container process: error during container init: '
                        'exec: "/container-disk-binary/usr/bin/container-disk": stat '
                        '/container-disk-binary/usr/bin/container-disk: no such file or directory: unknown')
GUEST_OS = {
    "fedora": {"name": "Fedora Linux", "id": "fedora", "version": "42 (Cloud Edition)", "versionId": "42",
               "prettyName": "Fedora Linux 42 (Cloud Edition)", "kernelRelease": "6.14.0-63.fc42.x86_64"},
    "ubuntu": {"name": "Ubuntu", "id": "ubuntu", "version": "24.04.2 LTS (Noble Numbat)", "versionId": "24.04",
               "prettyName": "Ubuntu 24.04.2 LTS", "kernelRelease": "6.8.0-60-generic"},
    "debian": {"name": "Debian GNU/Linux", "id": "debian", "version": "12 (bookworm)", "versionId": "12",
               "prettyName": "Debian GNU/Linux 12 (bookworm)", "kernelRelease": "6.1.0-37-cloud-amd64"},
    "centos": {"name": "CentOS Stream", "id": "centos", "version": "10", "versionId": "10",
               "prettyName": "CentOS Stream 10", "kernelRelease": "6.12.0-55.el10.x86_64"},
}


def _condition(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    condition = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _set_condition(obj: dict[str, Any], condition: dict[str, Any]) -> None:
    """Set a condition, keeping lastTransitionTime when the status does not change."""
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    for index, existing in enumerate(conditions):
        if existing.get("type") == condition["type"]:
            if (existing.get("status"), existing.get("reason"), existing.get("message")) == (
                    condition["status"], condition.get("reason"), condition.get("message")):
                return
            if existing.get("status") == condition["status"]:
                condition["lastTransitionTime"] = existing.get("lastTransitionTime")
            conditions[index] = condition
            return
    conditions.append(condition)


def _drop_condition(obj: dict[str, Any], type_: str) -> None:
    conditions = obj.get("status", {}).get("conditions")
    if conditions:
        obj["status"]["conditions"] = [c for c in conditions if c.get("type") != type_]


def _get_condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or ():
        if condition.get("type") == type_:
            return condition
    return None


def _set_phase(vmi: dict[str, Any], phase: str) -> None:
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


def _owner_reference(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


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
    image_error_reported: bool = False


@dataclass
class Counters:
    """How much of the simulated cluster's work happened, for the admin endpoint."""

    reconciles: int = 0
    vmis_started: int = 0
    errors: int = 0
    last_error: str = ""


class Cluster:
    """Owns the controllers and the scheduler; wired to the store as a listener."""

    def __init__(self, *, store: Store, api: ApiServer, config: SimConfig, guests: Any) -> None:
        self.store = store
        self.api = api
        self.config = config
        self.guests = guests
        self.rng = random.Random(config.seed)
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

    # ---- events ------------------------------------------------------------------------------------------
    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str, component: str,
               host: str | None = None) -> None:
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
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {"kind": obj["kind"], "namespace": meta.get("namespace"), "name": meta["name"],
                               "uid": meta.get("uid"), "apiVersion": obj["apiVersion"],
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message, "source": source, "type": type_, "count": 1,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "eventTime": None,
            "reportingComponent": component, "reportingInstance": host or "",
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
                self._event_index.pop((involved.get("uid", ""), gone.get("reason"), gone.get("message"),
                                       gone.get("source", {}).get("component")), None)

    # ---- VirtualMachine ------------------------------------------------------------------------------------
    def reconcile_vm(self, namespace: str, name: str) -> None:
        vm = self.store.get("virtualmachines", namespace, name)
        if vm is None:
            return
        vmi = self.store.get("virtualmachineinstances", namespace, name)
        if vmi is not None and not any(ref.get("uid") == vm["metadata"]["uid"]
                                       for ref in vmi["metadata"].get("ownerReferences") or ()):
            vmi = None  # a VMI of the same name that this VM does not own
        meta = vm["metadata"]
        strategy = run_strategy(vm)
        if meta.get("deletionTimestamp"):
            if vmi is not None and not vmi["metadata"].get("deletionTimestamp"):
                self._stop_vmi(vm, vmi)
            elif vmi is None and VM_FINALIZER in (meta.get("finalizers") or ()):
                self.api.mutate(VM, namespace, name, lambda o: o["metadata"].__setitem__(
                    "finalizers", [f for f in o["metadata"]["finalizers"] if f != VM_FINALIZER]))
                return
            self._update_vm_status(namespace, name, vmi, strategy)
            return
        if VM_FINALIZER not in (meta.get("finalizers") or ()):
            vm = self.api.mutate(VM, namespace, name, lambda o: o["metadata"].setdefault(
                "finalizers", []).append(VM_FINALIZER)) or vm
        requests = list((vm.get("status") or {}).get("stateChangeRequests") or ())
        if requests:
            vmi = self._handle_state_change_requests(vm, vmi, requests)
        else:
            vmi = self._apply_run_strategy(vm, vmi, strategy)
        self._update_vm_status(namespace, name, vmi, strategy)

    def _handle_state_change_requests(self, vm: dict[str, Any], vmi: dict[str, Any] | None,
                                      requests: list[dict[str, Any]]) -> dict[str, Any] | None:
        namespace, name = vm["metadata"]["namespace"], vm["metadata"]["name"]
        request = requests[0]
        done = False
        if request.get("action") == "Stop":
            if vmi is None or (request.get("uid") and request["uid"] != vmi["metadata"]["uid"]):
                done = True
            elif not vmi["metadata"].get("deletionTimestamp"):
                self._stop_vmi(vm, vmi)
        elif request.get("action") == "Start":
            if vmi is None:
                vmi = self._create_vmi(vm)
                done = True
            elif vmi["status"].get("phase") in FINAL_PHASES and not vmi["metadata"].get("deletionTimestamp"):
                self._stop_vmi(vm, vmi)
            elif vmi["status"].get("phase") not in FINAL_PHASES and not vmi["metadata"].get("deletionTimestamp"):
                done = True
        else:
            done = True
        if done:
            def pop_request(o: dict[str, Any]) -> None:
                remaining = (o.get("status") or {}).get("stateChangeRequests", [])[1:]
                if remaining:
                    o["status"]["stateChangeRequests"] = remaining
                else:
                    o.get("status", {}).pop("stateChangeRequests", None)
            self.api.mutate(VM, namespace, name, pop_request)
        return vmi

    def _apply_run_strategy(self, vm: dict[str, Any], vmi: dict[str, Any] | None,
                            strategy: str) -> dict[str, Any] | None:
        status = vm.get("status") or {}
        if strategy == "Halted":
            if vmi is not None and not vmi["metadata"].get("deletionTimestamp"):
                self._stop_vmi(vm, vmi)
            return vmi
        if strategy in ("Always", "RerunOnFailure"):
            if vmi is None:
                retry_at = (status.get("startFailure") or {}).get("retryAfterTimestamp")
                if retry_at and _parse_time(retry_at) > time.time():
                    self.enqueue_later(_parse_time(retry_at) - time.time(), "vm", vm["metadata"]["namespace"],
                                       vm["metadata"]["name"])
                    return None
                return self._create_vmi(vm)
            phase = (vmi.get("status") or {}).get("phase")
            if phase in FINAL_PHASES and not vmi["metadata"].get("deletionTimestamp"):
                if strategy == "RerunOnFailure" and phase == "Succeeded":
                    return vmi
                self._note_start_failure(vm, vmi)
                current = self.store.get("virtualmachines", vm["metadata"]["namespace"], vm["metadata"]["name"])
                retry_at = ((current or {}).get("status", {}).get("startFailure") or {}).get("retryAfterTimestamp")
                if retry_at and _parse_time(retry_at) > time.time():
                    self.enqueue_later(_parse_time(retry_at) - time.time() + 0.01, "vm",
                                       vm["metadata"]["namespace"], vm["metadata"]["name"])
                    return vmi
                self._stop_vmi(vm, vmi)
            return vmi
        if strategy == "Once":
            # The finished VMI stays and blocks a second run; only a VMI that is gone is created again.
            return self._create_vmi(vm) if vmi is None else vmi
        return vmi  # Manual: only start/stop requests act

    def _note_start_failure(self, vm: dict[str, Any], vmi: dict[str, Any]) -> None:
        """A VMI that failed before ever running counts towards CrashLoopBackOff, as in vm.go."""
        status = vmi.get("status") or {}
        reached_running = any(s.get("phase") == "Running" for s in status.get("phaseTransitionTimestamps") or ())
        failure = (vm.get("status") or {}).get("startFailure") or {}
        if failure.get("lastFailedVMIUID") == vmi["metadata"]["uid"]:
            return
        if reached_running or status.get("phase") != "Failed":
            if failure:
                self.api.mutate(VM, vm["metadata"]["namespace"], vm["metadata"]["name"],
                                lambda o: o["status"].pop("startFailure", None))
            return
        count = int(failure.get("consecutiveFailCount", 0)) + 1
        backoff = min(300.0, self.config.restart_backoff * (2 ** (count - 1)))
        retry = datetime.fromtimestamp(time.time() + backoff, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def note(o: dict[str, Any]) -> None:
            o.setdefault("status", {})["startFailure"] = {
                "consecutiveFailCount": count, "lastFailedVMIUID": vmi["metadata"]["uid"],
                "retryAfterTimestamp": retry}
        self.api.mutate(VM, vm["metadata"]["namespace"], vm["metadata"]["name"], note)

    def _create_vmi(self, vm: dict[str, Any]) -> dict[str, Any] | None:
        meta = vm["metadata"]
        template = (vm.get("spec") or {}).get("template") or {}
        template_meta = template.get("metadata") or {}
        annotations = dict(template_meta.get("annotations") or {})
        annotations["kubevirt.io/vm-generation"] = str(meta.get("generation", 1))
        body = {
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "labels": dict(template_meta.get("labels") or {}), "annotations": annotations,
                         "ownerReferences": [_owner_reference(vm)],
                         "finalizers": [VM_FINALIZER]},
            "spec": template.get("spec") or {},
        }
        try:
            vmi = self.api.create(VMI, meta["namespace"], body, internal=True)[0]
        except Exception as exc:
            self.record(vm, "Warning", "FailedCreate", f"Error creating virtual machine instance: {exc}",
                        "virtualmachine-controller")
            return None
        self.record(vm, "Normal", "SuccessfulCreate",
                    f"Started the virtual machine by creating the new virtual machine instance {meta['name']}",
                    "virtualmachine-controller")
        return vmi

    def _stop_vmi(self, vm: dict[str, Any], vmi: dict[str, Any]) -> None:
        self.api.delete(VMI, vmi["metadata"]["namespace"], vmi["metadata"]["name"], internal=True)
        self.record(vm, "Normal", "SuccessfulDelete",
                    f"Stopped the virtual machine by deleting the virtual machine instance "
                    f"{vmi['metadata']['uid']}", "virtualmachine-controller")

    def _update_vm_status(self, namespace: str, name: str, vmi: dict[str, Any] | None, strategy: str) -> None:
        vm = self.store.get("virtualmachines", namespace, name)
        if vm is None:
            return
        vmi = self.store.get("virtualmachineinstances", namespace, name) if vmi is not None else None
        if vmi is not None and not any(ref.get("uid") == vm["metadata"]["uid"]
                                       for ref in vmi["metadata"].get("ownerReferences") or ()):
            vmi = None
        vmi_status = (vmi or {}).get("status") or {}
        phase = vmi_status.get("phase", "")
        ready = _get_condition(vmi, "Ready")
        should_run = strategy in ("Always", "RerunOnFailure") or bool(
            (vm.get("status") or {}).get("stateChangeRequests"))
        printable = self._printable_status(vm, vmi, strategy, should_run)

        def write(o: dict[str, Any]) -> None:
            status = o.setdefault("status", {})
            status["created"] = vmi is not None
            status["ready"] = bool(ready and ready.get("status") == "True" and phase == "Running")
            if not status["created"]:
                status.pop("created")
            if not status["ready"]:
                status.pop("ready")
            status["printableStatus"] = printable
            status["runStrategy"] = strategy
            status["observedGeneration"] = o["metadata"].get("generation", 1)
            status["desiredGeneration"] = o["metadata"].get("generation", 1)
            conditions = []
            old = {c.get("type"): c for c in status.get("conditions") or ()}
            if vmi is None:
                conditions.append(_condition("Ready", "False", "VMINotExists", "VMI does not exist"))
            elif ready is None:
                conditions.append(_condition("Ready", "False", "VMIConditionMissing",
                                             "VMI is missing the Ready condition"))
            else:
                conditions.append(dict(ready))
            for condition in vmi_status.get("conditions") or ():
                if condition.get("type") != "Ready":
                    conditions.append(dict(condition))
            for condition in conditions:
                previous = old.get(condition["type"])
                if previous and (previous.get("status"), previous.get("reason"), previous.get("message")) == (
                        condition.get("status"), condition.get("reason"), condition.get("message")):
                    condition["lastTransitionTime"] = previous.get("lastTransitionTime")
                    condition["lastProbeTime"] = previous.get("lastProbeTime")
            status["conditions"] = conditions
            if vmi is not None:
                status.setdefault("volumeSnapshotStatuses", [
                    {"name": v.get("name"), "enabled": False,
                     "reason": f"Snapshot is not supported for this volumeSource type [{v.get('name')}]"}
                    for v in (vmi.get("spec") or {}).get("volumes") or ()])
        self.api.mutate(VM, namespace, name, write)

    @staticmethod
    def _printable_status(vm: dict[str, Any], vmi: dict[str, Any] | None, strategy: str,
                          should_run: bool) -> str:
        """setPrintableStatus's precedence (reference §1), for the states kubesim produces."""
        if vm["metadata"].get("deletionTimestamp"):
            return "Terminating"
        status = (vmi or {}).get("status") or {}
        phase = status.get("phase", "")
        final = phase in FINAL_PHASES
        if vmi is not None and not final and (vmi["metadata"].get("deletionTimestamp") or strategy == "Halted"):
            return "Stopping"
        if vmi is not None and phase == "Running":
            return "Running"
        scheduled = _get_condition(vmi, "PodScheduled")
        if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            return "ErrorUnschedulable"
        synchronized = _get_condition(vmi, "Synchronized")
        if synchronized and synchronized.get("status") == "False" and synchronized.get("reason") in (
                "ErrImagePull", "ImagePullBackOff"):
            return synchronized["reason"]
        if (vmi is None and should_run) or (vmi is not None and phase in ("", "Pending", "Scheduling",
                                                                           "Scheduled")):
            return "Starting"
        failures = ((vm.get("status") or {}).get("startFailure") or {}).get("consecutiveFailCount", 0)
        if (vmi is None or final) and failures and strategy in ("Always", "RerunOnFailure", "Once"):
            return "CrashLoopBackOff"
        if final or vmi is None:
            return "Stopped"
        return "Unknown"

    # ---- VirtualMachineInstance ----------------------------------------------------------------------------
    def _mutate_new_vmi(self, vmi: dict[str, Any]) -> None:
        """The VMI mutating webhook: Pending, first phase timestamp, finalizer, a few defaults."""
        meta = vmi["metadata"]
        finalizers = meta.setdefault("finalizers", [])
        if VMI_FINALIZER not in finalizers:
            finalizers.append(VMI_FINALIZER)
        labels = meta.setdefault("labels", {})
        labels.pop("kubevirt.io/nodeName", None)
        annotations = meta.setdefault("annotations", {})
        annotations.setdefault("kubevirt.io/latest-observed-api-version", "v1")
        annotations.setdefault("kubevirt.io/storage-observed-api-version", "v1")
        spec = vmi.setdefault("spec", {})
        domain = spec.setdefault("domain", {})
        domain.setdefault("firmware", {}).setdefault("uuid", str(uuid.uuid4()))
        domain.setdefault("machine", {"type": "q35"})
        domain.setdefault("cpu", {"cores": 1, "sockets": 1, "threads": 1, "model": "host-model"})
        vmi["status"] = {"guestOSInfo": {}, "qosClass": "Burstable"}
        _set_phase(vmi, "Pending")

    def _runtime(self, vmi: dict[str, Any]) -> VmiRuntime:
        meta = vmi["metadata"]
        runtime = self.runtimes.get(meta["uid"])
        if runtime is None:
            runtime = VmiRuntime(meta["uid"], meta["namespace"], meta["name"],
                                 next_at=self.loop.time() + self._delay(self.config.pending_delay))
            self.runtimes[meta["uid"]] = runtime
            self._runtime_uids[(meta["namespace"], meta["name"])] = meta["uid"]
        return runtime

    def _pod_for(self, runtime: VmiRuntime) -> dict[str, Any] | None:
        if runtime.pod_name is None:
            return None
        return self.store.get("pods", runtime.namespace, runtime.pod_name)

    def _wait(self, runtime: VmiRuntime, until: float) -> bool:
        delay = until - self.loop.time()
        if delay > 0:
            self.enqueue_later(delay, "vmi", runtime.namespace, runtime.name)
            return True
        return False

    def reconcile_vmi(self, namespace: str, name: str) -> None:
        vmi = self.store.get("virtualmachineinstances", namespace, name)
        known = self._runtime_uids.get((namespace, name))
        if known is not None and (vmi is None or vmi["metadata"]["uid"] != known):
            self._forget(known)  # the VMI went, or was replaced by a new one of the same name
        if vmi is None:
            return
        runtime = self._runtime(vmi)
        phase = (vmi.get("status") or {}).get("phase", "")
        if vmi["metadata"].get("deletionTimestamp"):
            self._terminate_vmi(vmi, runtime)
            return
        if phase in FINAL_PHASES:
            self._after_final(vmi, runtime)
            return
        if phase in ("", "Pending"):
            if self._wait(runtime, runtime.next_at):
                return
            self._schedule_vmi(vmi, runtime)
        elif phase == "Scheduling":
            if self._wait(runtime, runtime.next_at):
                return
            self._start_launcher(vmi, runtime)
        elif phase == "Scheduled":
            if self._wait(runtime, runtime.next_at):
                return
            self._boot(vmi, runtime)
        elif phase == "Running":
            pod = self._pod_for(runtime)
            if pod is None:
                self.fail_vmi(namespace, name, reason="PodTerminating",
                              message="virt-launcher pod was deleted")
                return
            if runtime.agent_at is not None and _get_condition(vmi, "AgentConnected") is None:
                if self._wait(runtime, runtime.agent_at):
                    return
                self._connect_agent(vmi, runtime)

    def _forget(self, uid: str) -> None:
        runtime = self.runtimes.pop(uid, None)
        if runtime is not None:
            self._unschedulable.discard((runtime.namespace, runtime.name))
            if self._runtime_uids.get((runtime.namespace, runtime.name)) == uid:
                del self._runtime_uids[(runtime.namespace, runtime.name)]
        self.guests.stop(uid)

    def _requeue_unschedulable(self) -> None:
        for namespace, name in list(self._unschedulable):
            self.enqueue("vmi", namespace, name)

    def _quota_denial(self, namespace: str, cpu: Decimal, memory: Decimal) -> str | None:
        """The admission error a ResourceQuota gives a pod that would exceed it, or None."""
        for quota in self.store.objects("resourcequotas", namespace):
            hard = (quota.get("spec") or {}).get("hard") or {}
            used = self._quota_usage(namespace)
            asked = {"pods": Decimal(1), "count/pods": Decimal(1), "requests.cpu": cpu, "cpu": cpu,
                     "requests.memory": memory, "memory": memory}
            exceeded = []
            for resource, limit in hard.items():
                if resource in asked and used.get(resource, Decimal(0)) + asked[resource] > parse_quantity(limit):
                    exceeded.append(resource)
            if exceeded:
                exceeded.sort()
                requested = ",".join(f"{r}={_fmt(r, asked[r])}" for r in exceeded)
                used_text = ",".join(f"{r}={_fmt(r, used.get(r, Decimal(0)))}" for r in exceeded)
                limited = ",".join(f"{r}={hard[r]}" for r in exceeded)
                return (f"exceeded quota: {quota['metadata']['name']}, requested: {requested}, used: {used_text}, "
                        f"limited: {limited}")
        return None

    def _quota_usage(self, namespace: str) -> dict[str, Decimal]:
        used = {"pods": Decimal(0), "requests.cpu": Decimal(0), "requests.memory": Decimal(0)}
        for pod in self.store.objects("pods", namespace):
            if (pod.get("status") or {}).get("phase") in FINAL_PHASES:
                continue
            used["pods"] += 1
            for container in pod["spec"].get("containers", []):
                requests = (container.get("resources") or {}).get("requests") or {}
                used["requests.cpu"] += parse_quantity(requests.get("cpu", "0"))
                used["requests.memory"] += parse_quantity(requests.get("memory", "0"))
        used["count/pods"], used["cpu"], used["memory"] = used["pods"], used["requests.cpu"], used["requests.memory"]
        return used

    def reconcile_quotas(self, namespace: str) -> None:
        quotas = list(self.store.objects("resourcequotas", namespace))
        if not quotas:
            return
        used = self._quota_usage(namespace)
        for quota in quotas:
            hard = (quota.get("spec") or {}).get("hard") or {}

            def write(o: dict[str, Any], hard: dict[str, Any] = hard) -> None:
                o["status"] = {"hard": dict(hard),
                               "used": {r: _fmt(r, used[r]) if r in used else "0" for r in hard}}
            self.api.mutate(QUOTA, namespace, quota["metadata"]["name"], write)

    def _schedule_vmi(self, vmi: dict[str, Any], runtime: VmiRuntime) -> None:
        namespace, name = runtime.namespace, runtime.name
        pod = self._pod_for(runtime)
        spec = vmi.get("spec") or {}
        kubevirt = self.kubevirt()
        cpu, memory = launcher_requests(
            spec, developer=developer_configuration(kubevirt), fixed_overhead=self.config.launcher_fixed_overhead,
            overhead_ratio=(((kubevirt or {}).get("spec") or {}).get("configuration") or {}).get(
                "additionalGuestMemoryOverheadRatio"))
        if pod is None:
            denial = self._quota_denial(namespace, cpu, memory)
            if denial:
                message = f'pods "virt-launcher-{name}-" is forbidden: {denial}'
                self.record(vmi, "Warning", "FailedCreate", f"Error creating pod: {message}",
                            "virtualmachineinstance-controller")

                def not_synced(o: dict[str, Any]) -> None:
                    _set_condition(o, _condition("Synchronized", "False", "FailedCreate", message))
                self.api.mutate(VMI, namespace, name, not_synced)
                self._unschedulable.add((namespace, name))
                return
            version = ((kubevirt or {}).get("status") or {}).get("observedKubeVirtVersion", "v1.9.0")
            body = render_pod(vmi, cpu=cpu, memory=memory, kubevirt_version=version, rng=self.rng)
            pod = self.api.create(POD, namespace, body, internal=True)[0]
            runtime.pod_name = pod["metadata"]["name"]
            self.record(vmi, "Normal", "SuccessfulCreate", f"Created virtual machine pod {runtime.pod_name}",
                        "virtualmachineinstance-controller")
        if pod["spec"].get("nodeName"):
            return
        node, why = self.scheduler.pick(cpu, memory)
        if node is None:
            self._unschedulable.add((namespace, name))
            self.record(pod, "Warning", "FailedScheduling", why, "default-scheduler")

            def unschedulable(o: dict[str, Any]) -> None:
                _set_condition(o, _condition("PodScheduled", "False", "Unschedulable", why))
            self.api.mutate(POD, namespace, pod["metadata"]["name"], unschedulable)

            def vmi_unschedulable(o: dict[str, Any]) -> None:
                _set_condition(o, _condition("PodScheduled", "False", "Unschedulable", why))
                _drop_condition(o, "Synchronized")
                _set_condition(o, _condition("Ready", "False", "GuestNotRunning", "Guest VM is not reported as "
                                             "running"))
            self.api.mutate(VMI, namespace, name, vmi_unschedulable)
            return
        self._unschedulable.discard((namespace, name))
        ip = self.scheduler.bind(pod["metadata"]["uid"], node, cpu, memory)
        runtime.node, runtime.ip = node, ip
        host_ip = self.store.get("nodes", "", node)["status"]["addresses"][0]["address"]

        def bound(o: dict[str, Any]) -> None:
            o["spec"]["nodeName"] = node
            o["status"].update({"hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": ip,
                                "podIPs": [{"ip": ip}], "startTime": now_rfc3339()})
            _set_condition(o, _condition("PodScheduled", "True"))
            _set_condition(o, _condition("Initialized", "True"))
            _set_condition(o, _condition("Ready", "False", "ContainersNotReady",
                                         "containers with unready status: [compute]"))
        self.api.mutate(POD, namespace, pod["metadata"]["name"], bound)
        self.record(pod, "Normal", "Scheduled", f"Successfully assigned {namespace}/{pod['metadata']['name']} "
                                                f"to {node}", "default-scheduler")

        def scheduling(o: dict[str, Any]) -> None:
            _drop_condition(o, "PodScheduled")
            _drop_condition(o, "Synchronized")
            _set_condition(o, _condition("Ready", "False", "GuestNotRunning",
                                         "Guest VM is not reported as running"))
            _set_phase(o, "Scheduling")
            o["status"]["activePods"] = {pod["metadata"]["uid"]: node}
        self.api.mutate(VMI, namespace, name, scheduling)
        runtime.next_at = self.loop.time() + self._delay(self.config.scheduling_delay)
        self._wait(runtime, runtime.next_at)

    def _container_disk_images(self, vmi: dict[str, Any]) -> list[str]:
        return [v["containerDisk"].get("image", "") for v in (vmi.get("spec") or {}).get("volumes") or ()
                if v.get("containerDisk")]

    def _missing_secrets(self, vmi: dict[str, Any]) -> list[tuple[str, str]]:
        """(volume, secret) pairs of cloud-init volumes whose Secret does not exist (yet)."""
        missing = []
        for volume in (vmi.get("spec") or {}).get("volumes") or ():
            for source_key in ("cloudInitNoCloud", "cloudInitConfigDrive"):
                source = volume.get(source_key) or {}
                for ref_key in ("secretRef", "networkDataSecretRef"):
                    secret = (source.get(ref_key) or {}).get("name")
                    if secret and self.store.get("secrets", vmi["metadata"]["namespace"], secret) is None:
                        missing.append((volume.get("name", ""), secret))
        return missing

    def _start_launcher(self, vmi: dict[str, Any], runtime: VmiRuntime) -> None:
        """kubelet: pull images and start the virt-launcher containers, or fail the way a real node fails."""
        namespace, name = runtime.namespace, runtime.name
        pod = self._pod_for(runtime)
        if pod is None:
            self.fail_vmi(namespace, name, reason="PodTerminating", message="virt-launcher pod was deleted")
            return
        node = runtime.node or ""
        images = self._container_disk_images(vmi)
        bad = [image for image in images if self.config.bad_image(image)]
        if bad:
            if not runtime.image_error_reported:
                runtime.image_error_reported = True
                image = bad[0]
                message = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                           f'failed to resolve reference "{image}": {image}: not found')
                self.record(pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet", node)
                self.record(pod, "Warning", "Failed", f'Failed to pull image "{image}": {message}', "kubelet", node)
                self.record(pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet", node)
                container = next((c["name"] for c in pod["spec"]["containers"] if c.get("image") == image),
                                 "compute")

                def waiting(o: dict[str, Any]) -> None:
                    o["status"]["containerStatuses"] = [
                        {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                         "started": False, "state": {"waiting": {"reason": "ErrImagePull", "message": message}
                                                     if c["name"] == container else
                                                     {"reason": "PodInitializing"}}}
                        for c in o["spec"]["containers"]]
                self.api.mutate(POD, namespace, pod["metadata"]["name"], waiting)

                def vmi_waiting(o: dict[str, Any]) -> None:
                    _set_condition(o, _condition("Synchronized", "False", "ErrImagePull",
                                                 f'failed to pull image "{image}": {message}'))
                self.api.mutate(VMI, namespace, name, vmi_waiting)
                self.record(vmi, "Warning", "ErrImagePull", f'Failed to pull image "{image}"',
                            "virtualmachineinstance-controller")
            return
        missing = self._missing_secrets(vmi)
        if missing:
            # kubelet cannot mount the cloud-init Secret: the pod waits (ContainerCreating) and retries.
            self.record(pod, "Warning", "FailedMount", f'MountVolume.SetUp failed for volume "{missing[0][0]}" : '
                                                       f'secret "{missing[0][1]}" not found', "kubelet", node)
            self.enqueue_later(1.0, "vmi", namespace, name)
            return
        if not runtime.pulled:
            runtime.pulled = True
            for container in pod["spec"]["containers"]:
                self.record(pod, "Normal", "Pulled", f'Container image "{container["image"]}" already present on '
                                                     "machine", "kubelet", node)
        if images and gate_enabled(self.kubevirt(), "ImageVolume") and not self.config.image_volume_supported:
            self._fail_launcher_start(vmi, runtime, pod)
            return
        for container in pod["spec"]["containers"]:
            self.record(pod, "Normal", "Created", f"Created container: {container['name']}", "kubelet", node)
            self.record(pod, "Normal", "Started", f"Started container {container['name']}", "kubelet", node)

        def running(o: dict[str, Any]) -> None:
            o["status"]["phase"] = "Running"
            o["status"]["containerStatuses"] = [
                {"name": c["name"], "image": c["image"], "imageID": c["image"], "ready": True, "restartCount": 0,
                 "started": True, "containerID": f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}",
                 "state": {"running": {"startedAt": now_rfc3339()}}} for c in o["spec"]["containers"]]
            _set_condition(o, _condition("ContainersReady", "True"))
            _set_condition(o, _condition("kubevirt.io/virtual-machine-unpaused", "True"))
            _set_condition(o, _condition("Ready", "True"))
        self.api.mutate(POD, namespace, pod["metadata"]["name"], running)

        def scheduled(o: dict[str, Any]) -> None:
            _set_phase(o, "Scheduled")
            o["status"]["nodeName"] = node
            o["metadata"].setdefault("labels", {})["kubevirt.io/nodeName"] = node
            o["status"]["launcherContainerImageVersion"] = pod["spec"]["containers"][0]["image"]
        self.api.mutate(VMI, namespace, name, scheduled)
        runtime.next_at = self.loop.time() + self._delay(self.config.scheduled_delay)
        self._wait(runtime, runtime.next_at)

    def _fail_launcher_start(self, vmi: dict[str, Any], runtime: VmiRuntime, pod: dict[str, Any]) -> None:
        """ImageVolume on a runtime without image volumes: the volume mounts empty and the container cannot start."""
        namespace, name, node = runtime.namespace, runtime.name, runtime.node or ""
        container = next((c["name"] for c in pod["spec"]["containers"] if c["name"] != "compute"), "compute")
        self.record(pod, "Normal", "Created", f"Created container: {container}", "kubelet", node)
        self.record(pod, "Warning", "Failed", f"Error: {CONTAINER_DISK_ERROR}", "kubelet", node)

        def failed(o: dict[str, Any]) -> None:
            o["status"]["phase"] = "Failed"
            o["status"]["containerStatuses"] = [
                {"name": c["name"], "image": c["image"], "imageID": c["image"], "ready": False, "restartCount": 0,
                 "started": False, "state": {"terminated": {"exitCode": 128, "reason": "StartError",
                                                            "message": CONTAINER_DISK_ERROR}}
                 if c["name"] == container else {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                for c in o["spec"]["containers"]]
            _set_condition(o, _condition("Ready", "False", "PodFailed"))
        self.api.mutate(POD, namespace, pod["metadata"]["name"], failed)
        self.scheduler.release(pod["metadata"]["uid"])
        self._requeue_unschedulable()
        self.fail_vmi(namespace, name, reason="PodFailed", message=CONTAINER_DISK_ERROR, record_pod=False)

    def _boot(self, vmi: dict[str, Any], runtime: VmiRuntime) -> None:
        """virt-handler: define and start the domain, then the guest."""
        namespace, name = runtime.namespace, runtime.name
        node = runtime.node or ""
        self.record(vmi, "Normal", "Created", "VirtualMachineInstance defined.", "virt-handler", node)
        mac = "02:" + ":".join(f"{self.rng.randrange(256):02x}" for _ in range(5))
        interfaces = (vmi.get("spec") or {}).get("domain", {}).get("devices", {}).get("interfaces") or []
        networks = [{"name": i.get("name", "default")} for i in interfaces] or [{"name": "default"}]

        def running(o: dict[str, Any]) -> None:
            _set_phase(o, "Running")
            status = o["status"]
            status["interfaces"] = [{"ipAddress": runtime.ip, "ipAddresses": [runtime.ip], "mac": mac,
                                     "name": networks[0]["name"], "interfaceName": "eth0",
                                     "podInterfaceName": "eth0", "infoSource": "domain", "queueCount": 1,
                                     "linkState": "up"}]
            status["migrationMethod"] = "BlockMigration"
            status["migrationTransport"] = "Unix"
            status["machine"] = {"type": "pc-q35-rhel9.6.0"}
            status["currentCPUTopology"] = {k: v for k, v in (o["spec"]["domain"].get("cpu") or {}).items()
                                            if k in ("cores", "sockets", "threads")}
            status["volumeStatus"] = [{"name": v["name"], "target": f"vd{chr(97 + i)}"}
                                      for i, v in enumerate(o["spec"].get("volumes") or ())]
            status["selinuxContext"] = "none"
            status["runtimeUser"] = 107
            _set_condition(o, _condition("Ready", "True"))
            _set_condition(o, _condition("LiveMigratable", "False", "DisksNotLiveMigratable",
                                         "cannot migrate VMI: PVC is not shared, live migration requires that "
                                         "all PVCs must be shared (using ReadWriteMany access mode)"))
            _set_condition(o, _condition("StorageLiveMigratable", "True"))
        self.api.mutate(VMI, namespace, name, running)
        self.record(vmi, "Normal", "Started", "VirtualMachineInstance started.", "virt-handler", node)
        self.counters.vmis_started += 1
        current = self.store.get("virtualmachineinstances", namespace, name)
        if current is not None:
            self.guests.start(current)
        runtime.agent_at = self.loop.time() + self._delay(self.config.agent_delay)
        self._wait(runtime, runtime.agent_at)

    def _connect_agent(self, vmi: dict[str, Any], runtime: VmiRuntime) -> None:
        images = " ".join(self._container_disk_images(vmi)).lower()
        os_info = next((info for key, info in GUEST_OS.items() if key in images), GUEST_OS["fedora"])
        hostname = (vmi.get("spec") or {}).get("hostname") or runtime.name

        def connected(o: dict[str, Any]) -> None:
            _set_condition(o, _condition("AgentConnected", "True"))
            o["status"]["guestOSInfo"] = {**os_info, "kernelVersion": "#1 SMP PREEMPT_DYNAMIC", "machine": "x86_64"}
            for interface in o["status"].get("interfaces") or ():
                interface["infoSource"] = "domain, guest-agent"
            o["status"]["currentCPUTopology"] = o["status"].get("currentCPUTopology", {})
            o["status"].setdefault("guestHostname", hostname)
        self.api.mutate(VMI, runtime.namespace, runtime.name, connected)

    def _terminate_vmi(self, vmi: dict[str, Any], runtime: VmiRuntime) -> None:
        namespace, name = runtime.namespace, runtime.name
        phase = (vmi.get("status") or {}).get("phase", "")
        if runtime.stop_at is None:
            grace = vmi["metadata"].get("deletionGracePeriodSeconds")
            running = phase == "Running"
            delay = self._delay(self.config.stop_delay) if running and grace != 0 else 0.0
            runtime.stop_at = self.loop.time() + delay
            if running:
                self.record(vmi, "Normal", "ShuttingDown", "Signaled Graceful Shutdown", "virt-handler",
                            runtime.node)
        if self._wait(runtime, runtime.stop_at):
            return
        self.guests.stop(runtime.uid)
        pod = self._pod_for(runtime)
        if pod is not None:
            self.api.remove(POD, namespace, pod["metadata"]["name"])
            self.record(vmi, "Normal", "SuccessfulDelete", f"Deleted virtual machine pod {pod['metadata']['name']}",
                        "virtualmachineinstance-controller")

        def stopped(o: dict[str, Any]) -> None:
            if o["status"].get("phase") not in FINAL_PHASES:
                _set_phase(o, "Succeeded" if o["status"].get("phase") == "Running" else "Failed")
            _set_condition(o, _condition("Ready", "False", "PodTerminating", "virt-launcher pod is terminating"))
            _drop_condition(o, "AgentConnected")
            o["metadata"]["finalizers"] = []
            o["metadata"]["deletionGracePeriodSeconds"] = 0
        if phase == "Running":
            self.record(vmi, "Normal", "Deleted", "Signaled Deletion", "virt-handler", runtime.node)
        self.api.mutate(VMI, namespace, name, stopped)

    def _after_final(self, vmi: dict[str, Any], runtime: VmiRuntime) -> None:
        self.guests.stop(runtime.uid)
        pod = self._pod_for(runtime)
        if pod is not None and (pod.get("status") or {}).get("phase") not in FINAL_PHASES:
            def pod_failed(o: dict[str, Any]) -> None:
                o["status"]["phase"] = "Failed"
                _set_condition(o, _condition("Ready", "False", "PodFailed"))
            self.api.mutate(POD, runtime.namespace, pod["metadata"]["name"], pod_failed)
            if self.scheduler.release(pod["metadata"]["uid"]):
                self._requeue_unschedulable()

    def fail_vmi(self, namespace: str, name: str, *, reason: str, message: str = "",
                 record_pod: bool = True) -> dict[str, Any] | None:
        """Move a VMI to Failed (crash, lost node, admin fault); its guest goes and its pod ends."""
        vmi = self.store.get("virtualmachineinstances", namespace, name)
        if vmi is None:
            return None

        def failed(o: dict[str, Any]) -> None:
            _set_phase(o, "Failed")
            o["status"]["reason"] = reason
            _set_condition(o, _condition("Ready", "False", "GuestNotRunning", "Guest VM is not reported as running"))
            _drop_condition(o, "AgentConnected")
            if message:
                _set_condition(o, _condition("Synchronized", "False", reason, message))
        updated = self.api.mutate(VMI, namespace, name, failed)
        self.record(vmi, "Warning", reason, message or f"VirtualMachineInstance failed: {reason}",
                    "virt-handler" if reason != "PodFailed" else "virtualmachineinstance-controller",
                    self.runtimes.get(vmi["metadata"]["uid"], VmiRuntime("", "", "")).node)
        runtime = self.runtimes.get(vmi["metadata"]["uid"])
        if runtime is not None:
            self._after_final(updated or vmi, runtime)
        return updated

    def reconcile_pod(self, namespace: str, name: str) -> None:
        """kubelet: a pod being deleted has its containers killed and goes; its VMI notices."""
        pod = self.store.get("pods", namespace, name)
        if pod is not None and pod["metadata"].get("deletionTimestamp"):
            self.api.remove(POD, namespace, name)

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
            self.fail_vmi(runtime.namespace, runtime.name, reason="NodeUnresponsive",
                          message="virt-handler on node " + name + " is not responsive")
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


def _fmt(resource: str, value: Decimal) -> str:
    from kubesim.quantity import format_cpu, format_memory
    if "memory" in resource:
        return format_memory(value)
    if "cpu" in resource:
        return format_cpu(value)
    return str(int(value))


def _parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
