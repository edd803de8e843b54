"""The operations dashboard in the admin: running VMs, requested CPU and memory against quota, and start latency
per tenant, scoped to the tenants the staff member may see (superusers: all; instructors: their own)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib import admin
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import Count, Q, Sum
from django.http import HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext as _

from labs import sync_health
from labs.models import ACTIVE_STATES, Attempt, AttemptState, TenantNamespace
from labs.pool_models import POOL_HOLDING_STATES, PoolVm
from labs.pool_selectors import pool_stats
from labs.sizes import launcher_requests
from ops import health as ops_health
from ops.metrics import START_PHASES
from portal.errors import PermissionDenied
from portal.http import AuthenticatedRequest
from portal.models import Role, Tenant, User
from portal.selectors import courses_for_user

LATENCY_WINDOW = timedelta(hours=1)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0–100) with linear interpolation between ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50: float | None
    p95: float | None


@dataclass
class TenantCapacity:
    tenant: Tenant
    running: int = 0
    starting: int = 0
    active: int = 0  # every VM held or about to be (attempts and unclaimed pool VMs): what the VM quota counts
    pool_vms: int = 0  # of which unclaimed warm-pool VMs
    vcpus: int = 0
    cpu_millicores: int = 0
    memory_mib: int = 0
    failed_last_hour: int = 0
    start: LatencySummary = field(default_factory=lambda: LatencySummary(0, None, None))
    failing_namespace: TenantNamespace | None = None  # its namespace, while the last request there failed

    @property
    def vm_percent(self) -> int:
        return _percent(self.active, self.tenant.max_concurrent_vms)

    @property
    def vcpu_percent(self) -> int:
        return _percent(self.vcpus, self.tenant.max_vcpus)

    @property
    def memory_percent(self) -> int:
        return _percent(self.memory_mib, self.tenant.max_memory_mib)


def _percent(used: int, limit: int) -> int:
    # A quota of 0 has no room at all: a full bar, not an empty one.
    return round(100 * used / limit) if limit else 100


@dataclass(frozen=True)
class OpsOverview:
    tenants: list[TenantCapacity]
    start: LatencySummary
    phases: dict[str, LatencySummary]
    generated_at: datetime


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    """``end - start`` in seconds, never below 0: VMI phase times come from the cluster in whole seconds, so one
    reached in the same second as a precise time of the portal's can read up to a second before it."""
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def ops_tenant_ids_for_user(*, user: User) -> list[int]:
    """Superusers see every tenant; an instructor sees their own tenant; nobody else sees any."""
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return []
    if user.is_superuser:
        return list(Tenant.objects.values_list("id", flat=True))
    if user.tenant_id and courses_for_user(user=user, roles=(Role.INSTRUCTOR,)).exists():
        return [user.tenant_id]
    return []


