"""Ending attempts: a person's stop and extension, the time limit, the stop when no page has it open, the teardown."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone
from django.utils.translation import gettext as _

from labs.kubevirt import operations
from labs.models import ACTIVE_STATES, FINAL_STATES, IDLE_STOP_MIN_MINUTES, Attempt, AttemptState
from labs.services.events import attempt_push_on_commit, on_commit_logged
from labs.signals import attempt_final_grading
from labs.states import attempt_transition
from portal.errors import Conflict, NotFound, PermissionDenied
from portal.models import Role, User
from portal.selectors import course_role
from portal.services import audit_record

logger = logging.getLogger(__name__)

# How often a page's events socket stamps its open attempt as seen (well under IDLE_STOP_MIN_MINUTES).
PRESENCE_STAMP_SECONDS = 60
# A last stamp older than this means no page has the attempt open now (one stamp missed, and a margin).
PRESENCE_LOST_AFTER_SECONDS = 2 * PRESENCE_STAMP_SECONDS + 30
# Set once a final grading returned, so the teardown's own retry is not taken for a second delivery still grading.
FINAL_GRADING_DONE_KEY = "labs:final-grading-done:{attempt_id}"


class StopReason:
    STUDENT = "student"
    STAFF = "staff"
    EXPIRED = "expired"
    LEFT = "left"  # no page of the student had it open for the lab's ``idle_stop_minutes``


def enqueue_teardown(attempt_id: int) -> None:
    from labs.tasks import teardown_attempt

    on_commit_logged(lambda: teardown_attempt.delay(attempt_id), what=f"queueing teardown of {attempt_id}")


def _require_student_or_instructor(*, actor: User, attempt: Attempt, refusal: str) -> str:
    """The actor's standing for changing the attempt: its student, or an instructor of its course."""
    if attempt.student_id == actor.pk:
        return StopReason.STUDENT
    role = course_role(user=actor, course=attempt.lab.course)
    if role is None:
        raise NotFound(_("Attempt not found."))
    if role != Role.INSTRUCTOR:
        raise PermissionDenied(refusal)
    return StopReason.STAFF


def attempt_stop(*, actor: User, attempt: Attempt) -> Attempt:
    """Stop the attempt (one already stopping is left as it is)."""
    standing = _require_student_or_instructor(
        actor=actor, attempt=attempt, refusal=_("Only the student or an instructor can stop this lab.")
    )
    with transaction.atomic():
        locked = Attempt.objects.select_for_update(of=("self",)).select_related("lab__course").get(pk=attempt.pk)
        if locked.state == AttemptState.STOPPING:
            return locked
        if locked.state not in ACTIVE_STATES:
            raise Conflict(_("This attempt has already ended."), code="attempt_ended")
        audit_record(
            actor=actor,
            action="attempt.stop",
            target=locked,
            tenant=locked.tenant,
            course=locked.lab.course,
            data={"from": locked.state, "by": standing},
        )
        _begin_stopping(locked, reason=standing, now=timezone.now())
    return locked


def _begin_stopping(locked: Attempt, *, reason: str, now: datetime) -> None:
    """On the attempt row the caller locked: ``stopping`` from now, for ``reason``, and the teardown queued."""
    attempt_transition(
        attempt=locked, to=AttemptState.STOPPING, from_states=(locked.state,), now=now, stop_reason=reason
    )
    enqueue_teardown(locked.id)


