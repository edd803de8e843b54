"""What people do to attempts: start, stop, extend; and the time limit ending one.

Starting is race-safe on PostgreSQL: the tenant's row is locked (``select_for_update``) and the quota counted
inside that transaction, so concurrent starts for the last slot are serialised and exactly one gets it; the
database's one-active-attempt constraint backs the per-student rule. Cluster work happens in Celery tasks queued
on commit. Refusals are ``ApplicationError`` subclasses with a message a student can act on, and a retry hint
when capacity is full (as JupyterHub answers 429 with a suggested wait).
"""

from __future__ import annotations

import functools
import logging
import secrets
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Count, Q
from django.utils import formats, timezone, translation
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from labs.kubevirt import names
from labs.models import ACTIVE_STATES, Attempt, AttemptState, Lab, extra_cloud_init_problem
from labs.selectors import STARTING_STATES
from labs.services.events import attempt_push_on_commit, on_commit_logged
from labs.sizes import guest_resources, launcher_requests
from labs.wording import in_every_language, in_language
from portal.compiled import FieldsUpdate
from portal.errors import ApplicationError, Conflict, NotFound, PermissionDenied, Unavailable, database_busy
from portal.models import Role, Tenant, User
from portal.ratelimit import rate_limit_hit, rate_limit_refund
from portal.selectors import course_role
from portal.services import audit_record
from portal.timezones import person_time_zone

logger = logging.getLogger(__name__)

# Suggested wait when capacity is full, in seconds (JupyterHub's spawn_throttle_retry_range).
RETRY_AFTER_RANGE = (30, 60)
# labs.models.Attempt's constraint: one active attempt per student and lab.
ONE_ACTIVE_CONSTRAINT = "attempt_one_active_per_student_lab"


class StopReason:
    STUDENT = "student"
    STAFF = "staff"
    EXPIRED = "expired"
    LEFT = "left"  # no page of the student had it open for the lab's ``idle_stop_minutes``


def retry_after_seconds() -> int:
    """A wait spread over the range so refused students do not all come back in the same second."""
    low, high = RETRY_AFTER_RANGE
    return low + secrets.randbelow(high - low + 1)


def _lab_closed_message(lab: Lab, now, *, actor) -> str:
    if lab.opens_at and now < lab.opens_at:
        # In the student's clock (their own, else the tenant's), even for an API client, whose requests are in UTC.
        zone = person_time_zone(actor, lab.course.tenant)
        return _("This lab opens on %(when)s.") % {"when": formats.date_format(
            timezone.localtime(lab.opens_at, zone), "DATETIME_FORMAT")}
    return _("This lab is closed.")


def _check_extra_cloud_init(lab: Lab) -> None:
    # The instructor's mistake is theirs to read (in admin, on the lab's page, and in the log), not the student's.
    if problem := extra_cloud_init_problem(lab.extra_cloud_init):
        logger.error("lab %s cannot start: its extra cloud-init is invalid: %s", lab.pk, problem)
        raise Conflict(
            _("This lab is misconfigured, so it cannot start. Your course staff see the problem on the lab's "
              "settings page."),
            code="lab_misconfigured",
        )


def _check_start_throttle() -> None:
    limit = settings.ATTEMPT_CONCURRENT_START_LIMIT
    if limit and _fetch("starting", list(STARTING_STATES))[0] >= limit:
        raise Unavailable(
            _("Many labs are starting right now. Try again in a minute."),
            code="too_many_starts", retry_after=retry_after_seconds(),
        )


def _per_student_refusal(*, running: int, stopping: int) -> Conflict:
    """The student already has as many labs going as the institution lets one person have: one must stop first
    (waiting alone would not help, so no Retry-After), or end, if it is stopping already."""
    if stopping:
        message = ngettext(
            "You already have %(count)d lab going, as many as your institution allows one person at once, and it is "
            "stopping: try again once it has ended.",
            "You already have %(count)d labs going, as many as your institution allows one person at once, and one "
            "of them is stopping: try again once it has ended.", running) % {"count": running}
    else:
        message = ngettext(
            "You already have %(count)d lab going, as many as your institution allows one person at once. Stop it "
            "to start this one.",
            "You already have %(count)d labs going, as many as your institution allows one person at once. Stop one "
            "of them to start this one.", running) % {"count": running}
    return Conflict(message, code="too_many_running")


