"""Node drains: a launcher pod's eviction as KubeVirt v1.9's eviction webhook decides it
(``pkg/virt-api/webhooks/validating-webhook/admitters/pod-eviction-admitter.go``), the guest's graceful shutdown
when the eviction is granted (virt-launcher's SIGTERM handling, ``cmd/virt-launcher/virt-launcher.go``), and a
drain as ``kubectl drain`` does one: cordon the node, then evict each of its pods. No live migration is simulated.
"""

from __future__ import annotations

from typing import Any

from kubesim.controllers.objects import (
    FINAL_PHASES,
    NODE,
    POD,
    VMI,
    VmiRuntime,
    drop_condition,
    get_condition,
    new_condition,
    set_condition,
    set_phase,
)
from kubesim.errors import ApiError
from kubesim.store import now_rfc3339

WEBHOOK = "virt-launcher-eviction-interceptor.kubevirt.io"
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def _eviction_strategy(vmi: dict[str, Any], kubevirt: dict[str, Any] | None) -> str | None:
    """The VMI's, else the cluster's (``migrations.VMIEvictionStrategy``); None when neither sets one."""
    configuration = ((kubevirt or {}).get("spec") or {}).get("configuration") or {}
    return (vmi.get("spec") or {}).get("evictionStrategy") or configuration.get("evictionStrategy")


class DrainController:
    """Mixed into ``Cluster``."""

    def evict_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The Eviction API (``POST pods/<name>/eviction``): the webhook's refusal as 429, else the pod deleted
        gracefully. Returns the API server's success Status."""
        pod = self.store.get("pods", namespace, name)
        if pod is None:
            raise ApiError(404, f'pods "{name}" not found', reason="NotFound")
        vmi_name = (pod["metadata"].get("annotations") or {}).get("kubevirt.io/domain")
        launcher = (pod["metadata"].get("labels") or {}).get("kubevirt.io") == "virt-launcher"
        if launcher and vmi_name and (pod.get("status") or {}).get("phase") not in FINAL_PHASES:
            denial = self._eviction_denial(namespace, vmi_name, pod)
            if denial:
                raise ApiError(429, f'admission webhook "{WEBHOOK}" denied the request: {denial}')
        if not pod["metadata"].get("deletionTimestamp"):

            def disrupted(o: dict[str, Any]) -> None:
                set_condition(
                    o,
                    new_condition("DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting"),
                )

            self.api.mutate(POD, namespace, name, disrupted)
            if launcher:
                self._evicting.add(pod["metadata"]["uid"])
            self.api.delete(POD, namespace, name, internal=True)
            if vmi_name:
                self.enqueue("vmi", namespace, vmi_name)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _eviction_denial(self, namespace: str, vmi_name: str, pod: dict[str, Any]) -> str:
        """What the webhook answers a launcher pod's eviction: "" to grant it."""
        vmi = self.store.get("virtualmachineinstances", namespace, vmi_name)
        if vmi is None:
            return f'kubevirt failed getting the vmi: virtualmachineinstances.kubevirt.io "{vmi_name}" not found'
        strategy = _eviction_strategy(vmi, self.kubevirt())
        migratable = (get_condition(vmi, "LiveMigratable") or {}).get("status") == "True"
        if strategy == "LiveMigrate" and not migratable:
            return f"VMI {vmi_name} is configured with an eviction strategy but is not live-migratable"
        if not (strategy == "External" or (strategy in ("LiveMigrate", "LiveMigrateIfPossible") and migratable)):
            return ""  # None, unset, or LiveMigrateIfPossible without migration: evicted, shut down
        evacuation = f'Eviction triggered evacuation of VMI "{namespace}/{vmi_name}"'
        if (vmi.get("status") or {}).get("evacuationNodeName"):
            return f"Evacuation in progress: {evacuation}"
        node = pod["spec"].get("nodeName", "")
        self.api.mutate(VMI, namespace, vmi_name, lambda o: o["status"].__setitem__("evacuationNodeName", node))
        return evacuation

    def shut_down_evicted(self, vmi: dict[str, Any], runtime: VmiRuntime, pod: dict[str, Any]) -> None:
        """virt-launcher got SIGTERM: the guest is asked to shut down and the VMI ends Succeeded, as virt-handler
        reads a domain shut off by its guest; then the pod goes."""
        namespace, name = runtime.namespace, runtime.name
        if runtime.stop_at is None:
            runtime.stop_at = self.loop.time() + self._delay(self.config.stop_delay)
            self.record(vmi, "Normal", "ShuttingDown", "Signaled Graceful Shutdown", "virt-handler", runtime.node)
            self.api.mutate(
                VMI,
                namespace,
                name,
                lambda o: set_condition(
                    o, new_condition("Ready", "False", "PodTerminating", "virt-launcher pod is terminating")
                ),
            )
        if self._wait(runtime, runtime.stop_at):
            return
        self.guests.stop(runtime.uid)

        def shut_down(o: dict[str, Any]) -> None:
            set_phase(o, "Succeeded")
            drop_condition(o, "AgentConnected")

        self.api.mutate(VMI, namespace, name, shut_down)
        self.record(vmi, "Normal", "Stopped", "The VirtualMachineInstance was shut down.", "virt-handler", runtime.node)
        self._evicting.discard(pod["metadata"]["uid"])
        self.api.remove(POD, namespace, pod["metadata"]["name"])

    def drain_node(self, name: str) -> dict[str, Any] | None:
        """``kubectl drain``: cordon, then evict every pod of the node; what was evicted and what was refused."""
        if self.cordon_node(name, True) is None:
            return None
        evicted, refused = [], []
        for pod in list(self.store.objects("pods")):
            if pod["spec"].get("nodeName") != name or (pod.get("status") or {}).get("phase") in FINAL_PHASES:
                continue
            meta = pod["metadata"]
            try:
                self.evict_pod(meta["namespace"], meta["name"])
                evicted.append(f"{meta['namespace']}/{meta['name']}")
            except ApiError as error:
                refused.append({"pod": f"{meta['namespace']}/{meta['name']}", "message": error.message})
        return {"node": name, "evicted": evicted, "refused": refused}

    def cordon_node(self, name: str, unschedulable: bool) -> dict[str, Any] | None:
        """``kubectl cordon`` / ``uncordon``: the node's spec and taint, and the scheduler's view of it."""
        if self.store.get("nodes", "", name) is None:
            return None

        def cordon(o: dict[str, Any]) -> None:
            taints = [t for t in o["spec"].get("taints") or () if t.get("key") != UNSCHEDULABLE_TAINT["key"]]
            if unschedulable:
                o["spec"]["unschedulable"] = True
                taints.append({**UNSCHEDULABLE_TAINT, "timeAdded": now_rfc3339()})
            else:
                o["spec"].pop("unschedulable", None)
            if taints:
                o["spec"]["taints"] = taints
            else:
                o["spec"].pop("taints", None)

        node = self.api.mutate(NODE, "", name, cordon)
        self.scheduler.cordon(name, unschedulable)
        if not unschedulable:
            self._requeue_unschedulable()
        return node
