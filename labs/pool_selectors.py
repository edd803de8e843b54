"""Reads about warm pools: each pool's figures for the operations page and ``/metrics``, and the admin's suggestion."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from labs.models import ACTIVE_STATES, Lab
from labs.pool_models import LabPool, PoolMode, PoolVm, PoolVmState
from labs.services.quota import TenantTotals, quota_refusal, tenant_totals
from labs.sizes import guest_resources, launcher_requests
from portal.models import Membership, Role

# A scheduled pool is ready this long before the lab opens (a guest boots in minutes at worst) and gives its
# unclaimed VMs back this long after (late students are few by then; Instruqt's hot-start pools do the same).
SCHEDULE_LEAD = timedelta(minutes=15)
SCHEDULE_TAIL = timedelta(minutes=30)
# Always-warm pools keep a few VMs for students who drop in (Instruqt keeps 2–4 per track).
ALWAYS_WARM_SHARE = 0.1
ALWAYS_WARM_MIN = 2


@dataclass(frozen=True)
class PoolStats:
    lab_id: int
    lab_title: str
    tenant_id: int
    namespace: str
    mode: str
    target: int
    ready: int
    booting: int
    claimed: int  # pool VMs whose attempt is still active
    hits: int
    misses: int
    idle_vm_seconds: float
    problem: str = ""  # what keeps its VMs from booting: the cluster's word on one, or the tenant's quota

    @property
    def hit_ratio(self) -> float | None:
        starts = self.hits + self.misses
        return self.hits / starts if starts else None

    @property
    def idle_vm_minutes(self) -> float:
        return self.idle_vm_seconds / 60


def pool_stats(*, tenant_ids: Iterable[int] | None = None, now: datetime | None = None) -> list[PoolStats]:
    """One row per pool that is on or ever held a VM (of ``tenant_ids``), pruned rows' hits and idle time included."""
    now = now or timezone.now()
    pools = LabPool.objects.select_related("lab__course__tenant").annotate(
        ready=Count("vms", filter=Q(vms__state=PoolVmState.READY)),
        booting=Count("vms", filter=Q(vms__state=PoolVmState.BOOTING)),
        claimed=Count("vms", filter=Q(vms__state=PoolVmState.CLAIMED, vms__attempt__state__in=ACTIVE_STATES)),
        hits=Count("vms", filter=Q(vms__state=PoolVmState.CLAIMED)),
        made=Count("vms"),
    )
    if tenant_ids is not None:
        pools = pools.filter(lab__course__tenant_id__in=list(tenant_ids))
    pools = pools.filter(~Q(mode=PoolMode.OFF) | Q(made__gt=0) | Q(pruned_hits__gt=0) | Q(pruned_idle_seconds__gt=0))
    pools = pools.order_by("lab__course__tenant__name", "lab__title")
    idle: dict[int, float] = {}
    # Python rather than SQL: duration sums differ between PostgreSQL and SQLite.
    pool_ids = [pool.id for pool in pools]
    vms = PoolVm.objects.filter(pool__in=pool_ids).only("pool_id", "created_at", "claimed_at", "ended_at")
    for vm in vms:
        idle[vm.pool_id] = idle.get(vm.pool_id, 0.0) + vm.idle_seconds(now)
    troubled = PoolVm.objects.filter(pool__in=pool_ids, state=PoolVmState.BOOTING).exclude(problem_texts={})
    problems = {vm.pool_id: vm.problem for vm in troubled.only("pool_id", "problem_texts").order_by("id")}
    totals: dict[int, TenantTotals] = {}
    for pool in pools:
        if pool.id in problems or pool.ready + pool.booting >= pool.target(now):
            continue
        tenant = pool.lab.course.tenant
        if tenant.id not in totals:
            totals[tenant.id] = tenant_totals(tenant_id=tenant.id, student=None)
        guest = guest_resources(pool.lab.size)
        launcher = launcher_requests(vcpus=guest.vcpus, memory_mib=guest.memory_mib)
        if quota_refusal(tenant=tenant, used=totals[tenant.id], vcpus=guest.vcpus, memory_mib=launcher.memory_mib):
            problems[pool.id] = _(
                "The tenant's quota has no room for another VM of this lab: the pool boots none until students' "
                "labs end or the quota is raised."
            )
    return [
        PoolStats(
            lab_id=pool.lab_id,
            lab_title=pool.lab.title,
            tenant_id=pool.lab.course.tenant_id,
            namespace=pool.lab.course.tenant.namespace,
            mode=pool.mode,
            target=pool.target(now),
            ready=pool.ready,
            booting=pool.booting,
            claimed=pool.claimed,
            hits=pool.hits + pool.pruned_hits,
            misses=pool.misses,
            idle_vm_seconds=idle.get(pool.id, 0.0) + pool.pruned_idle_seconds,
            problem=problems.get(pool.id, ""),
        )
        for pool in pools
    ]


@dataclass(frozen=True)
class PoolSuggestion:
    enrolled: int
    quota: int
    scheduled_size: int
    always_size: int
    starts_at: datetime | None
    ends_at: datetime | None


def pool_suggestion(*, lab: Lab) -> PoolSuggestion:
    """A scheduled pool of the class (within the VM quota) around the lab's opening, or a small always-warm one."""
    enrolled = Membership.objects.filter(course_id=lab.course_id, role=Role.STUDENT).count()
    quota = lab.course.tenant.max_concurrent_vms
    return PoolSuggestion(
        enrolled=enrolled,
        quota=quota,
        scheduled_size=min(enrolled, quota),
        always_size=min(quota, max(ALWAYS_WARM_MIN, math.ceil(enrolled * ALWAYS_WARM_SHARE))) if enrolled else 0,
        starts_at=lab.opens_at - SCHEDULE_LEAD if lab.opens_at else None,
        ends_at=lab.opens_at + SCHEDULE_TAIL if lab.opens_at else None,
    )