def per_student_cap_message(*, student: User, tenant: Tenant) -> str:
    """What the lab page says instead of offering Start when the student already has as many labs going as the
    institution allows one person ('' when Start may be tried; ``attempt_start`` decides for real, under a lock)."""
    if not tenant.max_vms_per_student:
        return ""
    going = Attempt.objects.filter(student=student, tenant=tenant, state__in=ACTIVE_STATES).aggregate(
        running=Count("id"), stopping=Count("id", filter=Q(state=AttemptState.STOPPING)))
    if going["running"] < tenant.max_vms_per_student:
        return ""
    return _per_student_refusal(running=going["running"], stopping=going["stopping"]).message


def _quota_refusal(*, tenant: Tenant | TenantLimits, used_vms: int, used_vcpus: int, used_memory: int, vcpus: int,
                   memory_mib: int) -> Unavailable | None:
    """The refusal when one more VM of this shape would pass any of the tenant's limits, else None."""
    reasons = []
    if used_vms + 1 > tenant.max_concurrent_vms:
        reasons.append(_("all %(limit)d lab VMs are in use") % {"limit": tenant.max_concurrent_vms})
    if used_vcpus + vcpus > tenant.max_vcpus:
        reasons.append(_("%(used)d of %(limit)d vCPUs are in use") % {"used": used_vcpus, "limit": tenant.max_vcpus})
    if used_memory + memory_mib > tenant.max_memory_mib:
        reasons.append(_("%(used)d of %(limit)d MiB of memory are in use")
                       % {"used": used_memory, "limit": tenant.max_memory_mib})
    if not reasons:
        return None
    return Unavailable(
        _("Your institution's lab capacity is full (%(reasons)s). Try again in a minute or two.")
        % {"reasons": "; ".join(reasons)},
        code="quota_full", retry_after=retry_after_seconds(),
    )


# The Start's four reads, written in SQL. Every Start runs them, a class's hundred at once, and the ORM spends
# several times as long building and compiling the aggregates (and the locking read) as the database spends running
# them: a tenth of the web process's CPU in a burst. Names come from the models, so a renamed column cannot go stale.


class TenantLimits(NamedTuple):
    max_concurrent_vms: int
    max_vcpus: int
    max_memory_mib: int
    max_vms_per_student: int


class MyAttempts(NamedTuple):
    counted: int  # all but the failed: what the attempt limit counts
    number: int | None  # the highest attempt number so far
    active: int | None  # the id of one in an active state, if any


class TenantTotals(NamedTuple):
    vms: int
    vcpus: int | None
    memory: int | None
    students: int  # the student's own active attempts
    stopping: int  # of which stopping


def _column(model, name: str) -> str:
    return connection.ops.quote_name(model._meta.get_field(name).column)


