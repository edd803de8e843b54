"""Cluster API cost: requests per running attempt per minute in steady state, with 200 running attempts.

200 attempts in four tenants (four namespaces) are running: their VMs exist in kubesim (made with the portal's
own manifest builders and labels) and their rows say ``running``. The portal's Celery worker and beat then run
as in production, the sync task on its beat interval (``ATTEMPT_SYNC_INTERVAL_SECONDS``) and the sweep on its
own, while kubesim counts every request over a measured window (a whole number of resync and sweep periods).

Baseline, on the same kubesim and the same VMs: what polling each attempt's VMI on the same interval would cost
(a GET per attempt per sync interval), measured over a shorter window and given per minute.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from bench.common import emit, kubesim, live_portal, log, machine, seed_course, setup_django

TENANTS = 4
ATTEMPTS_PER_TENANT = 50
SETTLE_SECONDS = 6
WINDOW_SECONDS = 60
POLL_WINDOW_SECONDS = 9
TARGET = 0.5


def running_attempts(*, tenants: int, per_tenant: int) -> list:
    """Attempts already running, with their Secret and VM on the cluster as the provisioning task leaves them."""
    from django.utils import timezone

    from guest.cloud_init import render_user_data
    from labs.kubevirt import manifests, names, operations
    from labs.models import Attempt, AttemptState
    from labs.services.namespaces import tenant_namespace_ensure
    from labs.sizes import launcher_requests

    now = timezone.now()
    launcher = launcher_requests(vcpus=1, memory_mib=2048)
    attempts = []
    for index in range(tenants):
        seeded = seed_course(students=per_tenant, labs=1, name=f"Bench API Tenant {index}")
        tenant_namespace_ensure(tenant=seeded.tenant)
        for student in seeded.students:
            attempt = Attempt.objects.create(
                lab=seeded.labs[0],
                student=student,
                tenant=seeded.tenant,
                state=AttemptState.RUNNING,
                namespace=seeded.tenant.namespace,
                agent_token=secrets.token_urlsafe(32),
                vcpus=1,
                memory_mib=2048,
                launcher_cpu_millicores=launcher.cpu_millicores,
                launcher_memory_mib=launcher.memory_mib,
                phase="Running",
                requested_at=now - timedelta(minutes=2),
                provisioned_at=now - timedelta(minutes=2),
                vmi_running_at=now - timedelta(minutes=1),
                agent_ready_at=now - timedelta(minutes=1),
                expires_at=now + timedelta(hours=2),
            )
            attempt.vm_name = names.vm_name(attempt.id)
            attempt.save(update_fields=["vm_name"])
            attempts.append(attempt)
    user_data = render_user_data(token=secrets.token_urlsafe(32))

    def create(attempt) -> None:
        labels = names.attempt_labels(
            tenant_id=attempt.tenant_id, course_id=attempt.lab.course_id, lab_id=attempt.lab_id, attempt_id=attempt.id
        )
        secret_name = names.cloud_init_secret_name(attempt.vm_name)
        operations.secret_create(
            manifests.cloud_init_secret(
                name=secret_name, namespace=attempt.namespace, labels=labels, user_data=user_data
            )
        )
        operations.vm_create(
            manifests.virtual_machine(
                name=attempt.vm_name,
                namespace=attempt.namespace,
                labels=labels,
                image=attempt.lab.image,
                vcpus=1,
                memory_mib=2048,
                host_passthrough=False,
                cloud_init_secret=secret_name,
            )
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, attempts))
    return attempts


def wait_all_running(attempts: list, *, timeout: float = 120) -> int:
    from labs.kubevirt import operations

    namespaces = sorted({attempt.namespace for attempt in attempts})
    deadline = time.monotonic() + timeout
    while True:
        running = sum(
            1
            for namespace in namespaces
            for vmi in operations.vmis_list(namespace=namespace)
            if (vmi.get("status") or {}).get("phase") == "Running"
        )
        if running >= len(attempts) or time.monotonic() > deadline:
            return running
        time.sleep(1)


def poll_each_vmi(attempts: list, *, interval: float, seconds: float) -> None:
    """What a poll per attempt would do: GET every attempt's VMI once per sync interval."""
    from labs.kubevirt import client as kube_client

    api = kube_client.custom_objects()
    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(max_workers=8) as pool:
        while time.monotonic() < deadline:
            started = time.monotonic()
            list(
                pool.map(
                    lambda attempt: api.get_namespaced_custom_object(
                        "kubevirt.io",
                        "v1",
                        attempt.namespace,
                        "virtualmachineinstances",
                        attempt.vm_name,
                        _preload_content=False,
                    ),
                    attempts,
                )
            )
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