def attempt_extend(*, actor: User, attempt: Attempt) -> Attempt:
    """Add ``ATTEMPT_EXTEND_MINUTES`` to a running attempt's time limit, at most ``ATTEMPT_MAX_EXTENSIONS`` times."""
    _require_student_or_instructor(
        actor=actor, attempt=attempt, refusal=_("Only the student or an instructor can extend this lab.")
    )
    with transaction.atomic():
        locked = Attempt.objects.select_for_update(of=("self",)).select_related("lab__course").get(pk=attempt.pk)
        if locked.state != AttemptState.RUNNING or locked.expires_at is None:
            raise Conflict(_("Only a running lab can be extended."), code="not_running")
        limit = settings.ATTEMPT_MAX_EXTENSIONS
        if locked.extensions >= limit:
            raise Conflict(
                _("This lab has already been extended %(limit)d times, the most allowed.") % {"limit": limit},
                code="extension_limit",
            )
        previous = locked.expires_at
        locked.expires_at = previous + timedelta(minutes=settings.ATTEMPT_EXTEND_MINUTES)
        locked.extensions += 1
        locked.save(update_fields=["expires_at", "extensions", "updated_at"])
        audit_record(
            actor=actor,
            action="attempt.extend",
            target=locked,
            tenant=locked.tenant,
            course=locked.lab.course,
            data={"from": previous.isoformat(), "to": locked.expires_at.isoformat(), "extensions": locked.extensions},
        )
        attempt_push_on_commit(attempt=locked)
    return locked


def attempt_stop_left(*, attempt: Attempt, now: datetime) -> Attempt:
    """Stop the running attempt if no page has had it open for its lab's ``idle_stop_minutes`` (reason ``left``)."""
    with transaction.atomic():
        locked = Attempt.objects.select_for_update(of=("self",)).select_related("lab").get(pk=attempt.pk)
        limit = locked.lab.idle_stop_minutes
        since = attempt_left_since(locked)
        if locked.state != AttemptState.RUNNING or not limit or since is None or since > now - timedelta(minutes=limit):
            return locked
        _begin_stopping(locked, reason=StopReason.LEFT, now=now)
    logger.info("attempt %s stopped: no page had it open for %s minutes", locked.id, limit)
    return locked


def attempt_expire(*, attempt: Attempt) -> Attempt:
    """Stop the running attempt if its time is up and was not extended meanwhile (reason ``expired``)."""
    now = timezone.now()
    with transaction.atomic():
        locked = Attempt.objects.select_for_update().get(pk=attempt.pk)
        if locked.state != AttemptState.RUNNING or locked.expires_at is None or locked.expires_at > now:
            return locked
        _begin_stopping(locked, reason=StopReason.EXPIRED, now=now)
    return locked


def attempts_expire_due(*, now: datetime | None = None) -> int:
    """Expire running attempts whose time is up (database only; their teardown is queued)."""
    due = Attempt.objects.filter(state=AttemptState.RUNNING, expires_at__lte=now or timezone.now()).only("id")
    return sum(attempt_expire(attempt=attempt).state == AttemptState.STOPPING for attempt in due)


def attempts_stop_left(*, now: datetime | None = None) -> int:
    """Stop the running attempts no page has had open for their lab's ``idle_stop_minutes``."""
    now = now or timezone.now()
    candidates = (
        Attempt.objects.filter(state=AttemptState.RUNNING, lab__idle_stop_minutes__gt=0)
        .annotate(left_since=Greatest(Coalesce(F("last_seen_at"), F("agent_ready_at")), F("agent_ready_at")))
        .filter(left_since__lte=now - timedelta(minutes=IDLE_STOP_MIN_MINUTES))
        .select_related("lab")
        .only("id", "last_seen_at", "agent_ready_at", "lab__idle_stop_minutes")
    )
    return sum(
        attempt_stop_left(attempt=attempt, now=now).state == AttemptState.STOPPING
        for attempt in candidates
        if (since := attempt_left_since(attempt)) and since <= now - timedelta(minutes=attempt.lab.idle_stop_minutes)
    )


def attempt_end(*, attempt_id: int) -> bool:
    """A stopping attempt whose VM is gone ends: ``expired`` if its time ran out, ``stopped`` otherwise."""
    attempt = Attempt.objects.filter(id=attempt_id, state=AttemptState.STOPPING).first()
    if attempt is None:
        return False
    final = AttemptState.EXPIRED if attempt.stop_reason == StopReason.EXPIRED else AttemptState.STOPPED
    ended = attempt_transition(
        attempt=attempt, to=final, from_states=(AttemptState.STOPPING,), status_message="", status_message_texts={}
    )
    return ended is not None