@functools.cache
def _start_statements(vendor: str) -> dict[str, str]:
    """The SQL of the Start's reads, for ``vendor``'s database (built once per process)."""
    attempt = {name: _column(Attempt, name) for name in (
        "id", "state", "number", "student", "lab", "tenant", "vcpus", "launcher_memory_mib")}
    tenant = {name: _column(Tenant, name) for name in (
        "id", *TenantLimits._fields)}
    attempts = connection.ops.quote_name(Attempt._meta.db_table)
    active = ", ".join(["%s"] * len(ACTIVE_STATES))
    lock = " FOR NO KEY UPDATE" if connection.features.has_select_for_no_key_update else ""
    # Identifiers from the models, quoted; every value is a parameter.
    mine = (
        f"SELECT COUNT(*) FILTER (WHERE {attempt['state']} <> %s), MAX({attempt['number']}), "  # noqa: S608
        f"MAX({attempt['id']}) FILTER (WHERE {attempt['state']} IN ({active})) "
        f"FROM {attempts} WHERE {attempt['student']} = %s AND {attempt['lab']} = %s"
    )
    limits = (
        f"SELECT {', '.join(tenant[name] for name in TenantLimits._fields)} "  # noqa: S608
        f"FROM {connection.ops.quote_name(Tenant._meta.db_table)} WHERE {tenant['id']} = %s{lock}"
    )
    totals = (
        f"SELECT COUNT(*), SUM({attempt['vcpus']}), SUM({attempt['launcher_memory_mib']}), "  # noqa: S608
        f"COUNT(*) FILTER (WHERE {attempt['student']} = %s), "
        f"COUNT(*) FILTER (WHERE {attempt['student']} = %s AND {attempt['state']} = %s) "
        f"FROM {attempts} WHERE {attempt['tenant']} = %s AND {attempt['state']} IN ({active})"
    )
    starting = (
        f"SELECT COUNT(*) FROM {attempts} "  # noqa: S608
        f"WHERE {attempt['state']} IN ({', '.join(['%s'] * len(STARTING_STATES))})"
    )
    return {"mine": mine, "tenant": limits, "totals": totals, "starting": starting}


def _fetch(statement: str, params: list) -> tuple:
    with connection.cursor() as cursor:
        cursor.execute(_start_statements(connection.vendor)[statement], params)
        return cursor.fetchone()


def _my_attempts(*, student_id: int, lab_id: int) -> MyAttempts:
    """The student's attempts of the lab: how many count against its limit, the last number, an active one."""
    return MyAttempts(*_fetch("mine", [AttemptState.FAILED, *ACTIVE_STATES, student_id, lab_id]))


def _tenant_limits_locked(tenant_id: int) -> TenantLimits:
    """The tenant's limits, its row locked FOR NO KEY UPDATE until the transaction ends (where the database can)."""
    row = _fetch("tenant", [tenant_id])
    if row is None:
        raise Tenant.DoesNotExist(f"tenant {tenant_id}")
    return TenantLimits(*row)


def _tenant_totals(*, tenant_id: int, student_id: int) -> TenantTotals:
    """The tenant's active attempts: how many, their vCPUs and launcher memory, and the student's own."""
    return TenantTotals(*_fetch("totals", [student_id, student_id, AttemptState.STOPPING, tenant_id,
                                           *ACTIVE_STATES]))


def _already_active(*, attempt_id: int | None) -> Conflict:
    return Conflict(_("You already have an attempt of this lab in progress."), code="attempt_active",
                    extra={"attempt_id": attempt_id} if attempt_id is not None else None)


def _is_one_active_violation(error: IntegrityError) -> bool:
    diag = getattr(error.__cause__, "diag", None)
    constraint = getattr(diag, "constraint_name", None)
    # Without the driver's diagnostics (not PostgreSQL), the attempt insert is the one statement that can clash.
    return constraint is None or constraint == ONE_ACTIVE_CONSTRAINT


# The new attempt's VM name, from its id (built once: every Start writes it).
_name_vm = FieldsUpdate(lambda *, attempt_id: Attempt.objects.filter(id=attempt_id), attempt_id=int)