def per_attempt_minute(counters: dict[str, Any], *, attempts: int) -> float:
    return round(counters["total"] / attempts / (counters["elapsed_seconds"] / 60), 4)


def main() -> None:
    setup_django()
    from django.conf import settings

    from labs.kubevirt import client as kube_client
    from labs.models import Attempt, AttemptState

    with kubesim(name="kubesim-api-cost", guest="none") as server:
        settings.KUBECONFIG = str(server.kubeconfig)
        kube_client.reset()
        log(f"creating {TENANTS * ATTEMPTS_PER_TENANT} running attempts in {TENANTS} namespaces")
        attempts = running_attempts(tenants=TENANTS, per_tenant=ATTEMPTS_PER_TENANT)
        vmis_running = wait_all_running(attempts)
        with live_portal(kubeconfig=server.kubeconfig, worker_concurrency=4):
            time.sleep(SETTLE_SECONDS)
            server.admin.reset_counters()
            log(f"measuring the portal for {WINDOW_SECONDS} s")
            time.sleep(WINDOW_SECONDS)
            portal_counters = server.admin.counters()
        still_running = Attempt.objects.filter(id__in=[a.id for a in attempts], state=AttemptState.RUNNING).count()

        log(f"baseline: a GET per attempt every {settings.ATTEMPT_SYNC_INTERVAL_SECONDS} s")
        server.admin.reset_counters()
        poll_each_vmi(attempts, interval=settings.ATTEMPT_SYNC_INTERVAL_SECONDS, seconds=POLL_WINDOW_SECONDS)
        poll_counters = server.admin.counters()

    figure = per_attempt_minute(portal_counters, attempts=len(attempts))
    emit(
        {
            "benchmark": "api_cost",
            "description": f"cluster API requests per running attempt per minute, {len(attempts)} running attempts in "
            f"{TENANTS} namespaces, Celery worker + beat (sync every "
            f"{settings.ATTEMPT_SYNC_INTERVAL_SECONDS} s, resync {settings.ATTEMPT_RESYNC_SECONDS} s, "
            f"sweep {settings.ATTEMPT_SWEEP_INTERVAL_SECONDS} s), kubesim request counters; baseline: a "
            "GET of each attempt's VMI per sync interval",
            "target": {"requests_per_running_attempt_per_minute": TARGET},
            "figures": {
                "requests_per_running_attempt_per_minute": figure,
                "requests": portal_counters["total"],
                "window_seconds": round(portal_counters["elapsed_seconds"], 1),
                "by_verb_resource": portal_counters["by_verb_resource"],
                "open_watches": portal_counters["open_watches"],
                "attempts": len(attempts),
                "vmis_running": vmis_running,
                "attempts_still_running_after": still_running,
            },
            "baseline": {
                "requests_per_running_attempt_per_minute": per_attempt_minute(poll_counters, attempts=len(attempts)),
                "requests": poll_counters["total"],
                "window_seconds": round(poll_counters["elapsed_seconds"], 1),
                "by_verb_resource": poll_counters["by_verb_resource"],
            },
            "verdict": {"meets_target": figure <= TARGET},
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
