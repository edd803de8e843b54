"""Warm pools kept at their size within the tenant's quota: VMs made, asked until their agent answers, replaced,
drained; long-ended rows pruned, their figures kept on their pool."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Max, Min, Q
from django.utils import timezone

from labs.kubevirt import names, operations, status
from labs.kubevirt.operations import ClusterError
from labs.kubevirt.status import FINAL_PHASES
from labs.models import FINAL_STATES
from labs.pool_models import POOL_HOLDING_STATES, LabPool, PoolMode, PoolVm, PoolVmState, pool_vm_recipe
from labs.services.agents import agents_answer
from labs.services.provisioning import lab_vm_create
from labs.services.quota import quota_refusal, tenant_over_quota, tenant_totals
from labs.sizes import guest_resources, launcher_requests
from labs.wording import in_every_language, in_language
from portal.models import Tenant

logger = logging.getLogger(__name__)


class EndReason:
    DRAINED = "drained"
    STALE = "stale"  # the lab's VM settings changed after it was made
    GAVE_WAY = "gave_way"  # a cold Start needed its quota
    AGENT_LOST = "agent_lost"
    BOOT_TIMEOUT = "boot_timeout"
    CREATE_FAILED = "create_failed"
    CLAIM_FAILED = "claim_failed"
    VMI_ENDED = "vmi_ended"  # its VMI failed, stopped or is being deleted
    VM_GONE = "vm_gone"


@dataclass
class PoolReport:
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # pools whose refill waits for their arriving class


def pools_refill(*, now: datetime | None = None) -> PoolReport:
    """Drain each pool beyond its target, or make up to ``POOL_REFILL_PER_PASS`` VMs unless its class is arriving."""
    now = now or timezone.now()
    report = PoolReport()
    pools = LabPool.objects.select_related("lab__course__tenant").annotate(
        holding=Count("vms", filter=Q(vms__state__in=POOL_HOLDING_STATES))
    )
    for pool in pools.filter(Q(holding__gt=0) | ~Q(mode=PoolMode.OFF)):
        stale = PoolVm.objects.filter(pool=pool, state__in=POOL_HOLDING_STATES).exclude(recipe=pool_vm_recipe(pool.lab))
        pool.holding -= sum(pool_vm_end(pool_vm=pool_vm, reason=EndReason.STALE, report=report) for pool_vm in stale)
        target = pool.target(now)
        # Booting ones first (they cost the least to give up), then the most recently ready.
        holding = PoolVm.objects.filter(pool=pool, state__in=POOL_HOLDING_STATES).order_by("state", "-id")
        if pool.holding and tenant_over_quota(pool.lab.course.tenant):
            # The quota was lowered below what the tenant holds: idle VMs give way, as they do to a Start.
            for pool_vm in holding:
                pool_vm_end(pool_vm=pool_vm, reason=EndReason.GAVE_WAY, report=report)
                if not tenant_over_quota(pool.lab.course.tenant):
                    break
            continue
        if pool.holding > target:
            for pool_vm in holding[: pool.holding - target]:
                pool_vm_end(pool_vm=pool_vm, reason=EndReason.DRAINED, report=report)
            continue
        if target > pool.holding and refill_held(pool=pool, now=now):
            report.held.append(pool.id)
            continue
        for _n in range(min(target - pool.holding, settings.POOL_REFILL_PER_PASS)):
            try:
                made = pool_vm_create(pool=pool)
            except ClusterError as error:
                report.errors.append(error.message)
                break
            if made is None:
                break  # the tenant's quota is used up
            report.created.append(made.vm_name)
    return report


def refill_held(*, pool: LabPool, now: datetime) -> bool:
    """Whether the pool's class is arriving (claims began recently): the refill waits so their Starts go first."""
    if settings.POOL_REFILL_HOLD_SECONDS <= 0:
        return False
    vms = PoolVm.objects.filter(pool=pool)
    latest = vms.aggregate(claimed=Max("claimed_at"), created=Max("created_at"))
    if latest["claimed"] is None or latest["claimed"] <= now - timedelta(seconds=settings.POOL_REFILL_HOLD_SECONDS):
        return False
    since = vms.filter(claimed_at__gt=latest["created"]) if latest["created"] else vms
    first = since.aggregate(first=Min("claimed_at"))["first"]
    return first is not None and first > now - timedelta(seconds=settings.POOL_REFILL_HOLD_MAX_SECONDS)