def attempt_start(*, actor: User, lab: Lab, role: str | None = None) -> Attempt:
    """Start an attempt of ``lab`` for the student ``actor``: checks, quota, the row, then provisioning on commit.

    Every start in a tenant waits for the tenant's row lock, so the lock is held for as little as possible: the
    attempt row, its VM name and the audit record are written first (an uncommitted row is invisible to the other
    starts), then the lock is taken and one aggregate counts the tenant's active attempts, this one included, and
    the transaction commits at once: two round trips under the lock. A start over the quota rolls back what it
    wrote. Everything that does not depend on other starts (the student's standing and earlier attempts, the lab's
    window and settings, the size arithmetic, the global start throttle) is decided before the transaction, and
    the push and the queueing run after the commit.

    ``role``: the actor's role in the lab's course when the caller has just read it with the lab (the lab page's
    ``lab_get_for_student`` finds the lab through the student's membership); otherwise it is read here.
    """
    course = lab.course
    if role is None:
        role = course_role(user=actor, course=course)
    if role is None:
        raise NotFound(_("Lab not found."))
    if role != Role.STUDENT:
        raise PermissionDenied(_("Only students of the course can start this lab."))
    now = timezone.now()
    if not lab.is_open(now):
        raise Conflict(_lab_closed_message(lab, now, actor=actor), code="lab_closed")
    guest = guest_resources(lab.size)
    launcher = launcher_requests(vcpus=guest.vcpus, memory_mib=guest.memory_mib)
    _check_extra_cloud_init(lab)
    # The student's own attempts of the lab, in one query. Two starts of the same student cannot both get past the
    # one-active constraint, so counting outside the lock lets nobody past the attempt limit.
    mine = _my_attempts(student_id=actor.pk, lab_id=lab.pk)
    if mine.active is not None:
        raise _already_active(attempt_id=mine.active)
    if lab.attempt_limit and mine.counted >= lab.attempt_limit:
        raise Conflict(_("You have used all %(limit)d attempts for this lab.") % {"limit": lab.attempt_limit},
                       code="attempt_limit")
    _check_start_throttle()
    number = (mine.number or 0) + 1

    try:
        with transaction.atomic():
            attempt = Attempt.objects.create(
                lab=lab, student=actor, tenant=course.tenant, number=number, state=AttemptState.REQUESTED,
                namespace=course.tenant.namespace, agent_token=secrets.token_urlsafe(32),
                # The page's language (the request's): the workers' messages about this attempt are written in it.
                language=translation.get_language() or "",
                vcpus=guest.vcpus, memory_mib=guest.memory_mib,
                launcher_cpu_millicores=launcher.cpu_millicores, launcher_memory_mib=launcher.memory_mib,
                requested_at=now,
            )
            attempt.vm_name = names.vm_name(attempt.id)
            _name_vm.run({"vm_name": attempt.vm_name}, attempt_id=attempt.id)
            audit_record(actor=actor, action="attempt.start", target=attempt, tenant=course.tenant,
                         course=course, data={"lab": lab.id, "size": lab.size, "number": number})
            # Serialises the starts of the tenant: the totals below include every start that committed before
            # this one got the lock. FOR NO KEY UPDATE: rows that only reference the tenant (a classmate's stop
            # writing its audit record, the inserts above) need not wait for it.
            tenant = _tenant_limits_locked(course.tenant_id)
            totals = _tenant_totals(tenant_id=course.tenant_id, student_id=actor.pk)
            if tenant.max_vms_per_student and totals.students > tenant.max_vms_per_student:
                raise _per_student_refusal(running=totals.students - 1, stopping=totals.stopping)
            refusal = _quota_refusal(
                tenant=tenant, used_vms=(totals.vms or 1) - 1, used_vcpus=(totals.vcpus or 0) - guest.vcpus,
                used_memory=(totals.memory or 0) - launcher.memory_mib, vcpus=guest.vcpus,
                memory_mib=launcher.memory_mib,
            )
            if refusal is not None:
                raise refusal
    except IntegrityError as error:
        if not _is_one_active_violation(error):
            raise
        active = Attempt.objects.filter(student=actor, lab=lab, state__in=ACTIVE_STATES).values_list(
            "id", flat=True).first()
        raise _already_active(attempt_id=active) from None
    # After the commit (or, inside a caller's transaction, on its commit): the task. No update is pushed: nobody can
    # be listening to the group of an attempt that did not exist, and the answer carries its status.
    queued = _enqueue_provision(attempt.id)
    if not transaction.get_connection().in_atomic_block and not queued.get("sent", True):
        # The provisioning could not be handed to the broker: the attempt was failed in words.
        attempt.refresh_from_db(fields=["state", "failure_reason", "ended_at", "updated_at"])
        if attempt.state == AttemptState.FAILED:
            raise Unavailable(attempt.failure_reason, code="queue_unavailable", retry_after=retry_after_seconds())
    return attempt


