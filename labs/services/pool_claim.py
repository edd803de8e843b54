"""How a Start takes a warm pool's VM (claimed in its transaction, finished by a task, else started cold), and the
pool giving way to a cold Start's quota."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from labs.kubevirt import names, operations, status
from labs.kubevirt.operations import ClusterError
from labs.models import Attempt, AttemptState, Lab
from labs.pool_models import POOL_HOLDING_STATES, PoolVm, PoolVmState, pool_vm_recipe
from labs.services.pools import EndReason, pool_vm_delete_on_cluster, pool_vm_end
from labs.services.quota import TenantTotals
from labs.states import attempt_transition

logger = logging.getLogger(__name__)


def pool_vm_claim(*, attempt: Attempt, lab: Lab, now: datetime) -> PoolVm | None:
    """In the Start's transaction: take the tenant's longest-ready pool VM of the lab's current recipe, or None."""
    pool_vm = (
        PoolVm.objects.select_for_update(skip_locked=True)
        .filter(lab=lab, tenant_id=attempt.tenant_id, state=PoolVmState.READY, recipe=pool_vm_recipe(lab))
        .order_by("ready_at", "id")
        .first()
    )
    if pool_vm is None:
        return None
    PoolVm.objects.filter(id=pool_vm.id).update(state=PoolVmState.CLAIMED, claimed_at=now, attempt=attempt)
    return pool_vm


def pool_give_way(*, tenant_id: int, totals: TenantTotals, fits) -> TenantTotals:
    """Under the tenant's lock: end unclaimed pool VMs (booting first) until ``fits``; the totals without them (their
    VMs are deleted once the Start commits)."""
    candidates = (
        PoolVm.objects.select_for_update(skip_locked=True)
        .filter(tenant_id=tenant_id, state__in=POOL_HOLDING_STATES)
        .order_by("state", "-id")  # "booting" sorts before "ready"
    )
    for pool_vm in candidates:
        if fits(totals):
            break
        PoolVm.objects.filter(id=pool_vm.id).update(
            state=PoolVmState.DELETED, ended_at=timezone.now(), end_reason=EndReason.GAVE_WAY
        )
        totals = totals._replace(
            vms=totals.vms - 1, vcpus=totals.vcpus - pool_vm.vcpus, memory=totals.memory - pool_vm.launcher_memory_mib
        )
        transaction.on_commit(partial(_gave_way, pool_vm))
    return totals


def _gave_way(pool_vm: PoolVm) -> None:
    logger.info("pool VM %s gave way to a cold start", pool_vm.vm_name)
    pool_vm_delete_on_cluster(pool_vm=pool_vm)


def pool_claim_finish(*, attempt_id: int) -> str:
    """Rotate the agent's token, label the VM, run the attempt; a transient ``ClusterError`` raises, else cold start."""
    from labs.agent_client import AgentError, AgentTokenRejected, healthz, rotate_token

    attempt = Attempt.objects.select_related("lab").filter(id=attempt_id, state=AttemptState.REQUESTED).first()
    if attempt is None:
        return "skipped"
    pool_vm = PoolVm.objects.filter(attempt_id=attempt_id, state=PoolVmState.CLAIMED).first()
    if pool_vm is None or pool_vm.vm_name != attempt.vm_name:
        return _start_cold(attempt=attempt, pool_vm=pool_vm, why="no claimed pool VM")
    try:
        try:
            rotate_token(pool_vm, new_token=attempt.agent_token)
        except AgentTokenRejected:
            healthz(attempt)  # a delivery before this one rotated it already
        vmi = operations.vm_label(
            namespace=pool_vm.namespace, name=pool_vm.vm_name, labels={names.ATTEMPT_LABEL: str(attempt.id)}
        )
    except AgentError as error:
        return _start_cold(attempt=attempt, pool_vm=pool_vm, why=error.message)
    except ClusterError as error:
        if error.transient:
            raise
        return _start_cold(attempt=attempt, pool_vm=pool_vm, why=error.message)
    if vmi is None:
        return _start_cold(attempt=attempt, pool_vm=pool_vm, why="the VM is gone")
    now = timezone.now()
    # What the sync would fill in from the VMI, recorded now: otherwise it pushes every claimed attempt a second time.
    seen = status.observe_vmi(vmi)
    phase_times: dict[str, Any] = {field: seen.phase_times.get(phase) for phase, field in status.PHASE_FIELDS.items()}
    running = attempt_transition(
        attempt=attempt,
        to=AttemptState.RUNNING,
        from_states=(AttemptState.REQUESTED,),
        now=now,
        provisioned_at=pool_vm.created_at,
        phase="Running",
        node_name=seen.node_name,
        vmi_uid=seen.uid,
        **phase_times,
        expires_at=now + timedelta(minutes=attempt.lab.time_limit_minutes),
    )
    # None: stopped meanwhile, and its teardown deletes the VM by its name.
    return "skipped" if running is None else "running"


def _start_cold(*, attempt: Attempt, pool_vm: PoolVm | None, why: str) -> str:
    """The claimed VM cannot be this attempt's: delete it and provision the attempt's own VM now."""
    from labs.tasks import provision_attempt

    logger.warning("attempt %s: claimed pool VM unusable (%s); starting it cold", attempt.id, why)
    if pool_vm is not None:
        pool_vm_end(pool_vm=pool_vm, reason=EndReason.CLAIM_FAILED, from_states=(PoolVmState.CLAIMED,))
    own = names.vm_name(attempt.id)
    if not Attempt.objects.filter(id=attempt.id, state=AttemptState.REQUESTED).update(vm_name=own):
        return "skipped"
    provision_attempt.delay(attempt.id)
    return "cold"