def pool_vm_create(*, pool: LabPool) -> PoolVm | None:
    """Make one pool VM within the quota (else None); its row first, so the sweep never takes it as an orphan."""
    from guest.cloud_init import render_user_data

    lab = pool.lab
    tenant = lab.course.tenant
    guest = guest_resources(lab.size)
    launcher = launcher_requests(vcpus=guest.vcpus, memory_mib=guest.memory_mib)
    with transaction.atomic():
        locked = Tenant.objects.select_for_update(no_key=True).get(id=tenant.id)
        totals = tenant_totals(tenant_id=tenant.id, student=None)
        if quota_refusal(tenant=locked, used=totals, vcpus=guest.vcpus, memory_mib=launcher.memory_mib) is not None:
            return None
        pool_vm = PoolVm.objects.create(
            pool=pool,
            tenant=tenant,
            lab=lab,
            namespace=tenant.namespace,
            agent_token=secrets.token_urlsafe(32),
            recipe=pool_vm_recipe(lab),
            vcpus=guest.vcpus,
            memory_mib=guest.memory_mib,
            launcher_memory_mib=launcher.memory_mib,
        )
        pool_vm.vm_name = names.pool_vm_name(pool_vm.id)
        PoolVm.objects.filter(id=pool_vm.id).update(vm_name=pool_vm.vm_name)
    try:
        user_data = render_user_data(token=pool_vm.agent_token, extra_cloud_config=lab.extra_cloud_init)
        lab_vm_create(owner=pool_vm, user_data=user_data)
    except (ClusterError, ValueError):
        pool_vm_end(pool_vm=pool_vm, reason=EndReason.CREATE_FAILED)
        raise
    return pool_vm


def pool_vm_end(
    *,
    pool_vm: PoolVm,
    reason: str,
    from_states: tuple[str, ...] = POOL_HOLDING_STATES,
    report: PoolReport | None = None,
    problem: dict[str, str] | None = None,
) -> bool:
    """Take a VM out of the pool (freeing its quota at once) and delete it; False if it left ``from_states``."""
    problem = problem or pool_vm.problem_texts
    ended = PoolVm.objects.filter(id=pool_vm.id, state__in=from_states).update(
        state=PoolVmState.DELETED, ended_at=timezone.now(), end_reason=reason, attempt=None, problem_texts=problem
    )
    if not ended:
        return False
    pool_vm.state = PoolVmState.DELETED
    said = in_language(problem, "", settings.LANGUAGE_CODE)
    logger.info("pool VM %s/%s ended: %s%s", pool_vm.namespace, pool_vm.vm_name, reason, f" ({said})" if said else "")
    if report is not None:
        report.deleted.append(pool_vm.vm_name)
    pool_vm_delete_on_cluster(pool_vm=pool_vm)
    return True


def pool_vm_delete_on_cluster(*, pool_vm: PoolVm) -> None:
    """Delete an ended pool VM's VM and Secret; a cluster that does not answer leaves them to the sweep."""
    if not pool_vm.vm_name:
        return
    try:
        operations.vm_and_secret_delete(namespace=pool_vm.namespace, name=pool_vm.vm_name)
    except ClusterError as error:
        logger.warning("pool VM %s: delete failed (%s); the sweep removes it", pool_vm.vm_name, error.message)


