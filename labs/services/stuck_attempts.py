"""The sweep's judgement of active attempts and of work whose task was lost: queued again, failed after the start
timeout with what the cluster says, or ended once the VM is gone."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils.translation import gettext as _

from labs.kubevirt import explain, operations, status
from labs.kubevirt.operations import ClusterError
from labs.models import Attempt, AttemptState
from labs.services.provisioning import attempt_end, attempt_fail
from labs.wording import with_cluster_words

if TYPE_CHECKING:
    from labs.services.sweeping import SweepReport

logger = logging.getLogger(__name__)


def provision_redelivery_seconds() -> int:
    """How long provisioning may look stuck before it is queued again: past the task's hard time limit."""
    return max(60, settings.ATTEMPT_TASK_SOFT_TIME_LIMIT_SECONDS + 60)


def teardown_redelivery_seconds() -> int:
    """A teardown grades first (up to the checks' timeouts), so it is given the whole task time limit."""
    return max(120, settings.CELERY_TASK_TIME_LIMIT + 60)


def requeue_requested(*, report: SweepReport, now: datetime) -> None:
    """Queue the provisioning of attempts still ``requested`` long after they were made again; fail those still
    unserved after the start timeout."""
    from labs.tasks import provision_attempt

    timeout = settings.ATTEMPT_START_TIMEOUT_SECONDS
    given_up = now - timedelta(seconds=timeout)

    def reason() -> str:
        return _(
            "The lab did not start: the portal's task queue did not pick it up within %(minutes)d minutes. "
            "Start it again; this attempt does not count against your limit."
        ) % {"minutes": max(1, timeout // 60)}

    for attempt_id in Attempt.objects.filter(state=AttemptState.REQUESTED, requested_at__lt=given_up).values_list(
        "id", flat=True
    ):
        if attempt_fail(attempt_id=attempt_id, reason=reason, from_states=(AttemptState.REQUESTED,)):
            report.timed_out.append(attempt_id)
    cutoff = now - timedelta(seconds=provision_redelivery_seconds())
    for attempt_id in Attempt.objects.filter(state=AttemptState.REQUESTED, requested_at__lt=cutoff).values_list(
        "id", flat=True
    ):
        _queue_again(provision_attempt, attempt_id, report=report)


def _queue_again(task: Any, attempt_id: int, *, report: SweepReport) -> None:
    """Send ``task`` for the attempt once more; a broker that refuses is reported, and the next sweep tries again."""
    try:
        task.delay(attempt_id)
    except Exception as exc:
        report.errors.append(f"could not queue {task.name} for attempt {attempt_id}: {exc}")
        logger.warning("sweep: could not queue %s for attempt %s", task.name, attempt_id, exc_info=True)
        return
    report.requeued.append(attempt_id)


def attempt_sweep(
    *, attempt: Attempt, vm: dict[str, Any] | None, listed_at: datetime, now: datetime, report: SweepReport
) -> None:
    from labs.tasks import provision_attempt, teardown_attempt

    provision_cutoff = now - timedelta(seconds=provision_redelivery_seconds())
    if attempt.state == AttemptState.PROVISIONING:
        timeout = settings.ATTEMPT_START_TIMEOUT_SECONDS
        if attempt.requested_at < now - timedelta(seconds=timeout):
            # Queued again sweep after sweep and still not through: say so instead of retrying for ever.
            if attempt_fail(
                attempt_id=attempt.id,
                reason=lambda: _start_timed_out(timeout),
                from_states=(AttemptState.PROVISIONING,),
            ):
                report.timed_out.append(attempt.id)
        elif attempt.updated_at < provision_cutoff:
            _queue_again(provision_attempt, attempt.id, report=report)  # a worker died mid-provision
        return
    if attempt.state in (AttemptState.STARTING, AttemptState.RUNNING):
        made_before_list = attempt.provisioned_at is not None and attempt.provisioned_at < listed_at
        if vm is None and made_before_list:
            if attempt_fail(
                attempt_id=attempt.id,
                reason=lambda: _("The VM was deleted outside the portal."),
                from_states=(AttemptState.STARTING, AttemptState.RUNNING),
            ):
                report.vanished.append(attempt.id)
            return
        timeout = settings.ATTEMPT_START_TIMEOUT_SECONDS
        if attempt.state == AttemptState.STARTING and attempt.requested_at < now - timedelta(seconds=timeout):
            detail = start_failure_detail(attempt=attempt, vm_listed=vm is not None)

            def reason() -> str:
                return with_cluster_words(_start_timed_out(timeout), detail())

            if attempt_fail(attempt_id=attempt.id, reason=reason, from_states=(AttemptState.STARTING,)):
                report.timed_out.append(attempt.id)
        return
    if attempt.state == AttemptState.STOPPING:
        if vm is None:
            if attempt.vm_deleted_at is None:
                # Nothing to grade or delete; let the teardown (queued or lost) finish the bookkeeping.
                stale = now - timedelta(seconds=provision_redelivery_seconds())
                if attempt.stopping_at and attempt.stopping_at < stale and attempt_end(attempt_id=attempt.id):
                    report.ended.append(attempt.id)
                return
            if attempt_end(attempt_id=attempt.id):
                report.ended.append(attempt.id)
            return
        teardown_cutoff = now - timedelta(seconds=teardown_redelivery_seconds())
        since = attempt.vm_deleted_at or attempt.stopping_at
        if since is not None and since < teardown_cutoff and not (vm.get("metadata") or {}).get("deletionTimestamp"):
            _queue_again(teardown_attempt, attempt.id, report=report)


def _start_timed_out(timeout: int) -> str:
    return _("The VM did not start within %(minutes)d minutes.") % {"minutes": max(1, timeout // 60)}


def start_failure_detail(*, attempt: Attempt, vm_listed: bool) -> Callable[[], str]:
    """What the cluster says about a VM that would not start (its status, the last problem, Warning events), asked
    once, as a function wording it in the active language."""
    vm = None
    if vm_listed:
        try:
            vm = operations.vm_get(namespace=attempt.namespace, name=attempt.vm_name)
        except ClusterError as error:
            logger.info("attempt %s: VM status unavailable (%s)", attempt.id, error.message)
    events = explain.events_said(namespace=attempt.namespace, name=attempt.vm_name)

    def detail() -> str:
        parts = []
        problem = status.vm_problem(vm)
        if problem:
            parts.append(problem)
        message = attempt.status_message_shown
        if message and message not in parts:
            parts.append(message)
        if events:
            parts.append(events)
        if not parts and vm is not None:
            printable = (vm.get("status") or {}).get("printableStatus")
            if printable:
                parts.append(_("the VM's status is %(status)s") % {"status": printable})
        return " ".join(parts)

    return detail
