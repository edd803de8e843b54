"""Lab-wide regrades: the request queues one (answered at once), a Celery task carries it out.

Regrading every attempt at a lab re-evaluates every counted run and may take long for a large class, so the
request only records a ``LabRegrade`` and sends ``grading.tasks.lab_regrade_execute`` after commit. The task
does the whole regrade, its audit record and the ``done`` state in one transaction on the locked row: a worker
that dies halfway leaves it ``queued`` for the redelivered message, and a message for a regrade already done
does nothing.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from grading.models import LabRegrade, RunState
from grading.services.grades import _require_course_staff, grading_regrade_lab
from labs.models import Attempt, AttemptState, Lab
from portal.errors import ApplicationError
from portal.models import STAFF_ROLES, User
from portal.selectors import course_role
from portal.services import audit_record

logger = logging.getLogger(__name__)

# A regrade still queued after this long lost its task message (broker restarted, worker gone for good); twice
# the task's hard time limit, so one being carried out (its row locked) or waiting behind another is left alone.
QUEUED_STALE_SECONDS = max(settings.GRADING_QUEUED_STALE_SECONDS, 2 * settings.CELERY_TASK_TIME_LIMIT)


def lab_regrade_attempts(*, lab: Lab) -> int:
    """Attempts a regrade of the lab works on: those with a scored run, and those still running."""
    return (
        Attempt.objects.filter(lab=lab)
        .filter(Q(runs__state=RunState.DONE) | Q(state=AttemptState.RUNNING))
        .distinct()
        .count()
    )


@transaction.atomic
def lab_regrade_request(*, actor: User, lab: Lab) -> tuple[LabRegrade, bool]:
    """Queue a regrade of every attempt at the lab. Course staff only; audited.

    Returns the regrade and whether it is new: while one is still queued for the lab, pressing again returns
    that one (it will use the checks as they are when it runs)."""
    _require_course_staff(actor=actor, lab=lab)
    Lab.objects.select_for_update().filter(pk=lab.pk).first()  # one queued regrade per lab, even on a double click
    lab_regrades_fail_stale(lab=lab)
    pending = LabRegrade.objects.filter(lab=lab, state=RunState.QUEUED).order_by("created_at", "id").first()
    if pending is not None:
        return pending, False
    regrade = LabRegrade.objects.create(lab=lab, requested_by=actor, attempts_requested=lab_regrade_attempts(lab=lab))
    audit_record(
        actor=actor,
        action="grading.lab_regrade_queued",
        target=lab,
        tenant=lab.course.tenant,
        course=lab.course,
        data={"lab_id": lab.pk, "lab_regrade_id": regrade.pk, "attempts": regrade.attempts_requested},
    )
    _enqueue_on_commit(regrade_id=regrade.pk)
    return regrade, True


def _enqueue_on_commit(*, regrade_id: int) -> None:
    from grading.tasks import lab_regrade_execute as task

    def send() -> None:
        try:
            task.delay(regrade_id)
        except Exception as exc:
            logger.exception("lab regrade %s could not be queued", regrade_id)
            _fail(regrade_id=regrade_id, error=f"the task queue refused the regrade: {type(exc).__name__}: {exc}")

    transaction.on_commit(send)


def lab_regrade_execute(*, regrade_id: int) -> LabRegrade | None:
    """Carry out a queued regrade. Returns None when it is not queued any more (done, failed, or gone)."""
    try:
        with transaction.atomic():
            regrade = (
                LabRegrade.objects.select_for_update(of=("self",))
                .select_related("lab__course__tenant", "requested_by")
                .filter(pk=regrade_id, state=RunState.QUEUED)
                .first()
            )
            if regrade is None:
                return None
            actor = regrade.requested_by
            if actor is None or course_role(user=actor, course=regrade.lab.course) not in STAFF_ROLES:
                raise ApplicationError("the person who asked for the regrade is no longer course staff")
            outcome = grading_regrade_lab(actor=actor, lab=regrade.lab)
            regrade.state = RunState.DONE
            regrade.attempts_regraded = outcome.attempts
            regrade.runs_reevaluated = outcome.reevaluated
            regrade.runs_queued = outcome.queued
            regrade.finished_at = timezone.now()
            regrade.save(
                update_fields=[
                    "state",
                    "attempts_regraded",
                    "runs_reevaluated",
                    "runs_queued",
                    "finished_at",
                ]
            )
            return regrade
    except ApplicationError as exc:  # e.g. the requester is no longer course staff
        return _fail(regrade_id=regrade_id, error=exc.message)
    except SoftTimeLimitExceeded:
        return _fail(regrade_id=regrade_id, error="the task's time limit was reached; nothing was changed")
    except Exception as exc:
        logger.exception("lab regrade %s failed", regrade_id)
        _fail(regrade_id=regrade_id, error=f"{type(exc).__name__}: {exc}; nothing was changed")
        raise


def _fail(*, regrade_id: int, error: str) -> LabRegrade | None:
    LabRegrade.objects.filter(pk=regrade_id, state=RunState.QUEUED).update(
        state=RunState.ERROR, error=error[:2000], finished_at=timezone.now()
    )
    return LabRegrade.objects.filter(pk=regrade_id).first()


def lab_regrades_fail_stale(*, lab: Lab | None = None, now=None) -> int:
    """Fail regrades queued so long that their task message was lost, so a new one can be asked for."""
    now = now or timezone.now()
    stale = LabRegrade.objects.filter(
        state=RunState.QUEUED, created_at__lt=now - timedelta(seconds=QUEUED_STALE_SECONDS)
    )
    if lab is not None:
        stale = stale.filter(lab=lab)
    return stale.update(state=RunState.ERROR, error="the regrade was never carried out", finished_at=now)