def ops_overview_for_user(*, user: User, now: datetime | None = None) -> OpsOverview:
    """Capacity and start latency of the tenants ``user`` may see: one row per tenant, plus overall figures."""
    now = now or timezone.now()
    tenant_ids = ops_tenant_ids_for_user(user=user)
    if not tenant_ids and not user.is_superuser:
        raise PermissionDenied(_("The operations dashboard is for instructors and administrators."))
    tenants = {tenant.id: TenantCapacity(tenant=tenant) for tenant in Tenant.objects.filter(id__in=tenant_ids)}
    attempts = Attempt.objects.filter(tenant_id__in=tenant_ids)

    # Grouped by shape so that attempts whose launcher requests were not recorded (0) are still counted, with
    # the same arithmetic the lifecycle uses (labs.sizes).
    active_rows = (
        attempts.filter(state__in=ACTIVE_STATES)
        .values("tenant_id", "vcpus", "memory_mib")
        .annotate(
            active=Count("id"),
            running=Count("id", filter=Q(state=AttemptState.RUNNING)),
            starting=Count(
                "id", filter=Q(state__in=[AttemptState.REQUESTED, AttemptState.PROVISIONING, AttemptState.STARTING])
            ),
            cpu=Sum("launcher_cpu_millicores"),
            memory=Sum("launcher_memory_mib"),
            unrecorded=Count("id", filter=Q(launcher_memory_mib=0)),
        )
        .order_by()
    )
    for row in active_rows:
        capacity = tenants[row["tenant_id"]]
        capacity.active += row["active"]
        capacity.running += row["running"]
        capacity.starting += row["starting"]
        capacity.vcpus += row["vcpus"] * row["active"]
        capacity.cpu_millicores += row["cpu"] or 0
        capacity.memory_mib += row["memory"] or 0
        if row["unrecorded"]:
            computed = launcher_requests(vcpus=row["vcpus"], memory_mib=row["memory_mib"])
            capacity.cpu_millicores += computed.cpu_millicores * row["unrecorded"]
            capacity.memory_mib += computed.memory_mib * row["unrecorded"]

    # Unclaimed warm-pool VMs hold quota as attempts do (labs.services.quota.tenant_totals counts them too).
    pool_rows = (
        PoolVm.objects.filter(tenant_id__in=tenant_ids, state__in=POOL_HOLDING_STATES)
        .values("tenant_id", "vcpus", "memory_mib")
        .annotate(held=Count("id"), memory=Sum("launcher_memory_mib"))
        .order_by()
    )
    for pool_row in pool_rows:
        capacity = tenants[pool_row["tenant_id"]]
        capacity.pool_vms += pool_row["held"]
        capacity.active += pool_row["held"]
        capacity.vcpus += pool_row["vcpus"] * pool_row["held"]
        launcher = launcher_requests(vcpus=pool_row["vcpus"], memory_mib=pool_row["memory_mib"])
        capacity.cpu_millicores += launcher.cpu_millicores * pool_row["held"]
        capacity.memory_mib += pool_row["memory"] or 0

    for namespace in TenantNamespace.objects.filter(tenant_id__in=tenant_ids).exclude(last_error=""):
        tenants[namespace.tenant_id].failing_namespace = namespace

    since = now - LATENCY_WINDOW
    for failed in (
        attempts.filter(state=AttemptState.FAILED, updated_at__gte=since)
        .values("tenant_id")
        .annotate(n=Count("id"))
        .order_by()
    ):
        tenants[failed["tenant_id"]].failed_last_hour = failed["n"]

    # Attempts that became ready in the last hour: a few hundred rows at most, so percentiles are computed here
    # rather than with database-specific percentile functions (SQLite has none).
    timestamp_fields = sorted({name for pair in START_PHASES.values() for name in pair})
    ready = list(attempts.filter(agent_ready_at__gte=since).values("tenant_id", *timestamp_fields))
    per_tenant: dict[int, list[float]] = {}
    per_phase: dict[str, list[float]] = {phase: [] for phase in START_PHASES}
    for row in ready:
        for phase, (start, end) in START_PHASES.items():
            value = _seconds(row[start], row[end])
            if value is not None:
                per_phase[phase].append(value)
        total = _seconds(row["requested_at"], row["agent_ready_at"])
        if total is not None:
            per_tenant.setdefault(row["tenant_id"], []).append(total)
    for tenant_id, values in per_tenant.items():
        tenants[tenant_id].start = _summary(values)

    return OpsOverview(
        tenants=sorted(tenants.values(), key=lambda item: item.tenant.name),
        start=_summary(per_phase["total"]),
        phases={phase: _summary(values) for phase, values in per_phase.items() if phase != "total"},
        generated_at=now,
    )


def _summary(values: list[float]) -> LatencySummary:
    return LatencySummary(count=len(values), p50=percentile(values, 50), p95=percentile(values, 95))


def ops_dashboard_view(request: AuthenticatedRequest) -> HttpResponse:
    """The admin page (wrapped in ``admin.site.admin_view`` in the URLconf, so staff only)."""
    try:
        overview = ops_overview_for_user(user=request.user)
    except PermissionDenied as exc:
        raise DjangoPermissionDenied(str(exc)) from exc
    components = ops_health.readiness(exclude=("database",))
    heartbeat = None
    if request.user.is_superuser:  # the sync error text may name any tenant's namespace
        try:
            heartbeat = sync_health.sync_heartbeat()
        except Exception:  # the readiness row above already says the cache is down
            heartbeat = None
    context = {
        **admin.site.each_context(request),
        "title": _("Operations dashboard"),
        "overview": overview,
        "components": components,
        "heartbeat": heartbeat,
        "window_minutes": int(LATENCY_WINDOW.total_seconds() // 60),
        "pools": pool_stats(tenant_ids=ops_tenant_ids_for_user(user=request.user)),
    }
    return TemplateResponse(request, "admin/ops_dashboard.html", context)