def pool_vms_check(*, now: datetime | None = None) -> PoolReport:
    """Replace the pool VMs that ended, lost their agent or never booted; a booting one whose agent answers is ready."""
    now = now or timezone.now()
    report = PoolReport()
    vms = list(PoolVm.objects.filter(state__in=POOL_HOLDING_STATES).exclude(vm_name=""))
    if not vms:
        return report
    # One VMI list per namespace, a VM list only where a VMI is missing; no answer gives no verdict.
    by_namespace: dict[str, list[PoolVm]] = {}
    for pool_vm in vms:
        by_namespace.setdefault(pool_vm.namespace, []).append(pool_vm)
    for namespace, members in by_namespace.items():
        try:
            vmis = {vmi["metadata"]["name"]: vmi for vmi in operations.vmis_list(namespace=namespace)}
            missing = [pool_vm for pool_vm in members if pool_vm.vm_name not in vmis]
            listed = {vm["metadata"]["name"] for vm in operations.vms_list(namespace=namespace)} if missing else set()
        except ClusterError as error:
            report.errors.append(error.message)
            continue
        for pool_vm in members:
            vmi = vmis.get(pool_vm.vm_name)
            if vmi is None and pool_vm.vm_name not in listed:
                pool_vm_end(pool_vm=pool_vm, reason=EndReason.VM_GONE, report=report)
            elif vmi is not None and (
                vmi["metadata"].get("deletionTimestamp") or (vmi.get("status") or {}).get("phase") in FINAL_PHASES
            ):
                pool_vm_end(pool_vm=pool_vm, reason=EndReason.VMI_ENDED, report=report, problem=_problem_texts(vmi))
            elif pool_vm.state == PoolVmState.BOOTING:
                # Kept for the operations page while it boots: the pool waits (kubelet retries a pull by itself).
                problem = _problem_texts(vmi) if vmi is not None else {}
                if problem != pool_vm.problem_texts:
                    PoolVm.objects.filter(id=pool_vm.id).update(problem_texts=problem)
                    pool_vm.problem_texts = problem
    due = now - timedelta(seconds=settings.POOL_READY_CHECK_SECONDS)
    asked = [
        pool_vm
        for pool_vm in vms
        if pool_vm.state in POOL_HOLDING_STATES
        and (pool_vm.state == PoolVmState.BOOTING or pool_vm.checked_at is None or pool_vm.checked_at <= due)
    ]
    if not asked:
        return report
    answers = agents_answer(asked)
    PoolVm.objects.filter(id__in=[pool_vm.id for pool_vm in asked]).update(checked_at=timezone.now())
    boot_limit = now - timedelta(seconds=settings.ATTEMPT_START_TIMEOUT_SECONDS)
    for pool_vm, answers_now in zip(asked, answers, strict=True):
        if pool_vm.state == PoolVmState.BOOTING and answers_now:
            ready = PoolVm.objects.filter(id=pool_vm.id, state=PoolVmState.BOOTING)
            if ready.update(state=PoolVmState.READY, ready_at=timezone.now()):
                report.ready.append(pool_vm.vm_name)
        elif not answers_now and (pool_vm.state == PoolVmState.READY or pool_vm.created_at < boot_limit):
            reason = EndReason.AGENT_LOST if pool_vm.state == PoolVmState.READY else EndReason.BOOT_TIMEOUT
            pool_vm_end(pool_vm=pool_vm, reason=reason, from_states=(pool_vm.state,), report=report)
    return report


def _problem_texts(vmi: dict) -> dict[str, str]:
    """What the cluster says keeps the VMI from running, in each language; empty when it says nothing."""
    texts = in_every_language(partial(_problem_words, vmi))
    return texts if any(texts.values()) else {}


def _problem_words(vmi: dict) -> str:
    return status.observe_vmi(vmi).problem


PRUNE_BATCH = 1000


def pool_vms_prune(*, now: datetime | None = None) -> int:
    """Delete up to ``PRUNE_BATCH`` long-ended pool VM rows, their figures kept on their pools; how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.POOL_VM_RETENTION_DAYS)
    ended = Q(state=PoolVmState.DELETED, ended_at__lt=cutoff) | Q(
        Q(attempt__isnull=True) | Q(attempt__state__in=FINAL_STATES), state=PoolVmState.CLAIMED, claimed_at__lt=cutoff
    )
    with transaction.atomic():
        rows = list(
            PoolVm.objects.select_for_update(of=("self",))
            .filter(ended)
            .order_by("id")
            .only("id", "pool_id", "state", "created_at", "claimed_at", "ended_at", "attempt_id")[:PRUNE_BATCH]
        )
        if not rows:
            return 0
        figures: dict[int, tuple[int, float]] = {}
        for row in rows:
            hits, idle = figures.get(row.pool_id, (0, 0.0))
            figures[row.pool_id] = (hits + (row.state == PoolVmState.CLAIMED), idle + row.idle_seconds(now))
        for pool_id, (hits, idle) in figures.items():
            LabPool.objects.filter(id=pool_id).update(
                pruned_hits=F("pruned_hits") + hits, pruned_idle_seconds=F("pruned_idle_seconds") + idle
            )
        PoolVm.objects.filter(id__in=[row.id for row in rows]).delete()
    logger.info("pruned %d pool VM rows ended more than %d days ago", len(rows), settings.POOL_VM_RETENTION_DAYS)
    return len(rows)
