"""Settings of one kubesim server: delays, nodes, guest mode, KubeVirt version and feature gates."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class SimConfig:
    """Everything ``python -m kubesim serve`` can be told; defaults look like a small lab cluster."""

    # Seconds spent in each VMI phase before the next one, each stretched by up to ``jitter`` seconds.
    pending_delay: float = 0.3
    scheduling_delay: float = 1.0
    scheduled_delay: float = 1.0
    agent_delay: float = 2.0  # Running → qemu-guest-agent connected (AgentConnected, guestOSInfo)
    stop_delay: float = 0.5  # a deleted VMI's guest shutting down before the VMI goes
    jitter: float = 0.0
    # "realistic" or "realistic-kvm" (profiles.py): per-VMI delays drawn from real clusters' and guests' timings,
    # instead of the four delays above and the jitter; "" keeps them.
    profile: str = ""
    restart_backoff: float = 10.0  # first start-failure backoff; doubles per consecutive failure, max 300 s
    image_pull_backoff: float = 10.0  # kubelet's first image pull back-off; doubles per failed pull, max 300 s
    nodes: int = 3
    node_cpu: str = "16"
    node_memory: str = "64Gi"
    node_pods: int = 110
    node_kvm_devices: int = 1000
    kubernetes_version: str = "v1.33.5"
    kubevirt_version: str = "v1.9.0"
    feature_gates: list[str] = field(default_factory=list)
    disabled_feature_gates: list[str] = field(default_factory=list)
    image_volume_supported: bool = True
    bad_image_pattern: str = "missing"
    guest: str = "shell"  # "shell": a sandboxed bash plus cloud-init and the lab agent; "vm": QEMU; "none"
    guest_python: str = "python3"
    guest_images: list[str] = field(default_factory=list)  # vm: "DIR" or "containerDisk-name=DIR"
    guest_max_cpus: int = 1  # vm: caps on what a VMI asks for (0: none), for small hosts
    guest_max_memory_mib: int = 1024
    # vm: what the guests run under ("kvm" or "tcg") and why, found by probing at start; "" for other guests.
    accelerator: str = ""
    accelerator_reason: str = ""
    watch_history: int = 10_000
    bookmark_interval: float = 60.0
    watch_timeout: float = 1800.0
    # v1.9.0's fixed overhead: virt-launcher-monitor 25Mi, virt-launcher 100Mi, virtlogd 25Mi, virtqemud 40Mi,
    # qemu 30Mi (pkg/hypervisor/kvm/hypervisorbackend.go).
    launcher_fixed_overhead: str = "220Mi"
    event_limit: int = 50_000
    # RBAC for the portal's token (rbac.py); the admin kubeconfig and client certificates stay in system:masters.
    rbac: bool = False
    rbac_manifests: list[str] = field(default_factory=list)  # applied at start, as a cluster admin would
    seed: int | None = None

    def bad_image(self, image: str) -> bool:
        return bool(self.bad_image_pattern) and re.search(self.bad_image_pattern, image) is not None

    def container_runtime_version(self) -> str:
        # k3s < 1.36.2 bundles containerd 2.2.3 (no image volumes); 2.3.2 has them.
        return "containerd://2.3.2" if self.image_volume_supported else "containerd://2.2.3"
