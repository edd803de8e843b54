"""Reads of attempts beyond who may see them (``labs.access``): the attempt's status payload (the shape pushed to
the browser), the attempt limit's count, a tenant's capacity in use, and which namespaces fail to list."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Sum
from django.utils import timezone

from labs.kubevirt.operations import RBAC_SIGNATURE, REVIEW_REFUSAL
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt, AttemptState, Lab, TenantNamespace
from labs.sizes import namespace_cpu_millicores
from portal.models import Role, Tenant, User
from portal.selectors import courses_for_user

# The attempt's phases in lifecycle order: the payload's timestamps (without ``_at``), the timeline, the admin.
PHASE_FIELDS = (
    "requested_at",
    "provisioned_at",
    "pending_at",
    "scheduling_at",
    "scheduled_at",
    "vmi_running_at",
    "agent_ready_at",
    "stopping_at",
    "ended_at",
)
STARTING_STATES = (AttemptState.REQUESTED, AttemptState.PROVISIONING, AttemptState.STARTING)


def attempts_counted_against_limit(*, student: User, lab: Lab) -> int:
    """Attempts that use up the lab's attempt limit: all but failed ones (a cluster failure is not the student's)."""
    return Attempt.objects.filter(student=student, lab=lab).exclude(state=AttemptState.FAILED).count()


# A namespace's recorded error that says the cluster refuses the portal there (``namespaces.is_refusal_record``).
REFUSAL_RECORD = Q(last_error__contains=RBAC_SIGNATURE) | Q(last_error__contains=REVIEW_REFUSAL)


def namespace_failing(*, namespace: str, refusals: bool = True) -> bool:
    """Whether the portal's last request in ``namespace`` failed (its error is kept until a list succeeds); with
    ``refusals=False``, not counting a refusal for want of RBAC (a Start says that in words of its own)."""
    rows = TenantNamespace.objects.filter(namespace=namespace).exclude(last_error="")
    return (rows if refusals else rows.exclude(REFUSAL_RECORD)).exists()


def namespaces_failing() -> dict[str, bool]:
    """Each namespace with an active attempt, and whether the last request there failed (one query)."""
    failed = TenantNamespace.objects.filter(namespace=OuterRef("namespace")).exclude(last_error="")
    rows = Attempt.objects.filter(state__in=ACTIVE_STATES).annotate(failing=Exists(failed))
    return dict(rows.values_list("namespace", "failing").order_by().distinct())


def attempt_can_extend(attempt: Attempt) -> bool:
    return (
        attempt.state == AttemptState.RUNNING
        and attempt.expires_at is not None
        and attempt.extensions < settings.ATTEMPT_MAX_EXTENSIONS
    )


def console_stage(*, state: str, phase: str) -> str:
    """Where an attempt's console stands, decided the same way by the bridge (whether to dial) and the page (whether
    to open the socket): ``ended``, ``ready`` (the VMI runs) or ``waiting`` (no VM yet, or one still scheduling)."""
    if state == AttemptState.STOPPING or state in FINAL_STATES:
        return "ended"
    if state == AttemptState.RUNNING or (state == AttemptState.STARTING and phase == "Running"):
        return "ready"
    return "waiting"


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
        "timestamps": {field.removesuffix("_at"): _iso(getattr(attempt, field)) for field in PHASE_FIELDS},
        "slow_start": slow_start,
        # Whether the page should open the console socket yet: waiting, ready or ended.
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
        return namespace_cpu_millicores(max_vcpus=self.tenant.max_vcpus, max_vms=self.tenant.max_concurrent_vms)

    def percent(self, used: int, limit: int) -> int:
        return round(100 * used / limit) if limit else 0


def tenant_capacity(*, tenant: Tenant) -> TenantCapacity:
    totals = Attempt.objects.filter(tenant=tenant, state__in=ACTIVE_STATES).aggregate(
        active_vms=Count("id"),
        running_vms=Count("id", filter=Q(state=AttemptState.RUNNING)),
        vcpus=Sum("vcpus", default=0),
        cpu_millicores=Sum("launcher_cpu_millicores", default=0),
        memory_mib=Sum("launcher_memory_mib", default=0),
    )
    return TenantCapacity(tenant=tenant, **totals)


def tenants_for_capacity_view(*, user: User) -> QuerySet[Tenant]:
    """Tenants whose capacity the user may see: all for superusers, their own for instructors."""
    if user.is_superuser:
        return Tenant.objects.all()
    if not user.is_authenticated or not user.tenant_id:
        return Tenant.objects.none()
    if not courses_for_user(user=user, roles=(Role.INSTRUCTOR,)).exists():
        return Tenant.objects.none()
    return Tenant.objects.filter(id=user.tenant_id)
