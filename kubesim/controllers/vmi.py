"""The VMI's way from Pending to Running and back: virt-controller (launcher pod, quota), kube-scheduler,
kubelet (images, mounts, container start) and virt-handler (domain, guest, agent, shutdown)."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from kubesim import podsecurity
from kubesim.apiserver import VMI_FINALIZER
from kubesim.controllers.objects import (
    CONTAINER_DISK_ERROR,
    FINAL_PHASES,
    GUEST_OS,
    POD,
    QUOTA,
    VMI,
    VmiRuntime,
    drop_condition,
    format_quantity,
    get_condition,
    new_condition,
    set_condition,
    set_phase,
)
from kubesim.controllers.quota import effective_requests
from kubesim.featuregates import developer_configuration, gate_enabled
from kubesim.launcher import launcher_requests, render_pod
from kubesim.quantity import parse_quantity
from kubesim.store import now_rfc3339

# virt-controller retries a refused pod creation with backoff; a namespace relabelled is noticed this soon.
PSA_RETRY_SECONDS = 5.0


class VirtualMachineInstanceController:
    """Mixed into ``Cluster``, which provides the store, the API, the queue, the scheduler and the recorder."""

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
        set_phase(vmi, "Pending")

    def _runtime(self, vmi: dict[str, Any]) -> VmiRuntime:
        meta = vmi["metadata"]
        runtime = self.runtimes.get(meta["uid"])
        if runtime is None:
            runtime = VmiRuntime(meta["uid"], meta["namespace"], meta["name"], plan=self._draw_plan())
            runtime.next_at = self.loop.time() + self._phase_delay(runtime, "pending")
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
        if phase in ("", "Pending") or (phase == "Scheduling" and runtime.node is None):
            # Scheduling without a node: the pod exists and is still the scheduler's (unschedulable so far).
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
                self.fail_vmi(namespace, name, reason="PodTerminating", message="virt-launcher pod was deleted")
                return
            if runtime.agent_at is not None and get_condition(vmi, "AgentConnected") is None:
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
            asked = {
                "pods": Decimal(1),
                "count/pods": Decimal(1),
                "requests.cpu": cpu,
                "cpu": cpu,
                "requests.memory": memory,
                "memory": memory,
            }
            exceeded = []
            for resource, limit in hard.items():
                if resource in asked and used.get(resource, Decimal(0)) + asked[resource] > parse_quantity(limit):
                    exceeded.append(resource)
            if exceeded:
                exceeded.sort()
                requested = ",".join(f"{r}={format_quantity(r, asked[r])}" for r in exceeded)
                used_text = ",".join(f"{r}={format_quantity(r, used.get(r, Decimal(0)))}" for r in exceeded)
                limited = ",".join(f"{r}={hard[r]}" for r in exceeded)
                return (
                    f"exceeded quota: {quota['metadata']['name']}, requested: {requested}, used: {used_text}, "
                    f"limited: {limited}"
                )
        return None

    def _admit_pod(self, vmi: dict[str, Any], runtime: VmiRuntime, pod: dict[str, Any]) -> bool:
        """Pod Security, then ResourceQuota admission of a new launcher pod; a refusal is surfaced as lifecycle.go
        does (``Synchronized=False/FailedCreate``, a Warning event, the VMI left Pending) and retried later."""
        namespace, name = runtime.namespace, runtime.name
        generated = f"virt-launcher-{name}-"
        psa = podsecurity.denial(pod, self.store.get("namespaces", "", namespace), pod_name=generated)
        if psa:
            message = f"failed to create pod for vmi {namespace}/{name}, it needs a privileged namespace to run: {psa}"
            event = f"failed to render launch manifest: {message}"
            self.enqueue_later(PSA_RETRY_SECONDS, "vmi", namespace, name)
        else:
            cpu, memory = effective_requests(pod)
            quota = self._quota_denial(namespace, cpu, memory)
            if not quota:
                return False
            refusal = f'pods "{generated}" is forbidden: {quota}'
            message, event = f"failed to create virtual machine pod: {refusal}", f"Error creating pod: {refusal}"
            self._unschedulable.add((namespace, name))
        if not runtime.create_refused:  # one event per refusal, as the recorder's aggregation shows it
            runtime.create_refused = True
            self.record(vmi, "Warning", "FailedCreate", event, "virtualmachineinstance-controller")

        def not_synced(o: dict[str, Any]) -> None:
            set_condition(o, new_condition("Synchronized", "False", "FailedCreate", message))

        self.api.mutate(VMI, namespace, name, not_synced)
        return True

    def _quota_usage(self, namespace: str) -> dict[str, Decimal]:
        return self.pod_usage.usage(namespace)

    def reconcile_quotas(self, namespace: str) -> None:
        quotas = list(self.store.objects("resourcequotas", namespace))
        if not quotas:
            return
        used = self._quota_usage(namespace)
        for quota in quotas:
            hard = (quota.get("spec") or {}).get("hard") or {}

            def write(o: dict[str, Any], hard: dict[str, Any] = hard) -> None:
                o["status"] = {
                    "hard": dict(hard),
                    "used": {r: format_quantity(r, used[r]) if r in used else "0" for r in hard},
                }

            self.api.mutate(QUOTA, namespace, quota["metadata"]["name"], write)

    def _schedule_vmi(self, vmi: dict[str, Any], runtime: VmiRuntime) -> None:
        namespace, name = runtime.namespace, runtime.name
        pod = self._pod_for(runtime)
        spec = vmi.get("spec") or {}
        kubevirt = self.kubevirt()
        cpu, memory = launcher_requests(
            spec,
            developer=developer_configuration(kubevirt),
            fixed_overhead=self.config.launcher_fixed_overhead,
            overhead_ratio=(((kubevirt or {}).get("spec") or {}).get("configuration") or {}).get(
                "additionalGuestMemoryOverheadRatio"
            ),
        )
        if pod is None:
            version = ((kubevirt or {}).get("status") or {}).get("observedKubeVirtVersion", "v1.9.0")
            body = render_pod(vmi, cpu=cpu, memory=memory, kubevirt_version=version, rng=self.rng, kubevirt=kubevirt)
            refused = self._admit_pod(vmi, runtime, body)
            if refused:
                return
            pod = self.api.create(POD, namespace, body, internal=True)[0]
            runtime.pod_name = pod["metadata"]["name"]
            runtime.create_refused = False
            self.record(
                vmi,
                "Normal",
                "SuccessfulCreate",
                f"Created virtual machine pod {runtime.pod_name}",
                "virtualmachineinstance-controller",
            )
        cpu, memory = effective_requests(pod)
        if pod["spec"].get("nodeName"):
            return
        node, why = self.scheduler.pick(cpu, memory)
        if node is None:
            self._unschedulable.add((namespace, name))
            self.record(pod, "Warning", "FailedScheduling", why, "default-scheduler")

            def unschedulable(o: dict[str, Any]) -> None:
                set_condition(o, new_condition("PodScheduled", "False", "Unschedulable", why))

            self.api.mutate(POD, namespace, pod["metadata"]["name"], unschedulable)

            def vmi_unschedulable(o: dict[str, Any]) -> None:
                # KubeVirt's VMI controller moves a VMI to Scheduling as soon as its launcher pod exists, scheduled
                # or not, and copies the pod's PodScheduled=False onto it (vmi.go, updateStatus).
                set_condition(o, new_condition("PodScheduled", "False", "Unschedulable", why))
                drop_condition(o, "Synchronized")
                set_condition(
                    o, new_condition("Ready", "False", "GuestNotRunning", "Guest VM is not reported as running")
                )
                set_phase(o, "Scheduling")
                o["status"]["activePods"] = {pod["metadata"]["uid"]: ""}

            self.api.mutate(VMI, namespace, name, vmi_unschedulable)
            return
        self._unschedulable.discard((namespace, name))
        ip = self.scheduler.bind(pod["metadata"]["uid"], node, cpu, memory)
        runtime.node, runtime.ip = node, ip
        host_ip = self.store.get("nodes", "", node)["status"]["addresses"][0]["address"]

        def bound(o: dict[str, Any]) -> None:
            o["spec"]["nodeName"] = node
            o["status"].update(
                {
                    "hostIP": host_ip,
                    "hostIPs": [{"ip": host_ip}],
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "startTime": now_rfc3339(),
                }
            )
            set_condition(o, new_condition("PodScheduled", "True"))
            set_condition(o, new_condition("Initialized", "True"))
            set_condition(
                o, new_condition("Ready", "False", "ContainersNotReady", "containers with unready status: [compute]")
            )

        self.api.mutate(POD, namespace, pod["metadata"]["name"], bound)
        self.record(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {namespace}/{pod['metadata']['name']} to {node}",
            "default-scheduler",
        )

        def scheduling(o: dict[str, Any]) -> None:
            drop_condition(o, "PodScheduled")
            drop_condition(o, "Synchronized")
            set_condition(o, new_condition("Ready", "False", "GuestNotRunning", "Guest VM is not reported as running"))
            set_phase(o, "Scheduling")
            o["status"]["activePods"] = {pod["metadata"]["uid"]: node}

        self.api.mutate(VMI, namespace, name, scheduling)
        runtime.next_at = self.loop.time() + self._phase_delay(runtime, "scheduling")
        self._wait(runtime, runtime.next_at)

    def _container_disk_images(self, vmi: dict[str, Any]) -> list[str]:
        return [
            v["containerDisk"].get("image", "")
            for v in (vmi.get("spec") or {}).get("volumes") or ()
            if v.get("containerDisk")
        ]

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
            self._image_pull_failure(vmi, runtime, pod, bad[0])
            return
        missing = self._missing_secrets(vmi)
        if missing:
            # kubelet cannot mount the cloud-init Secret: the pod waits (ContainerCreating) and retries.
            self.record(
                pod,
                "Warning",
                "FailedMount",
                f'MountVolume.SetUp failed for volume "{missing[0][0]}" : secret "{missing[0][1]}" not found',
                "kubelet",
                node,
            )
            self.enqueue_later(1.0, "vmi", namespace, name)
            return
        if not runtime.pulled:
            runtime.pulled = True
            for container in pod["spec"]["containers"]:
                self.record(
                    pod,
                    "Normal",
                    "Pulled",
                    f'Container image "{container["image"]}" already present on machine',
                    "kubelet",
                    node,
                )
        if images and gate_enabled(self.kubevirt(), "ImageVolume") and not self.config.image_volume_supported:
            self._fail_launcher_start(vmi, runtime, pod)
            return
        for container in pod["spec"]["containers"]:
            self.record(pod, "Normal", "Created", f"Created container: {container['name']}", "kubelet", node)
            self.record(pod, "Normal", "Started", f"Started container {container['name']}", "kubelet", node)

        def running(o: dict[str, Any]) -> None:
            o["status"]["phase"] = "Running"
            o["status"]["containerStatuses"] = [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": c["image"],
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "containerID": f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}",
                    "state": {"running": {"startedAt": now_rfc3339()}},
                }
                for c in o["spec"]["containers"]
            ]
            set_condition(o, new_condition("ContainersReady", "True"))
            set_condition(o, new_condition("kubevirt.io/virtual-machine-unpaused", "True"))
            set_condition(o, new_condition("Ready", "True"))

        self.api.mutate(POD, namespace, pod["metadata"]["name"], running)

        def scheduled(o: dict[str, Any]) -> None:
            set_phase(o, "Scheduled")
            o["status"]["nodeName"] = node
            o["metadata"].setdefault("labels", {})["kubevirt.io/nodeName"] = node
            o["status"]["launcherContainerImageVersion"] = pod["spec"]["containers"][0]["image"]

        self.api.mutate(VMI, namespace, name, scheduled)
        runtime.next_at = self.loop.time() + self._phase_delay(runtime, "scheduled")
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
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": c["image"],
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": {"exitCode": 128, "reason": "StartError", "message": CONTAINER_DISK_ERROR}}
                    if c["name"] == container
                    else {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
                for c in o["spec"]["containers"]
            ]
            set_condition(o, new_condition("Ready", "False", "PodFailed"))

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
            set_phase(o, "Running")
            status = o["status"]
            status["interfaces"] = [
                {
                    "ipAddress": runtime.ip,
                    "ipAddresses": [runtime.ip],
                    "mac": mac,
                    "name": networks[0]["name"],
                    "interfaceName": "eth0",
                    "podInterfaceName": "eth0",
                    "infoSource": "domain",
                    "queueCount": 1,
                    "linkState": "up",
                }
            ]
            status["migrationMethod"] = "BlockMigration"
            status["migrationTransport"] = "Unix"
            status["machine"] = {"type": "pc-q35-rhel9.6.0"}
            status["currentCPUTopology"] = {
                k: v for k, v in (o["spec"]["domain"].get("cpu") or {}).items() if k in ("cores", "sockets", "threads")
            }
            status["volumeStatus"] = [
                {"name": v["name"], "target": f"vd{chr(97 + i)}"} for i, v in enumerate(o["spec"].get("volumes") or ())
            ]
            status["selinuxContext"] = "none"
            status["runtimeUser"] = 107
            set_condition(o, new_condition("Ready", "True"))
            set_condition(
                o,
                new_condition(
                    "LiveMigratable",
                    "False",
                    "DisksNotLiveMigratable",
                    "cannot migrate VMI: PVC is not shared, live migration requires that "
                    "all PVCs must be shared (using ReadWriteMany access mode)",
                ),
            )
            set_condition(o, new_condition("StorageLiveMigratable", "True"))

        self.api.mutate(VMI, namespace, name, running)
        self.record(vmi, "Normal", "Started", "VirtualMachineInstance started.", "virt-handler", node)
        self.counters.vmis_started += 1
        current = self.store.get("virtualmachineinstances", namespace, name)
        agent = self._phase_delay(runtime, "agent") if self.guests.simulates_agent else 0.0
        if current is not None:
            # Under a profile the shell guest's lab agent also waits out the guest's boot.
            self.guests.start(current, agent_after=agent if runtime.plan is not None else 0.0)
        if self.guests.simulates_agent:  # a vm guest's own qemu-guest-agent reports in when it is up
            runtime.agent_at = self.loop.time() + agent
            self._wait(runtime, runtime.agent_at)

    def _connect_agent(self, vmi: dict[str, Any], runtime: VmiRuntime) -> None:
        images = " ".join(self._container_disk_images(vmi)).lower()
        os_info = next((info for key, info in GUEST_OS.items() if key in images), GUEST_OS["fedora"])
        hostname = (vmi.get("spec") or {}).get("hostname") or runtime.name

        def connected(o: dict[str, Any]) -> None:
            set_condition(o, new_condition("AgentConnected", "True"))
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
                self.record(vmi, "Normal", "ShuttingDown", "Signaled Graceful Shutdown", "virt-handler", runtime.node)
        if self._wait(runtime, runtime.stop_at):
            return
        self.guests.stop(runtime.uid)
        pod = self._pod_for(runtime)
        if pod is not None:
            self.api.remove(POD, namespace, pod["metadata"]["name"])
            self.record(
                vmi,
                "Normal",
                "SuccessfulDelete",
                f"Deleted virtual machine pod {pod['metadata']['name']}",
                "virtualmachineinstance-controller",
            )

        def stopped(o: dict[str, Any]) -> None:
            if o["status"].get("phase") not in FINAL_PHASES:
                set_phase(o, "Succeeded" if o["status"].get("phase") == "Running" else "Failed")
            set_condition(o, new_condition("Ready", "False", "PodTerminating", "virt-launcher pod is terminating"))
            drop_condition(o, "AgentConnected")
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
                set_condition(o, new_condition("Ready", "False", "PodFailed"))

            self.api.mutate(POD, runtime.namespace, pod["metadata"]["name"], pod_failed)
            if self.scheduler.release(pod["metadata"]["uid"]):
                self._requeue_unschedulable()

    def fail_vmi(
        self, namespace: str, name: str, *, reason: str, message: str = "", record_pod: bool = True
    ) -> dict[str, Any] | None:
        """Move a VMI to Failed (crash, lost node, admin fault); its guest goes and its pod ends."""
        vmi = self.store.get("virtualmachineinstances", namespace, name)
        if vmi is None:
            return None

        def failed(o: dict[str, Any]) -> None:
            set_phase(o, "Failed")
            if reason == "NodeUnresponsive":
                # The only status.reason v1.9 writes (pkg/virt-controller/watch/node/node.go); every other failure
                # is told by conditions, the VM's printableStatus and Events.
                o["status"]["reason"] = reason
            set_condition(o, new_condition("Ready", "False", "GuestNotRunning", "Guest VM is not reported as running"))
            drop_condition(o, "AgentConnected")
            if message:
                set_condition(o, new_condition("Synchronized", "False", reason, message))

        updated = self.api.mutate(VMI, namespace, name, failed)
        self.record(
            vmi,
            "Warning",
            reason,
            message or f"VirtualMachineInstance failed: {reason}",
            "virt-handler" if reason != "PodFailed" else "virtualmachineinstance-controller",
            self.runtimes.get(vmi["metadata"]["uid"], VmiRuntime("", "", "")).node,
        )
        runtime = self.runtimes.get(vmi["metadata"]["uid"])
        if runtime is not None:
            self._after_final(updated or vmi, runtime)
        return updated

    def reconcile_pod(self, namespace: str, name: str) -> None:
        """kubelet: a pod being deleted has its containers killed and goes; its VMI notices."""
        pod = self.store.get("pods", namespace, name)
        if pod is not None and pod["metadata"].get("deletionTimestamp"):
            self.api.remove(POD, namespace, name)
