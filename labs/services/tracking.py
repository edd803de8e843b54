"""Following the cluster: one list of VMIs per namespace (never per attempt), mapped onto its attempts by
``labs.services.observation``. A namespace with an attempt starting or stopping is listed on every sync, a steady
one every ``ATTEMPT_RESYNC_SECONDS``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, F, Q
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from labs.kubevirt import names, operations
from labs.kubevirt.operations import ClusterError
from labs.models import IDLE_STOP_MIN_MINUTES, Attempt, AttemptState, TenantNamespace
from labs.services.agents import agent_wait_start
from labs.services.observation import Outcome, attempt_observe
from labs.services.stopping import attempt_expire, attempt_left_since, attempt_stop_left, teardowns_resume

logger = logging.getLogger(__name__)

TRACKED_STATES = (AttemptState.PROVISIONING, AttemptState.STARTING, AttemptState.RUNNING, AttemptState.STOPPING)
MOVING_STATES = (AttemptState.PROVISIONING, AttemptState.STARTING, AttemptState.STOPPING)
NAMESPACE_LOCK_KEY = "labs:sync:namespace:{namespace}"
NAMESPACE_LOCK_SECONDS = 90
SWEEP_SOON_KEY = "labs:sweep-soon:{namespace}"
# A started attempt without a VMI for this long makes the sync ask for a sweep (a VMI being replaced after a
# restart is missing for a moment only).
VANISHED_AFTER_SECONDS = 10


@dataclass
class SyncReport:
    namespaces: list[str] = field(default_factory=list)
    changed: int = 0
    failed: int = 0
    ended: int = 0
    expired: int = 0
    left: int = 0
    awaiting_agent: int = 0
    skipped: bool = False
    sweep_requested: bool = False
    errors: list[str] = field(default_factory=list)

    def merge(self, other: SyncReport) -> None:
        self.namespaces += other.namespaces
        for name in ("changed", "failed", "ended", "expired", "awaiting_agent"):
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
    stopped = 0
    for attempt in candidates:
        since = attempt_left_since(attempt)
        if since is None or since > now - timedelta(minutes=attempt.lab.idle_stop_minutes):
            continue
        if attempt_stop_left(attempt=attempt, now=now).state == AttemptState.STOPPING:
            stopped += 1
    return stopped


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
        namespace
        for namespace, count in moving.items()
        if count or (listed_at := listed.get(namespace)) is None or listed_at <= resync_before
    )


def attempts_sync(*, now: datetime | None = None) -> SyncReport:
    """One pass: expire what is due, then list and map every namespace that is due."""
    now = now or timezone.now()
    report = SyncReport(expired=attempts_expire_due(now=now), left=attempts_stop_left(now=now))
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
    """List the namespace's VMIs once and update its tracked attempts; ``skipped`` while another sync of it runs."""
    report = SyncReport(namespaces=[namespace])
    key = NAMESPACE_LOCK_KEY.format(namespace=namespace)
    if not cache.add(key, "1", timeout=NAMESPACE_LOCK_SECONDS):
        report.skipped = True
        return report
    try:
        if not Attempt.objects.filter(namespace=namespace, state__in=TRACKED_STATES).exists():
            return report
        vmis = operations.vmis_list(namespace=namespace)
        now = timezone.now()
        # Attempts are read after the list, so none is judged on a list older than its own last change.
        attempts = list(Attempt.objects.filter(namespace=namespace, state__in=TRACKED_STATES))
        # A namespace whose last list failed is answering again: teardowns cut off meanwhile go on now.
        rows = TenantNamespace.objects.filter(namespace=namespace)
        if rows.exclude(last_error="").update(listed_at=now, last_error=""):
            teardowns_resume(namespace=namespace)
        else:
            rows.update(listed_at=now, last_error="")
        by_name: dict[str | None, dict[str, Any]] = {(vmi.get("metadata") or {}).get("name"): vmi for vmi in vmis}
        for attempt in attempts:
            outcome = attempt_observe(attempt=attempt, vmi=by_name.get(attempt.vm_name), now=now)
            if outcome != Outcome.UNCHANGED:  # the other outcomes are named as the report's counts
                setattr(report, outcome, getattr(report, outcome) + 1)
        if report.awaiting_agent:
            agent_wait_start(namespace=namespace)
        report.sweep_requested = _sweep_if_inconsistent(
            namespace=namespace, attempts=attempts, by_name=by_name, now=now
        )
        return report
    finally:
        cache.delete(key)


def _sweep_if_inconsistent(
    *, namespace: str, attempts: list[Attempt], by_name: dict[str | None, dict[str, Any]], now: datetime
) -> bool:
    """Queue a sweep now (once per resync) if the list shows an orphan VMI or a started attempt without one."""
    owned = {attempt.vm_name for attempt in attempts}
    settle = now - timedelta(seconds=VANISHED_AFTER_SECONDS)
    if not any(
        name not in owned
        and not (vmi.get("metadata") or {}).get("deletionTimestamp")
        and (name is None or names.pool_vm_id_from_vm_name(name) is None)
        for name, vmi in by_name.items()
    ) and not any(
        attempt.state in (AttemptState.STARTING, AttemptState.RUNNING)
        and attempt.vm_name not in by_name
        and attempt.provisioned_at is not None
        and attempt.provisioned_at < settle
        for attempt in attempts
    ):
        return False
    if not cache.add(SWEEP_SOON_KEY.format(namespace=namespace), "1", timeout=settings.ATTEMPT_RESYNC_SECONDS):
        return False
    from labs.tasks import sweep_namespace

    try:
        sweep_namespace.delay(namespace)
    except Exception:
        logger.warning("could not queue a sweep of %s; the periodic sweep will do", namespace, exc_info=True)
        return False
    return True
