"""Following the cluster: one list of VMIs per namespace (never per attempt), each attempt updated from its VMI; a
namespace with an attempt moving is listed on every sync, a steady one every ``ATTEMPT_RESYNC_SECONDS``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Q
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from labs.kubevirt import names, operations, status
from labs.kubevirt.operations import ClusterError
from labs.models import Attempt, AttemptState, TenantNamespace
from labs.services.agents import agent_wait_start
from labs.services.events import attempt_push_on_commit
from labs.services.provisioning import attempt_fail
from labs.services.stopping import attempt_end, attempts_expire_due, attempts_stop_left, teardowns_resume
from labs.states import attempt_transition
from labs.wording import in_every_language, node_drained, with_cluster_words

logger = logging.getLogger(__name__)

TRACKED_STATES = (AttemptState.PROVISIONING, AttemptState.STARTING, AttemptState.RUNNING, AttemptState.STOPPING)
MOVING_STATES = (AttemptState.PROVISIONING, AttemptState.STARTING, AttemptState.STOPPING)
NAMESPACE_LOCK_KEY = "labs:sync:namespace:{namespace}"
NAMESPACE_LOCK_SECONDS = 90
SWEEP_SOON_KEY = "labs:sweep-soon:{namespace}"
# A started attempt without a VMI this long makes the sync ask for a sweep (a restarted VMI is missing a moment).
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
        """Add one namespace's sync (which counts only its attempts' outcomes)."""
        self.namespaces += other.namespaces
        for name in ("changed", "failed", "ended", "awaiting_agent"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def namespaces_due(*, now: datetime) -> list[str]:
    """Namespaces with tracked attempts that need listing now: any moving attempt, or a resync falling due."""
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
            if outcome != "unchanged":
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


def start_again_hint() -> str:
    return _("You can start the lab again; a failed attempt does not count against your attempt limit.")


def _fail_restarted(attempt: Attempt) -> str:
    """KubeVirt replaced the VMI that ran with a new one from a fresh disk: the work is gone (the why is in Events)."""
    detail = operations.events_said(namespace=attempt.namespace, name=attempt.vm_name)
    try:  # a drain shuts down what cannot live-migrate (evictionStrategy None, or LiveMigrateIfPossible)
        drained = bool(attempt.node_name) and operations.node_cordoned(attempt.node_name)
    except ClusterError as error:
        logger.info("attempt %s: node %s unreadable (%s)", attempt.id, attempt.node_name, error.message)
        drained = False

    def reason() -> str:
        if drained:
            return node_drained(detail)
        return with_cluster_words(
            _(
                "The VM stopped unexpectedly (it crashed or was shut down from inside) and was restarted from a fresh "
                "disk, so the work in it is lost."
            ),
            detail,
        )

    return _fail(attempt, reason)


def _fail(attempt: Attempt, reason: Callable[[], str]) -> str:
    return "failed" if attempt_fail(attempt_id=attempt.id, reason=reason) else "unchanged"


def attempt_observe(*, attempt: Attempt, vmi: dict[str, Any] | None, now: datetime) -> str:
    """Apply what the attempt's VMI (or its absence) says; the outcome is a ``SyncReport`` count, or "unchanged"."""
    with translation.override(attempt.language or settings.LANGUAGE_CODE):
        if attempt.state == AttemptState.STOPPING:
            if vmi is None and attempt.vm_deleted_at is not None:
                return "ended" if attempt_end(attempt_id=attempt.id) else "unchanged"
            return "unchanged"
        if vmi is None:
            return "unchanged"  # no VMI yet: still starting; a VM gone altogether is the sweep's to judge

        observation = status.observe_vmi(vmi)
        if attempt.vmi_uid and observation.uid and observation.uid != attempt.vmi_uid and attempt.vmi_running_at:
            return _fail_restarted(attempt)
        changes: dict[str, Any] = {
            name: when
            for phase, name in status.PHASE_FIELDS.items()
            if (when := observation.phase_times.get(phase)) is not None and getattr(attempt, name) is None
        }
        if observation.phase != attempt.phase:
            changes["phase"] = observation.phase
        if observation.node_name and observation.node_name != attempt.node_name:
            changes["node_name"] = observation.node_name
        if observation.uid and observation.uid != attempt.vmi_uid:
            changes["vmi_uid"] = observation.uid
        to = None
        if attempt.state == AttemptState.PROVISIONING:
            # The VM exists but its provisioning never recorded it (a worker died after creating it).
            to = AttemptState.STARTING
            changes["provisioned_at"] = attempt.provisioned_at or now

        if observation.failed:
            _apply(attempt, changes, to=to)
            failure = operations.failed_vmi_words(vmi)
            if attempt.state == AttemptState.RUNNING:
                return _fail(attempt, lambda: _("The VM stopped unexpectedly.") + " " + failure())
            return _fail(attempt, lambda: failure() + " " + start_again_hint())

        if attempt.state != AttemptState.RUNNING:
            message: Callable[[dict[str, Any]], str] | None = None
            if observation.problem:
                since = observation.problem_since or now
                if observation.problem_final or (now - since).total_seconds() >= status.grace_seconds(observation):
                    _apply(attempt, changes, to=to)
                    return _fail(attempt, lambda: _problem(vmi) + " " + start_again_hint())
                message = _problem
            elif observation.running:
                message = _waiting_for_agent
            worded = message(vmi) if message else ""  # in the attempt's language, as the stored message is
            if worded != attempt.status_message:
                changes["status_message"] = worded
                changes["status_message_texts"] = in_every_language(lambda: message(vmi)) if message else {}

        changed = _apply(attempt, changes, to=to)
        if observation.running and (to or attempt.state) == AttemptState.STARTING:
            return "awaiting_agent"
        return "changed" if changed else "unchanged"


def _problem(vmi: dict[str, Any]) -> str:
    """The VMI's problem in the active language (the interpretation is pure: worded again per language)."""
    return status.observe_vmi(vmi).problem


def _waiting_for_agent(vmi: dict[str, Any]) -> str:
    return _("The VM is running; waiting for the lab agent inside it to start.")


def _apply(attempt: Attempt, changes: dict[str, Any], *, to: str | None = None) -> bool:
    """Write ``changes`` (and move the attempt ``to`` a state) if it is still in the state it was read in."""
    if to is not None:
        return attempt_transition(attempt=attempt, to=to, from_states=(attempt.state,), **changes) is not None
    if not changes:
        return False
    updated = Attempt.objects.filter(id=attempt.id, state=attempt.state).update(**changes, updated_at=timezone.now())
    if not updated:
        return False
    for name, value in changes.items():
        setattr(attempt, name, value)
    attempt_push_on_commit(attempt=attempt)
    return True
