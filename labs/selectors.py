"""Reads of attempts, always scoped to what the person may see: their own attempts, or those of courses they
teach. Also the attempt's status payload (the shape pushed to the browser) and a tenant's capacity in use."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Q, QuerySet, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from labs.console.stage import console_stage
from labs.models import ACTIVE_STATES, Attempt, AttemptState, Lab
from labs.sizes import CPU_ALLOCATION_RATIO
from portal.compiled import CompiledQuery
from portal.errors import NotFound
from portal.models import STAFF_ROLES, Role, Tenant, User
from portal.selectors import courses_for_user

# The attempt's timestamps in the payload, by key, with the model field each comes from.
PAYLOAD_TIMESTAMPS = {
    "requested": "requested_at",
    "provisioned": "provisioned_at",
    "pending": "pending_at",
    "scheduling": "scheduling_at",
    "scheduled": "scheduled_at",
    "vmi_running": "vmi_running_at",
    "agent_ready": "agent_ready_at",
    "stopping": "stopping_at",
    "ended": "ended_at",
}
STARTING_STATES = (AttemptState.REQUESTED, AttemptState.PROVISIONING, AttemptState.STARTING)


def attempts_for_user(*, user: User) -> QuerySet[Attempt]:
    """Attempts the user may see: their own, plus every attempt in courses where they are instructor or TA.
    Always inside the user's tenant (superusers see all)."""
    if not user.is_authenticated:
        return Attempt.objects.none()
    if user.is_superuser:
        return Attempt.objects.all()
    staff_courses = courses_for_user(user=user, roles=tuple(STAFF_ROLES))
    return Attempt.objects.filter(tenant_id=user.tenant_id).filter(
        Q(student=user) | Q(lab__course__in=staff_courses)
    )


def _attempt_rows(attempts: QuerySet[Attempt], *, attempt_id: int, related: bool,
                  with_idle_stop: bool) -> QuerySet[Attempt]:
    attempts = attempts.filter(id=attempt_id).order_by()  # one row at most: no ORDER BY
    if with_idle_stop:
        attempts = attempts.annotate(lab_idle_stop_minutes=F("lab__idle_stop_minutes"))
    # Never select_related() without fields: that follows every foreign key, and their foreign keys.
    return attempts.select_related("lab", "lab__course", "student", "tenant") if related else attempts


def _own_attempt_query(*, related: bool, with_idle_stop: bool) -> CompiledQuery[Attempt]:
    def rows(*, attempt_id: int, student_id: int, tenant_id: int) -> QuerySet[Attempt]:
        own = Attempt.objects.filter(student_id=student_id, tenant_id=tenant_id)
        return _attempt_rows(own, attempt_id=attempt_id, related=related, with_idle_stop=with_idle_stop)[:1]

    return CompiledQuery(rows, attempt_id=int, student_id=int, tenant_id=int)


_OWN_ATTEMPT = {(related, with_idle_stop): _own_attempt_query(related=related, with_idle_stop=with_idle_stop)
                for related in (False, True) for with_idle_stop in (False, True)}


def attempt_own(*, user: User, attempt_id: int, related: bool = False, with_idle_stop: bool = False) -> Attempt | None:
    """The user's own attempt (they are its student, in their tenant), or None; as ``attempt_get_for_user`` reads it.
    Built once per process (``portal.compiled``): every page, socket and console of a class at work asks it."""
    if not user.is_authenticated or user.is_superuser or user.tenant_id is None:
        return None
    return _OWN_ATTEMPT[related, with_idle_stop].first(attempt_id=int(attempt_id), student_id=user.pk,
                                                        tenant_id=user.tenant_id)


def attempt_get_for_user(*, user: User, attempt_id: int, related: bool = True,
                         with_idle_stop: bool = False) -> Attempt:
    """The attempt if the user is its student or staff of its course; the same NotFound otherwise. With
    ``related`` its lab, course, student and tenant come in the same query (callers that only need the attempt's
    own fields, like the events socket's handshake, skip that: the query is then far cheaper to build). With
    ``with_idle_stop`` the lab's ``idle_stop_minutes`` comes along as ``lab_idle_stop_minutes``."""
    # The common case first, by a query built once: the student's own attempt (every page, socket and console of a
    # class at work). Staff fall through to the query over the courses they teach.
    attempt = attempt_own(user=user, attempt_id=attempt_id, related=related, with_idle_stop=with_idle_stop)
    if attempt is None:
        rows = _attempt_rows(attempts_for_user(user=user), attempt_id=attempt_id, related=related,
                             with_idle_stop=with_idle_stop)
        attempt = next(iter(rows), None)
    if attempt is None:
        raise NotFound(_("Attempt not found."))
    return attempt


