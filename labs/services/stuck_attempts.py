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
from labs.services.provisioning import attempt_fail
from labs.services.stopping import attempt_end
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
    """Queue again the provisioning of attempts long ``requested``; fail those unserved after the start timeout."""
    from labs.tasks import provision_attempt

    timeout = settings.ATTEMPT_START_TIMEOUT_SECONDS
    given_up = now - timedelta(seconds=timeout)

    def reason() -> str:
        return _(
            "The lab did not start: the portal's task queue did not pick it up within %(minutes)d minutes. "
            "Start it again; this attempt does not count against your limit."
        ) % {"minutes": max(1, timeout // 60)}

    requested = Attempt.objects.filter(state=AttemptState.REQUESTED).values_list("id", flat=True)
    for attempt_id in requested.filter(requested_at__lt=given_up):
        _fail(attempt_id, into=report.timed_out, reason=reason, from_states=(AttemptState.REQUESTED,))
    for attempt_id in requested.filter(requested_at__lt=now - timedelta(seconds=provision_redelivery_seconds())):
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


def _fail(attempt_id: int, *, into: list[int], reason: Callable[[], str], from_states: tuple[str, ...]) -> None:
    if attempt_fail(attempt_id=attempt_id, reason=reason, from_states=from_states):
        into.append(attempt_id)


def attempt_sweep(
    *, attempt: Attempt, vm: dict[str, Any] | None, listed_at: datetime, now: datetime, report: SweepReport
) -> None:
    from labs.tasks import provision_attempt, teardown_attempt

    timeout = settings.ATTEMPT_START_TIMEOUT_SECONDS
    timed_out = attempt.requested_at < now - timedelta(seconds=timeout)
    stale = now - timedelta(seconds=provision_redelivery_seconds())
    if attempt.state == AttemptState.PROVISIONING:
        if timed_out:  # queued again sweep after sweep and still not through: say so instead of retrying for ever
            _fail(
                attempt.id,
                into=report.timed_out,
                reason=lambda: _start_timed_out(timeout),
                from_states=(AttemptState.PROVISIONING,),
            )
        elif attempt.updated_at < stale:
            _queue_again(provision_attempt, attempt.id, report=report)  # a worker died mid-provision
    elif attempt.state in (AttemptState.STARTING, AttemptState.RUNNING):
        if vm is None and attempt.provisioned_at is not None and attempt.provisioned_at < listed_at:
            _fail(
                attempt.id,
                into=report.vanished,
                reason=lambda: _("The VM was deleted outside the portal."),
                from_states=(AttemptState.STARTING, AttemptState.RUNNING),
            )
        elif attempt.state == AttemptState.STARTING and timed_out:
            detail = start_failure_detail(attempt=attempt, vm_listed=vm is not None)
            _fail(
                attempt.id,
                into=report.timed_out,
                reason=lambda: with_cluster_words(_start_timed_out(timeout), detail()),
                from_states=(AttemptState.STARTING,),
            )
    elif attempt.state == AttemptState.STOPPING and vm is None:
        # With no deletion asked for yet, the teardown (queued or lost) finishes the bookkeeping unless long stale.
        if attempt.vm_deleted_at is not None or (attempt.stopping_at and attempt.stopping_at < stale):
            if attempt_end(attempt_id=attempt.id):
                report.ended.append(attempt.id)
    elif attempt.state == AttemptState.STOPPING and vm is not None:
        since = attempt.vm_deleted_at or attempt.stopping_at
        lost = since is not None and since < now - timedelta(seconds=teardown_redelivery_seconds())
        if lost and not (vm.get("metadata") or {}).get("deletionTimestamp"):
            _queue_again(teardown_attempt, attempt.id, report=report)


def _start_timed_out(timeout: int) -> str:
    return _("The VM did not start within %(minutes)d minutes.") % {"minutes": max(1, timeout // 60)}


def start_failure_detail(*, attempt: Attempt, vm_listed: bool) -> Callable[[], str]:
    """What the cluster says about a VM that would not start, read once, as a function wording it in any language."""
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