def attempt_seen(*, attempt_id: int) -> bool:
    """A page of the student has the attempt open now (its events socket); False once the attempt has ended."""
    return bool(Attempt.objects.filter(id=attempt_id, state__in=ACTIVE_STATES).update(last_seen_at=timezone.now()))


def attempt_stops_as_left_at(attempt: Attempt, *, idle_stop_minutes: int, now: datetime) -> datetime | None:
    """When the running attempt will be stopped as left, while no page has it open (for the dashboard); else None."""
    since = attempt_left_since(attempt)
    if attempt.state != AttemptState.RUNNING or not idle_stop_minutes or since is None:
        return None
    if (now - since).total_seconds() < PRESENCE_LOST_AFTER_SECONDS:
        return None
    return since + timedelta(minutes=idle_stop_minutes)


def attempt_left_since(attempt: Attempt) -> datetime | None:
    """Since when no page has had the attempt open (its last stamp or its agent's answer); None until it runs."""
    stamps = [stamp for stamp in (attempt.last_seen_at, attempt.agent_ready_at) if stamp is not None]
    return max(stamps) if attempt.agent_ready_at is not None else None


def grade_final(*, attempt: Attempt, trigger: str) -> None:
    """The grading app's last run before the VM goes; never raises (a grading failure must not keep a VM alive)."""
    for _receiver, outcome in attempt_final_grading.send_robust(sender=Attempt, attempt=attempt, trigger=trigger):
        if isinstance(outcome, Exception):
            logger.error(
                "attempt %s: the final grading run failed; deleting its VM anyway", attempt.id, exc_info=outcome
            )


def attempt_teardown(*, attempt_id: int) -> str:
    """Grade a stopping attempt once more if its agent answered, then delete its VM (a failed one's too); rerunnable."""
    attempt = Attempt.objects.select_related("lab").filter(id=attempt_id).first()
    if attempt is None:
        return "missing"
    if attempt.state == AttemptState.STOPPING:
        if attempt.agent_ready_at is not None and attempt.vm_deleted_at is None:
            done_key = FINAL_GRADING_DONE_KEY.format(attempt_id=attempt_id)
            claimed = Attempt.objects.filter(id=attempt_id, final_grading_at__isnull=True).update(
                final_grading_at=timezone.now()
            )
            if claimed:
                grade_final(attempt=attempt, trigger="expiry" if attempt.stop_reason == StopReason.EXPIRED else "stop")
                cache.set(done_key, "1", timeout=settings.CELERY_TASK_TIME_LIMIT + 60)
            elif (
                Attempt.objects.filter(
                    id=attempt_id,
                    vm_deleted_at__isnull=True,
                    final_grading_at__gt=timezone.now() - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT),
                ).exists()
                and cache.get(done_key) is None
            ):
                # A second delivery of this teardown while the first grades: deleting the VM now would cut that
                # final run off. The first deletes it; if it died, the sweep queues the teardown again later.
                return "grading_elsewhere"
        existed = _delete_vm_and_secret(attempt)
        if not existed:
            attempt_end(attempt_id=attempt_id)
        return "deleted" if existed else "ended"
    if attempt.state in FINAL_STATES and attempt.vm_deleted_at is None and attempt.vm_name:
        _delete_vm_and_secret(attempt)
        return "cleaned"
    return "skipped"


def teardowns_resume(*, namespace: str) -> int:
    """The namespace answers again after failing: queue its stopping attempts' teardowns now, not at their retry."""
    ids = list(
        Attempt.objects.filter(
            namespace=namespace, state=AttemptState.STOPPING, vm_deleted_at__isnull=True
        ).values_list("id", flat=True)
    )
    for attempt_id in ids:
        enqueue_teardown(attempt_id)
    if ids:
        logger.info("cluster answers again in %s: teardown of %s resumed", namespace, ids)
    return len(ids)


def _delete_vm_and_secret(attempt: Attempt) -> bool:
    existed = operations.vm_and_secret_delete(namespace=attempt.namespace, name=attempt.vm_name)
    Attempt.objects.filter(id=attempt.id, vm_deleted_at__isnull=True).update(vm_deleted_at=timezone.now())
    return existed