def attempts_for_student(*, user: User, lab: Lab | None = None) -> QuerySet[Attempt]:
    """The student's own attempts (newest first), optionally of one lab: the student dashboard's rows."""
    attempts = Attempt.objects.filter(student=user, tenant_id=user.tenant_id).select_related("lab", "lab__course")
    return attempts.filter(lab=lab) if lab is not None else attempts


def attempts_going_for_student(*, user: User) -> QuerySet[Attempt]:
    """The student's attempts that hold (or are about to hold) a VM, with their labs: what a per-student cap counts."""
    return attempts_for_student(user=user).filter(state__in=ACTIVE_STATES).order_by("requested_at", "id")


def attempts_for_course_staff(*, user: User, course_id: int) -> QuerySet[Attempt]:
    """Attempts in one course, for its instructors and TAs (empty for anyone else)."""
    courses = courses_for_user(user=user, roles=tuple(STAFF_ROLES)).filter(id=course_id)
    return Attempt.objects.filter(lab__course__in=courses).select_related("lab", "student")


def active_attempt_for(*, user: User, lab: Lab) -> Attempt | None:
    return Attempt.objects.filter(student=user, lab=lab, state__in=ACTIVE_STATES).first()


def attempts_counted_against_limit(*, student: User, lab: Lab) -> int:
    """Attempts that use up the lab's attempt limit: all but those that failed (a cluster failure is not the
    student's)."""
    return Attempt.objects.filter(student=student, lab=lab).exclude(state=AttemptState.FAILED).count()


def attempt_can_extend(attempt: Attempt) -> bool:
    return (
        attempt.state == AttemptState.RUNNING
        and attempt.expires_at is not None
        and attempt.extensions < settings.ATTEMPT_MAX_EXTENSIONS
    )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def attempt_status_payload(attempt: Attempt, *, now: datetime | None = None) -> dict[str, Any]:
    """The attempt as the browser sees it (JSON-safe): the contract of the ``attempt.update`` channel message."""
    now = now or timezone.now()
    slow_start = (
        attempt.state in STARTING_STATES
        and (now - attempt.requested_at).total_seconds() > settings.ATTEMPT_SLOW_START_NOTICE_SECONDS
    )
    return {
        "id": attempt.id,
        "state": attempt.state,
        "phase": attempt.phase,
        # In the active language: the reader's (the page's socket, the request) or, for a worker's push, the
        # attempt's own; a push also carries every language (labs.services.events) for each socket to pick.
        "failure_reason": attempt.failure_reason_shown,
        "message": attempt.status_message_shown,
        "node_name": attempt.node_name,
        "expires_at": _iso(attempt.expires_at),
        "extensions": attempt.extensions,
        "can_extend": attempt_can_extend(attempt),
        "timestamps": {key: _iso(getattr(attempt, field)) for key, field in PAYLOAD_TIMESTAMPS.items()},
        "slow_start": slow_start,
        # Whether the page should open the console socket yet (labs.console.stage): waiting, ready or ended.
        "console": console_stage(state=attempt.state, phase=attempt.phase),
        # Why it was stopped, once stopping: student, staff, expired, or left (no page had it open).
        "stop_reason": attempt.stop_reason,
    }


@dataclass(frozen=True)
class TenantCapacity:
    """What a tenant's active attempts hold against its quotas (launcher arithmetic, as the scheduler sees it)."""

    tenant: Tenant
    running_vms: int
    active_vms: int
    vcpus: int
    cpu_millicores: int
    memory_mib: int

    @property
    def max_cpu_millicores(self) -> int:
        return -(-self.tenant.max_vcpus * 1000 // CPU_ALLOCATION_RATIO)

    def percent(self, used: int, limit: int) -> int:
        return round(100 * used / limit) if limit else 0


def tenant_capacity(*, tenant: Tenant) -> TenantCapacity:
    totals = Attempt.objects.filter(tenant=tenant, state__in=ACTIVE_STATES).aggregate(
        active=Count("id"),
        running=Count("id", filter=Q(state=AttemptState.RUNNING)),
        vcpus=Sum("vcpus"),
        cpu=Sum("launcher_cpu_millicores"),
        memory=Sum("launcher_memory_mib"),
    )
    return TenantCapacity(
        tenant=tenant,
        running_vms=totals["running"] or 0,
        active_vms=totals["active"] or 0,
        vcpus=totals["vcpus"] or 0,
        cpu_millicores=totals["cpu"] or 0,
        memory_mib=totals["memory"] or 0,
    )


def tenants_for_capacity_view(*, user: User) -> QuerySet[Tenant]:
    """Tenants whose capacity the user may see: all for superusers, their own for instructors."""
    if user.is_superuser:
        return Tenant.objects.all()
    if not user.is_authenticated or not user.tenant_id:
        return Tenant.objects.none()
    if not courses_for_user(user=user, roles=(Role.INSTRUCTOR,)).exists():
        return Tenant.objects.none()
    return Tenant.objects.filter(id=user.tenant_id)