def attempt_start_limited(*, actor: User, lab: Lab, role: str | None = None) -> Attempt:
    """``attempt_start`` behind the per-person start limit (``RATE_LIMITS["attempt_start"]``), the same for the lab
    page's Start and the API's. A refusal that asks to come back later (full capacity, many starts at once: it
    carries Retry-After) started nothing and is not counted, nor is a database too busy to answer, so a page that
    waits and retries by itself (``static/js/start.js``) does not use up the limit; every other refusal counts, as a
    start does."""
    counted = rate_limit_hit(
        scope="attempt_start", key=f"user:{actor.pk}",
        message=_("You have started too many labs in a short time. Wait a little before starting another."),
    )
    try:
        return attempt_start(actor=actor, lab=lab, role=role)
    except ApplicationError as error:
        if error.retry_after:
            rate_limit_refund(counted)
        raise
    except OperationalError as error:
        # No database connection came free in time: answered 503 with Retry-After (portal.server_errors), and the
        # page tries again by itself, as for full capacity. Nothing was started.
        if database_busy(error):
            rate_limit_refund(counted)
        raise


def _enqueue_provision(attempt_id: int) -> dict[str, bool]:
    """Queue the provisioning on commit. The returned dict gets ``sent`` once that was tried (False: refused)."""
    from labs.tasks import provision_attempt

    outcome: dict[str, bool] = {}

    def send() -> None:
        try:
            provision_attempt.delay(attempt_id)
        except Exception:
            outcome["sent"] = False
            logger.exception("could not queue the provisioning of attempt %s", attempt_id)
            _fail_unqueued(attempt_id)
        else:
            outcome["sent"] = True

    transaction.on_commit(send)
    return outcome


def _fail_unqueued(attempt_id: int) -> None:
    """The task queue refused the provisioning: end the attempt now, in words, rather than leave it requested with
    nobody to serve it. It holds no VM yet, and a failed attempt does not count against the attempt limit."""
    now = timezone.now()
    texts = in_every_language(lambda: _(
        "Your lab could not be queued for starting: the portal's task queue is not answering. Try again in a minute; "
        "this attempt does not count against your limit."))
    with transaction.atomic():
        if Attempt.objects.filter(id=attempt_id, state=AttemptState.REQUESTED).update(
            state=AttemptState.FAILED, failure_reason=in_language(texts, "", translation.get_language()),
            failure_reason_texts=texts, ended_at=now, updated_at=now,
        ):
            attempt_push_on_commit(attempt=Attempt.objects.get(id=attempt_id))


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
    """Stop the attempt: it becomes ``stopping`` now; a task grades it once more if it ran, then deletes the VM.
    Stopping an attempt that is already stopping changes nothing."""
    standing = _require_student_or_instructor(
        actor=actor, attempt=attempt, refusal=_("Only the student or an instructor can stop this lab.")
    )
    with transaction.atomic():
        locked = Attempt.objects.select_for_update(of=("self",)).select_related("lab__course").get(pk=attempt.pk)
        if locked.state == AttemptState.STOPPING:
            return locked
        if locked.state not in ACTIVE_STATES:
            raise Conflict(_("This attempt has already ended."), code="attempt_ended")
        audit_record(actor=actor, action="attempt.stop", target=locked, tenant=locked.tenant,
                     course=locked.lab.course, data={"from": locked.state, "by": standing})
        _begin_stopping(locked, reason=standing, now=timezone.now())
    return locked


def _begin_stopping(locked: Attempt, *, reason: str, now: datetime) -> None:
    """Inside the caller's transaction, on the attempt row it locked: ``stopping`` from now, for ``reason``; the
    page hears of it and the teardown (grade once more, then delete the VM) is queued, both on commit."""
    locked.state = AttemptState.STOPPING
    locked.stopping_at = now
    locked.stop_reason = reason
    locked.save(update_fields=["state", "stopping_at", "stop_reason", "updated_at"])
    attempt_push_on_commit(attempt=locked)
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
            raise Conflict(_("This lab has already been extended %(limit)d times, the most allowed.")
                           % {"limit": limit}, code="extension_limit")
        previous = locked.expires_at
        locked.expires_at = previous + timedelta(minutes=settings.ATTEMPT_EXTEND_MINUTES)
        locked.extensions += 1
        locked.save(update_fields=["expires_at", "extensions", "updated_at"])
        audit_record(actor=actor, action="attempt.extend", target=locked, tenant=locked.tenant,
                     course=locked.lab.course,
                     data={"from": previous.isoformat(), "to": locked.expires_at.isoformat(),
                           "extensions": locked.extensions})
        attempt_push_on_commit(attempt=locked)
    return locked


