"""The lab VM sizes and the virt-launcher pod's requests for a size, by KubeVirt v1.9.0's arithmetic
(``renderresources.go``: guest memory plus fixed, per-vCPU and page-table overhead, and the console-log sidecar),
so quotas never admit a VM the namespace's ResourceQuota would refuse."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models
from django.utils.translation import gettext_lazy as _

MIB = 2**20
CPU_ALLOCATION_RATIO = 10
PAGE_TABLE_DIVISOR = 512
FIXED_OVERHEAD_MIB = 25 + 100 + 25 + 40 + 30
PER_VCPU_OVERHEAD_MIB = 8
IOTHREAD_OVERHEAD_MIB = 8
VIDEO_RAM_MIB = 32
CONSOLE_LOG_CPU_MILLICORES = 5
CONSOLE_LOG_MEMORY_BYTES = 35_000_000


class LabSize(models.TextChoices):
    SMALL = "small", _("Small: 1 vCPU, 2 GiB")
    MEDIUM = "medium", _("Medium: 2 vCPU, 4 GiB")
    LARGE = "large", _("Large: 4 vCPU, 8 GiB")


@dataclass(frozen=True)
class GuestResources:
    vcpus: int
    memory_mib: int


@dataclass(frozen=True)
class LauncherRequests:
    """The virt-launcher pod's requests (all containers, as a ResourceQuota counts them) and its ``compute``'s alone."""

    cpu_millicores: int
    memory_mib: int
    compute_cpu_millicores: int = 0
    compute_memory_bytes: int = 0


SIZE_TABLE: dict[str, GuestResources] = {
    LabSize.SMALL: GuestResources(vcpus=1, memory_mib=2048),
    LabSize.MEDIUM: GuestResources(vcpus=2, memory_mib=4096),
    LabSize.LARGE: GuestResources(vcpus=4, memory_mib=8192),
}


def guest_resources(size: str) -> GuestResources:
    try:
        return SIZE_TABLE[size]
    except KeyError:
        raise ValueError(f"Unknown lab size {size!r}; expected one of {', '.join(SIZE_TABLE)}.") from None


def cpu_millicores_for(vcpus: int) -> int:
    """The compute container's CPU request for this many vCPUs (rounded up to a millicore)."""
    return -(-vcpus * 1000 // CPU_ALLOCATION_RATIO)


def launcher_requests(
    *, vcpus: int, memory_mib: int, graphics: bool = True, console_log: bool = True
) -> LauncherRequests:
    """The virt-launcher pod's CPU and memory requests for a guest of this shape."""
    compute_cpu = cpu_millicores_for(vcpus)
    page_tables = -(-memory_mib * MIB // 1000) * 1000 // PAGE_TABLE_DIVISOR
    overhead_mib = FIXED_OVERHEAD_MIB + PER_VCPU_OVERHEAD_MIB * vcpus + IOTHREAD_OVERHEAD_MIB
    compute_memory = (memory_mib + overhead_mib + (VIDEO_RAM_MIB if graphics else 0)) * MIB + page_tables
    cpu, memory = compute_cpu, compute_memory
    if console_log:
        cpu, memory = cpu + CONSOLE_LOG_CPU_MILLICORES, memory + CONSOLE_LOG_MEMORY_BYTES
    return LauncherRequests(
        cpu_millicores=cpu,
        memory_mib=-(-memory // MIB),
        compute_cpu_millicores=compute_cpu,
        compute_memory_bytes=compute_memory,
    )


def namespace_cpu_millicores(*, max_vcpus: int, max_vms: int) -> int:
    """The CPU a tenant's namespace must allow: its vCPUs' compute requests, and each VM's console log sidecar."""
    return cpu_millicores_for(max_vcpus) + CONSOLE_LOG_CPU_MILLICORES * max_vms
