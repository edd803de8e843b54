"""virt-controller's VirtualMachine controller: run strategies, state-change requests, start failures and the
VM status (created, ready, printableStatus, conditions) mirrored from the VMI."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from kubesim.apiserver import VM_FINALIZER
from kubesim.controllers.objects import (
    FINAL_PHASES,
    VM,
    VMI,
    get_condition,
    new_condition,
    owner_reference,
    parse_time,
    run_strategy,
)


class VirtualMachineController:
    """Mixed into ``Cluster``, which provides the store, the API, the queue and the event recorder."""

    def reconcile_vm(self, namespace: str, name: str) -> None:
        vm = self.store.get("virtualmachines", namespace, name)
        if vm is None:
            return
        vmi = self.store.get("virtualmachineinstances", namespace, name)
        if vmi is not None and not any(
            ref.get("uid") == vm["metadata"]["uid"] for ref in vmi["metadata"].get("ownerReferences") or ()
        ):
            vmi = None  # a VMI of the same name that this VM does not own
        meta = vm["metadata"]
        strategy = run_strategy(vm)
        if meta.get("deletionTimestamp"):
            if vmi is not None and not vmi["metadata"].get("deletionTimestamp"):
                self._stop_vmi(vm, vmi)
            elif vmi is None and VM_FINALIZER in (meta.get("finalizers") or ()):
                self.api.mutate(
                    VM,
                    namespace,
                    name,
                    lambda o: o["metadata"].__setitem__(
                        "finalizers", [f for f in o["metadata"]["finalizers"] if f != VM_FINALIZER]
                    ),
                )
                return
            self._update_vm_status(namespace, name, vmi, strategy)
            return
        if VM_FINALIZER not in (meta.get("finalizers") or ()):
            vm = (
                self.api.mutate(
                    VM, namespace, name, lambda o: o["metadata"].setdefault("finalizers", []).append(VM_FINALIZER)
                )
                or vm
            )
        requests = list((vm.get("status") or {}).get("stateChangeRequests") or ())
        if requests:
            vmi = self._handle_state_change_requests(vm, vmi, requests)
        else:
            vmi = self._apply_run_strategy(vm, vmi, strategy)
        self._update_vm_status(namespace, name, vmi, strategy)

    def _handle_state_change_requests(
        self, vm: dict[str, Any], vmi: dict[str, Any] | None, requests: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
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

    def _apply_run_strategy(
        self, vm: dict[str, Any], vmi: dict[str, Any] | None, strategy: str
    ) -> dict[str, Any] | None:
        status = vm.get("status") or {}
        if strategy == "Halted":
            if vmi is not None and not vmi["metadata"].get("deletionTimestamp"):
                self._stop_vmi(vm, vmi)
            return vmi
        if strategy in ("Always", "RerunOnFailure"):
            if vmi is None:
                retry_at = (status.get("startFailure") or {}).get("retryAfterTimestamp")
                if retry_at and parse_time(retry_at) > time.time():
                    self.enqueue_later(
                        parse_time(retry_at) - time.time(), "vm", vm["metadata"]["namespace"], vm["metadata"]["name"]
                    )
                    return None
                return self._create_vmi(vm)
            phase = (vmi.get("status") or {}).get("phase")
            if phase in FINAL_PHASES and not vmi["metadata"].get("deletionTimestamp"):
                if strategy == "RerunOnFailure" and phase == "Succeeded":
                    return vmi
                self._note_start_failure(vm, vmi)
                current = self.store.get("virtualmachines", vm["metadata"]["namespace"], vm["metadata"]["name"])
                retry_at = ((current or {}).get("status", {}).get("startFailure") or {}).get("retryAfterTimestamp")
                if retry_at and parse_time(retry_at) > time.time():
                    self.enqueue_later(
                        parse_time(retry_at) - time.time() + 0.01,
                        "vm",
                        vm["metadata"]["namespace"],
                        vm["metadata"]["name"],
                    )
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
                self.api.mutate(
                    VM,
                    vm["metadata"]["namespace"],
                    vm["metadata"]["name"],
                    lambda o: o["status"].pop("startFailure", None),
                )
            return
        count = int(failure.get("consecutiveFailCount", 0)) + 1
        backoff = min(300.0, self.config.restart_backoff * (2 ** (count - 1)))
        retry = datetime.fromtimestamp(time.time() + backoff, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def note(o: dict[str, Any]) -> None:
            o.setdefault("status", {})["startFailure"] = {
                "consecutiveFailCount": count,
                "lastFailedVMIUID": vmi["metadata"]["uid"],
                "retryAfterTimestamp": retry,
            }

        self.api.mutate(VM, vm["metadata"]["namespace"], vm["metadata"]["name"], note)

    def _create_vmi(self, vm: dict[str, Any]) -> dict[str, Any] | None:
        meta = vm["metadata"]
        template = (vm.get("spec") or {}).get("template") or {}
        template_meta = template.get("metadata") or {}
        annotations = dict(template_meta.get("annotations") or {})
        annotations["kubevirt.io/vm-generation"] = str(meta.get("generation", 1))
        body = {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": dict(template_meta.get("labels") or {}),
                "annotations": annotations,
                "ownerReferences": [owner_reference(vm)],
                "finalizers": [VM_FINALIZER],
            },
            "spec": template.get("spec") or {},
        }
        try:
            vmi = self.api.create(VMI, meta["namespace"], body, internal=True)[0]
        except Exception as exc:
            self.record(
                vm,
                "Warning",
                "FailedCreate",
                f"Error creating virtual machine instance: {exc}",
                "virtualmachine-controller",
            )
            return None
        self.record(
            vm,
            "Normal",
            "SuccessfulCreate",
            f"Started the virtual machine by creating the new virtual machine instance {meta['name']}",
            "virtualmachine-controller",
        )
        return vmi

    def _stop_vmi(self, vm: dict[str, Any], vmi: dict[str, Any]) -> None:
        self.api.delete(VMI, vmi["metadata"]["namespace"], vmi["metadata"]["name"], internal=True)
        self.record(
            vm,
            "Normal",
            "SuccessfulDelete",
            f"Stopped the virtual machine by deleting the virtual machine instance {vmi['metadata']['uid']}",
            "virtualmachine-controller",
        )

    def _update_vm_status(self, namespace: str, name: str, vmi: dict[str, Any] | None, strategy: str) -> None:
        vm = self.store.get("virtualmachines", namespace, name)
        if vm is None:
            return
        vmi = self.store.get("virtualmachineinstances", namespace, name) if vmi is not None else None
        if vmi is not None and not any(
            ref.get("uid") == vm["metadata"]["uid"] for ref in vmi["metadata"].get("ownerReferences") or ()
        ):
            vmi = None
        vmi_status = (vmi or {}).get("status") or {}
        phase = vmi_status.get("phase", "")
        ready = get_condition(vmi, "Ready")
        should_run = strategy in ("Always", "RerunOnFailure") or bool(
            (vm.get("status") or {}).get("stateChangeRequests")
        )
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
                conditions.append(new_condition("Ready", "False", "VMINotExists", "VMI does not exist"))
            elif ready is None:
                conditions.append(
                    new_condition("Ready", "False", "VMIConditionMissing", "VMI is missing the Ready condition")
                )
            else:
                conditions.append(dict(ready))
            for condition in vmi_status.get("conditions") or ():
                if condition.get("type") != "Ready":
                    conditions.append(dict(condition))
            for condition in conditions:
                previous = old.get(condition["type"])
                if previous and (previous.get("status"), previous.get("reason"), previous.get("message")) == (
                    condition.get("status"),
                    condition.get("reason"),
                    condition.get("message"),
                ):
                    condition["lastTransitionTime"] = previous.get("lastTransitionTime")
                    condition["lastProbeTime"] = previous.get("lastProbeTime")
            status["conditions"] = conditions
            if vmi is not None:
                status.setdefault(
                    "volumeSnapshotStatuses",
                    [
                        {
                            "name": v.get("name"),
                            "enabled": False,
                            "reason": f"Snapshot is not supported for this volumeSource type [{v.get('name')}]",
                        }
                        for v in (vmi.get("spec") or {}).get("volumes") or ()
                    ],
                )

        self.api.mutate(VM, namespace, name, write)

    @staticmethod
    def _printable_status(vm: dict[str, Any], vmi: dict[str, Any] | None, strategy: str, should_run: bool) -> str:
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
        scheduled = get_condition(vmi, "PodScheduled")
        if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            return "ErrorUnschedulable"
        synchronized = get_condition(vmi, "Synchronized")
        if (
            synchronized
            and synchronized.get("status") == "False"
            and synchronized.get("reason") in ("ErrImagePull", "ImagePullBackOff")
        ):
            return synchronized["reason"]
        if (vmi is None and should_run) or (vmi is not None and phase in ("", "Pending", "Scheduling", "Scheduled")):
            return "Starting"
        failures = ((vm.get("status") or {}).get("startFailure") or {}).get("consecutiveFailCount", 0)
        if (vmi is None or final) and failures and strategy in ("Always", "RerunOnFailure", "Once"):
            return "CrashLoopBackOff"
        if final or vmi is None:
            return "Stopped"
        return "Unknown"