def attempt_seen(*, attempt_id: int, now: datetime | None = None) -> bool:
    """A page of the student has the attempt open now (its events socket): the lab's stop when left counts from
    here. One row, one column; False once the attempt has ended."""
    return bool(Attempt.objects.filter(id=attempt_id, state__in=ACTIVE_STATES).update(
        last_seen_at=now or timezone.now()))


# While the student's page has an attempt open, its events socket stamps the attempt as seen this often
# (labs.consumers.events; well under the shortest stop when left, IDLE_STOP_MIN_MINUTES).
PRESENCE_STAMP_SECONDS = 60
# A last stamp older than this means no page has the attempt open now (one stamp missed, and a margin).
PRESENCE_LOST_AFTER_SECONDS = 2 * PRESENCE_STAMP_SECONDS + 30


def attempt_stops_as_left_at(attempt: Attempt, *, idle_stop_minutes: int, now: datetime | None = None
                             ) -> datetime | None:
    """When the running attempt will be stopped because no page has it open, while that is so now; None when a
    page has it open, when its lab (``idle_stop_minutes``) never stops attempts for that, or when it is not
    running. For the pages that are not the attempt's own (the dashboard): opening the lab page resets it."""
    now = now or timezone.now()
    since = attempt_left_since(attempt)
    if attempt.state != AttemptState.RUNNING or not idle_stop_minutes or since is None:
        return None
    if (now - since).total_seconds() < PRESENCE_LOST_AFTER_SECONDS:
        return None
    return since + timedelta(minutes=idle_stop_minutes)


def attempt_left_since(attempt: Attempt) -> datetime | None:
    """Since when no page of the student has had the attempt open: its last stamp, or the moment its agent answered
    if that came later (a page that saw it starting and closed counts from when it was ready to work in; one started
    through the API that no page has opened, likewise). None until it runs."""
    stamps = [stamp for stamp in (attempt.last_seen_at, attempt.agent_ready_at) if stamp is not None]
    return max(stamps) if attempt.agent_ready_at is not None else None


def attempt_stop_left(*, attempt: Attempt, now: datetime | None = None) -> Attempt:
    """Nobody has had the running attempt open for its lab's ``idle_stop_minutes``: it becomes ``stopping``
    (reason ``left``); a task grades it once more and deletes the VM. Does nothing if the attempt is not running,
    its lab does not stop attempts for that, or a page has seen it since."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = Attempt.objects.select_for_update(of=("self",)).select_related("lab").get(pk=attempt.pk)
        limit = locked.lab.idle_stop_minutes
        since = attempt_left_since(locked)
        if (locked.state != AttemptState.RUNNING or not limit or since is None
                or since > now - timedelta(minutes=limit)):
            return locked
        _begin_stopping(locked, reason=StopReason.LEFT, now=now)
    logger.info("attempt %s stopped: no page had it open for %s minutes", locked.id, limit)
    return locked


def attempt_expire(*, attempt: Attempt) -> Attempt:
    """The time limit is up: the attempt becomes ``stopping`` (reason ``expired``); a task grades it once more and
    deletes the VM. Does nothing if the attempt is not running or was extended past now in the meantime."""
    now = timezone.now()
    with transaction.atomic():
        locked = Attempt.objects.select_for_update().get(pk=attempt.pk)
        if locked.state != AttemptState.RUNNING or locked.expires_at is None or locked.expires_at > now:
            return locked
        _begin_stopping(locked, reason=StopReason.EXPIRED, now=now)
    return locked
