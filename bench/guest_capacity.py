"""How many idle real guests (kubesim ``--guest vm``) this machine holds, booted a batch at a time, with each
guest's RSS and idle CPU. Run on its own; its bounds and method: ``docs/benchmarks.md``."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import BASE_DIR, cpu_seconds, emit, kubesim, log, machine

SETTLE_SECONDS = 60.0  # after a batch's agents report: cloud-init and the lab agent finish meanwhile
SAMPLE_SECONDS = 20.0


def _meminfo_mib(key: str) -> float:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _vm(name: str) -> dict[str, Any]:
    from kubesim.tests.support import vm_manifest

    return vm_manifest(name, cloud_init_secret=f"{name}-ci", image="quay.io/containerdisks/debian:12")


def _agent_connected(custom: Any, name: str) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        vmi = custom.get_namespaced_custom_object("kubevirt.io", "v1", "default", "virtualmachineinstances", name)
    except ApiException:
        return False
    return any(c.get("type") == "AgentConnected" for c in (vmi.get("status") or {}).get("conditions") or ())


def _sample(pids: dict[str, int]) -> dict[str, Any]:
    """Idle CPU (share of one core) and RSS of each guest's QEMU over SAMPLE_SECONDS, and the host's state."""
    before = {name: cpu_seconds(pid) or 0.0 for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(SAMPLE_SECONDS)
    elapsed = time.monotonic() - started
    guests = {
        name: {
            "rss_mib": round(_rss_mib(pid), 1),
            "cpu_share": round(((cpu_seconds(pid) or 0.0) - before[name]) / elapsed, 4),
        }
        for name, pid in pids.items()
    }
    return {
        "running": len(pids),
        "guests": guests,
        "rss_mib_total": round(sum(g["rss_mib"] for g in guests.values()), 1),
        "cpu_share_total": round(sum(g["cpu_share"] for g in guests.values()), 4),
        "mem_available_mib": round(_meminfo_mib("MemAvailable")),
        "loadavg": os.getloadavg(),
    }


def main() -> None:
    from kubernetes import client

    from guest.cloud_init import render_user_data
    from kubesim.tests.support import secret_manifest

    most = int(os.environ.get("GUEST_CAPACITY_MAX", "10"))
    batch = int(os.environ.get("GUEST_CAPACITY_BATCH", "2"))
    reserve = float(os.environ.get("GUEST_CAPACITY_RESERVE_MIB", "3072"))
    boot_timeout = float(os.environ.get("GUEST_CAPACITY_BOOT_TIMEOUT", "600"))
    image = subprocess.run(
        [str(BASE_DIR / "guest/image/build")], capture_output=True, text=True, check=True
    ).stdout.strip()
    total_mib = _meminfo_mib("MemTotal")
    result: dict[str, Any] = {
        "benchmark": "guest_capacity",
        "machine": machine(),
        "mem_total_mib": round(total_mib),
        "mem_available_before_mib": round(_meminfo_mib("MemAvailable")),
        "image": Path(image).name,
        "points": [],
    }
    with kubesim(name="guest-capacity", guest="vm", guest_image=image, nodes=1) as sim:
        api = sim.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        pids: dict[str, int] = {}
        stop_reason = f"reached GUEST_CAPACITY_MAX={most}"
        while len(pids) < most:
            names = [f"idle-{len(pids) + i + 1:02d}" for i in range(min(batch, most - len(pids)))]
            started = time.monotonic()
            for name in names:
                core.create_namespaced_secret(
                    "default", secret_manifest(f"{name}-ci", render_user_data(token="capacity-" + "x" * 24))
                )
                custom.create_namespaced_custom_object("kubevirt.io", "v1", "default", "virtualmachines", _vm(name))
            log(f"booting {', '.join(names)} ({len(pids)} idle already)")
            while not all(_agent_connected(custom, name) for name in names):
                if time.monotonic() - started > boot_timeout:
                    break
                time.sleep(2)
            boot_seconds = round(time.monotonic() - started, 1)
            if not all(_agent_connected(custom, name) for name in names):
                stop_reason = f"a batch of {len(names)} did not boot within {boot_timeout:.0f} s"
                break
            for name in names:
                pids[name] = sim.admin.guest("default", name)["qemu_pid"]
            accelerator = sim.admin.guest("default", names[0])["accelerator"]
            time.sleep(SETTLE_SECONDS)
            point = {"batch_boot_seconds": boot_seconds, **_sample(pids)}
            result["points"].append(point)
            result["accelerator"] = accelerator
            log(
                f"{len(pids)} idle: rss {point['rss_mib_total']} MiB, cpu {point['cpu_share_total']:.3f} cores, "
                f"available {point['mem_available_mib']} MiB, load {point['loadavg'][0]:.1f}"
            )
            if point["mem_available_mib"] - batch * max(g["rss_mib"] for g in point["guests"].values()) < reserve:
                stop_reason = f"another batch would leave less than {reserve:.0f} MiB available"
                break
        api.close()
    result["stopped_because"] = stop_reason
    result["extrapolation"] = extrapolate(result)
    emit(result)


def extrapolate(result: dict[str, Any]) -> dict[str, Any]:
    """Guests per guest from the last point (the most running together), and the counts memory and CPU allow."""
    if not result["points"]:
        return {}
    last = result["points"][-1]
    n = last["running"]
    per_guest_host_mib = (result["mem_available_before_mib"] - last["mem_available_mib"]) / n
    per_guest_rss = last["rss_mib_total"] / n
    # The median guest: the newest batch may not be quite idle yet.
    per_guest_cpu = sorted(g["cpu_share"] for g in last["guests"].values())[n // 2]
    cores = os.cpu_count() or 1
    by_memory = int((result["mem_available_before_mib"] - 2048) / max(per_guest_host_mib, per_guest_rss))
    return {
        "measured_running_together": n,
        "per_guest_rss_mib": round(per_guest_rss, 1),
        "per_guest_host_mib": round(per_guest_host_mib, 1),
        "per_guest_idle_cpu_share_median": round(per_guest_cpu, 4),
        "guests_by_memory_keeping_2_gib": by_memory,
        "guests_by_idle_cpu_at_half_the_cores": int(cores * 0.5 / per_guest_cpu) if per_guest_cpu else None,
    }


if __name__ == "__main__":
    main()
