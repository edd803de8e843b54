"""Following the cluster: one list of VMIs per namespace, mapped onto that namespace's attempts.

The cost is per namespace, never per attempt. A namespace with an attempt starting or stopping is listed on every
sync; one where everything runs steadily only every ``ATTEMPT_RESYNC_SECONDS`` (in steady state nothing changes
but failures, which that catches, and deletions, which the sweep catches). The only per-attempt requests are the
guest agent's health checks while an attempt boots: ``running`` means the agent answered, not just the VMI.

Status derivation follows the cluster: no VMI yet means still starting; a stopping attempt ends when its VMI is
gone; a VMI that is Failed fails the attempt with the cluster's reason; a VM that cannot be scheduled or cannot pull
its image fails the attempt once that has lasted ``ATTEMPT_FAILURE_GRACE_SECONDS``.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from labs.kubevirt import operations, status
from labs.kubevirt.operations import ClusterError
from labs.models import Attempt, AttemptState, TenantNamespace
from labs.services.attempts import attempt_expire
from labs.services.events import attempt_push_on_commit
from labs.services.provisioning import attempt_end, attempt_fail, attempt_mark_running

logger = logging.getLogger(__name__)

TRACKED_STATES = (AttemptState.PROVISIONING, AttemptState.STARTING, AttemptState.RUNNING, AttemptState.STOPPING)
MOVING_STATES = (AttemptState.PROVISIONING, AttemptState.STARTING, AttemptState.STOPPING)
AGENT_CHECK_TIMEOUT_SECONDS = 3.0
AGENT_CHECK_CONCURRENCY = 8


def start_again_hint() -> str:
    return _("You can start the lab again; a failed attempt does not count against your attempt limit.")


@dataclass
class SyncReport:
    namespaces: list[str] = field(default_factory=list)
    changed: int = 0
    failed: int = 0
    ended: int = 0
    running: int = 0
    expired: int = 0
    errors: list[str] = field(default_factory=list)

    def merge(self, other: SyncReport) -> None:
        self.namespaces += other.namespaces
        for name in ("changed", "failed", "ended", "running", "expired"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors += other.errors


def attempts_expire_due(*, now: datetime | None = None) -> int:
    """Expire running attempts whose time is up (database only; their teardown is queued)."""
    now = now or timezone.now()
    expired = 0
    for attempt in Attempt.objects.filter(state=AttemptState.RUNNING, expires_at__lte=now).only("id"):
        if attempt_expire(attempt=attempt).state == AttemptState.STOPPING:
            expired += 1
    return expired


def namespaces_due(*, now: datetime | None = None) -> list[str]:
    """Namespaces with tracked attempts that need listing now: any moving attempt, or a resync falling due."""
    now = now or timezone.now()
    rows = (
        Attempt.objects.filter(state__in=TRACKED_STATES)
        .values("namespace")
        .annotate(moving=Count("id", filter=Q(state__in=MOVING_STATES)))
    )
    moving = {row["namespace"]: row["moving"] for row in rows}
    listed = dict(TenantNamespace.objects.filter(namespace__in=list(moving)).values_list("namespace", "listed_at"))
    resync_before = now - timedelta(seconds=settings.ATTEMPT_RESYNC_SECONDS)
    return sorted(
        namespace for namespace, count in moving.items()
        if count or listed.get(namespace) is None or listed[namespace] <= resync_before
    )


def attempts_sync(*, now: datetime | None = None) -> SyncReport:
    """One pass: expire what is due, then list and map every namespace that is due."""
    now = now or timezone.now()
    report = SyncReport(expired=attempts_expire_due(now=now))
    for namespace in namespaces_due(now=now):
        try:
            report.merge(namespace_sync(namespace=namespace))
        except ClusterError as error:
            report.errors.append(error.message)
            TenantNamespace.objects.filter(namespace=namespace).update(
                last_error=error.message[:2000], last_error_at=timezone.now()
            )
            logger.warning("sync of %s failed: %s", namespace, error.message)
    return report


def namespace_sync(*, namespace: str) -> SyncReport:
    """List the namespace's VMIs once and bring each of its tracked attempts up to date."""
    report = SyncReport(namespaces=[namespace])
    if not Attempt.objects.filter(namespace=namespace, state__in=TRACKED_STATES).exists():
        return report
    vmis = operations.vmis_list(namespace=namespace)
    now = timezone.now()
    # Attempts are read after the list, so none is judged on a list older than its own last change.
    attempts = list(Attempt.objects.filter(namespace=namespace, state__in=TRACKED_STATES).select_related("lab"))
    TenantNamespace.objects.filter(namespace=namespace).update(listed_at=now, last_error="")
    by_name = {(vmi.get("metadata") or {}).get("name"): vmi for vmi in vmis}
    awaiting_agent = []
    for attempt in attempts:
        outcome = attempt_observe(attempt=attempt, vmi=by_name.get(attempt.vm_name), now=now)
        if outcome == Outcome.AWAITING_AGENT:
            awaiting_agent.append(attempt)
        elif outcome == Outcome.FAILED:
            report.failed += 1
        elif outcome == Outcome.ENDED:
            report.ended += 1
        elif outcome == Outcome.CHANGED:
            report.changed += 1
    for attempt_id in agents_answering(awaiting_agent):
        if attempt_mark_running(attempt_id=attempt_id):
            report.running += 1
    return report


class Outcome:
    UNCHANGED = "unchanged"
    CHANGED = "changed"
    FAILED = "failed"
    ENDED = "ended"
    AWAITING_AGENT = "awaiting_agent"


def _observed_changes(attempt: Attempt, observation: status.VmiObservation) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for phase, field_name in status.PHASE_FIELDS.items():
        when = observation.phase_times.get(phase)
        if when is not None and getattr(attempt, field_name) is None:
            changes[field_name] = when
    if observation.phase != attempt.phase:
        changes["phase"] = observation.phase
    if observation.node_name and observation.node_name != attempt.node_name:
        changes["node_name"] = observation.node_name
    if observation.uid and observation.uid != attempt.vmi_uid:
        changes["vmi_uid"] = observation.uid
    return changes


def _fail_restarted(attempt: Attempt) -> str:
    """The VMI the attempt followed ended after running and KubeVirt made a new one (runStrategy Always): the
    guest crashed or was shut down, and a containerDisk starts fresh, so the student's work is gone. The old
    VMI's reason survives only in Events, read here (a rare path, one request)."""
    reason = _("The VM stopped unexpectedly (it crashed or was shut down from inside) and was restarted from a "
               "fresh disk, so the work in it is lost.")
    try:
        detail = status.events_problem(operations.events_for(namespace=attempt.namespace, name=attempt.vm_name))
    except ClusterError as error:
        logger.info("attempt %s: events unavailable (%s)", attempt.id, error.message)
        detail = ""
    if detail:
        reason += " " + _("The cluster says: %(detail)s") % {"detail": detail}
    return Outcome.FAILED if attempt_fail(attempt_id=attempt.id, reason=reason) else Outcome.UNCHANGED


def attempt_observe(*, attempt: Attempt, vmi: dict[str, Any] | None, now: datetime) -> str:
    """Apply what the attempt's VMI (or its absence) says. Returns an :class:`Outcome`."""
    if attempt.state == AttemptState.STOPPING:
        if vmi is None and attempt.vm_deleted_at is not None:
            return Outcome.ENDED if attempt_end(attempt_id=attempt.id) else Outcome.UNCHANGED
        return Outcome.UNCHANGED
    if vmi is None:
        return Outcome.UNCHANGED  # no VMI yet: still starting; a VM gone altogether is the sweep's to judge

    observation = status.observe_vmi(vmi)
    if attempt.vmi_uid and observation.uid and observation.uid != attempt.vmi_uid and attempt.vmi_running_at:
        return _fail_restarted(attempt)
    changes = _observed_changes(attempt, observation)
    if attempt.state == AttemptState.PROVISIONING:
        # The VM exists but its provisioning never recorded it (a worker died after creating it).
        changes.update(state=AttemptState.STARTING, provisioned_at=attempt.provisioned_at or now)

    if observation.failed:
        _apply(attempt, changes)
        if attempt.state == AttemptState.RUNNING:
            reason = _("The VM stopped unexpectedly.") + " " + observation.problem
        else:
            reason = observation.problem + " " + start_again_hint()
        return Outcome.FAILED if attempt_fail(attempt_id=attempt.id, reason=reason) else Outcome.UNCHANGED

    if attempt.state != AttemptState.RUNNING:
        if observation.problem:
            since = observation.problem_since or now
            if (now - since).total_seconds() >= settings.ATTEMPT_FAILURE_GRACE_SECONDS:
                _apply(attempt, changes)
                reason = observation.problem + " " + start_again_hint()
                return Outcome.FAILED if attempt_fail(attempt_id=attempt.id, reason=reason) else Outcome.UNCHANGED
            message = observation.problem
        elif observation.running:
            message = _("The VM is running; waiting for the lab agent inside it to start.")
        else:
            message = ""
        if message != attempt.status_message:
            changes["status_message"] = message

    changed = _apply(attempt, changes)
    if observation.running and (changes.get("state") or attempt.state) == AttemptState.STARTING:
        return Outcome.AWAITING_AGENT
    return Outcome.CHANGED if changed else Outcome.UNCHANGED


def _apply(attempt: Attempt, changes: dict[str, Any]) -> bool:
    """Write ``changes`` if the attempt is still in the state it was read in; push the update on commit."""
    if not changes:
        return False
    with transaction.atomic():
        updated = Attempt.objects.filter(id=attempt.id, state=attempt.state).update(
            **changes, updated_at=timezone.now()
        )
        if not updated:
            return False
        for name, value in changes.items():
            setattr(attempt, name, value)
        attempt_push_on_commit(attempt=attempt)
    return True


def _agent_answers(attempt: Attempt) -> bool:
    from grading.agent_client import AgentError, healthz

    try:
        healthz(attempt, timeout_s=AGENT_CHECK_TIMEOUT_SECONDS)
    except AgentError as error:
        logger.debug("attempt %s: agent not ready yet (%s)", attempt.id, error.code)
        return False
    return True


def agents_answering(attempts: list[Attempt]) -> list[int]:
    """Ids of the attempts whose guest agent answers ``/healthz``, asked in parallel through portforward."""
    if not attempts:
        return []
    if len(attempts) == 1:
        return [attempts[0].id] if _agent_answers(attempts[0]) else []
    with ThreadPoolExecutor(max_workers=min(AGENT_CHECK_CONCURRENCY, len(attempts))) as pool:
        answers = list(pool.map(_agent_answers, attempts))
    return [attempt.id for attempt, ok in zip(attempts, answers, strict=True) if ok]
