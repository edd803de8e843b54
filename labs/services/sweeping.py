"""The sweep, per tenant namespace: our VMs and Secrets (label-selected) that no active attempt or warm pool holds are
deleted; stuck attempts are queued again, failed or ended."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from labs.kubevirt import names, operations, status
from labs.kubevirt.operations import ClusterError
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt, AttemptState, TenantNamespace
from labs.pool_models import POOL_HOLDING_STATES, PoolVm, PoolVmState
from labs.selectors import REFUSAL_RECORD
from labs.services.namespaces import is_rbac_refusal, tenant_namespace_refused
from labs.services.provisioning import attempt_fail
from labs.services.stopping import attempt_end
from labs.wording import with_cluster_words
from portal.models import Tenant

logger = logging.getLogger(__name__)

# A tenant with nothing going on is swept this often only (an orphan there can only come from a lost database or a
# hand-made VM); Secrets, which go with their VM but for one made just before a crash, are listed as often.
IDLE_SWEEP_KEY = "labs:sweep-idle:{namespace}"
CLOUD_INIT_SWEEP_KEY = "labs:sweep-secrets:{namespace}"
IDLE_SWEEP_SECONDS = 600
# A tenant whose last attempt ended this recently is still swept every time.
RECENT_ACTIVITY_SECONDS = 3600
# A pool Secret younger than this is left alone: its VM may be being made right now.
POOL_SECRET_MIN_AGE = timedelta(minutes=10)


@dataclass
class SweepReport:
    namespaces: int = 0
    orphan_vms_deleted: list[str] = field(default_factory=list)
    orphan_secrets_deleted: list[str] = field(default_factory=list)
    vanished: list[int] = field(default_factory=list)
    timed_out: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def attempts_sweep(*, now: datetime | None = None) -> SweepReport:
    now = now or timezone.now()
    report = SweepReport()
    recent = now - timedelta(seconds=RECENT_ACTIVITY_SECONDS)
    busy = set(
        Attempt.objects.filter(Q(state__in=ACTIVE_STATES) | Q(ended_at__gte=recent)).values_list("tenant_id", flat=True)
    )
    for tenant in Tenant.objects.all().only("id", "namespace"):
        if tenant.id not in busy and not cache.add(
            IDLE_SWEEP_KEY.format(namespace=tenant.namespace), "1", timeout=IDLE_SWEEP_SECONDS
        ):
            continue
        try:
            namespace_sweep(tenant=tenant, report=report, now=now)
            report.namespaces += 1
        except ClusterError as error:
            report.errors.append(error.message)
            if is_rbac_refusal(error):  # a new tenant's Role not applied: known before its first Start
                tenant_namespace_refused(namespace=tenant.namespace, said=error.message)
            else:
                TenantNamespace.objects.filter(namespace=tenant.namespace).update(
                    last_error=error.message[:2000], last_error_at=timezone.now()
                )
            logger.warning("sweep of %s failed: %s", tenant.namespace, error.message)
    requeue_requested(report=report, now=now)
    return report


def namespace_sweep_now(*, namespace: str) -> SweepReport:
    """Sweep one tenant's namespace (asked for by the sync when its list looked inconsistent)."""
    report = SweepReport()
    tenant = Tenant.objects.filter(namespace=namespace).only("id", "namespace").first()
    if tenant is not None:
        namespace_sweep(tenant=tenant, report=report, now=timezone.now())
        report.namespaces = 1
    return report


def _owner_id(metadata: dict[str, Any]) -> tuple[str, int] | None:
    """("attempt" or "pool", its id) for one of our VMs; None (it is left alone) when its name and labels disagree."""
    name, labels = metadata.get("name", ""), metadata.get("labels")
    attempt_id, pool_vm_id = names.attempt_id_from_vm_name(name), names.pool_vm_id_from_vm_name(name)
    if attempt_id is not None and names.attempt_id_from_labels(labels) == attempt_id:
        return "attempt", attempt_id
    if pool_vm_id is not None and names.pool_vm_id_from_labels(labels) == pool_vm_id:
        return "pool", pool_vm_id
    logger.warning(
        "VM %s/%s: its name and the portal's labels disagree; leaving it alone", metadata.get("namespace"), name
    )
    return None


def namespace_sweep(*, tenant: Tenant, report: SweepReport, now: datetime) -> None:
    namespace = tenant.namespace
    listed_at = timezone.now()
    listed = operations.vms_list(namespace=namespace)
    owners = {vm["metadata"]["name"]: (vm, owner) for vm in listed if (owner := _owner_id(vm["metadata"]))}
    secrets = []
    if cache.add(CLOUD_INIT_SWEEP_KEY.format(namespace=namespace), "1", timeout=IDLE_SWEEP_SECONDS):
        secrets = operations.secrets_list(namespace=namespace)
    pool_ids = [i for _vm, (kind, i) in owners.values() if kind == "pool"]
    pool_rows = PoolVm.objects.filter(tenant=tenant, namespace=namespace).in_bulk(pool_ids)
    attempt_ids = {i for _vm, (kind, i) in owners.values() if kind == "attempt"}
    attempt_ids |= {row.attempt_id for row in pool_rows.values() if row.attempt_id}
    for secret in secrets:
        if (attempt_id := names.attempt_id_from_labels((secret.get("metadata") or {}).get("labels"))) is not None:
            attempt_ids.add(attempt_id)
    known = Attempt.objects.only("id", "state", "tenant_id", "vm_deleted_at", "vm_name").in_bulk(attempt_ids)

    def held(attempt: Attempt | None) -> bool:
        return attempt is not None and attempt.state in ACTIVE_STATES and attempt.tenant_id == tenant.id

    kept: dict[str, dict[str, Any]] = {}
    for name, (vm, (kind, owner_id)) in owners.items():
        row = pool_rows.get(owner_id) if kind == "pool" else None
        if row is not None and row.state in POOL_HOLDING_STATES:
            continue
        attempt = known.get(owner_id) if kind == "attempt" else None
        if row is not None and row.state == PoolVmState.CLAIMED and row.attempt_id:  # it belongs to its attempt
            attempt = known.get(row.attempt_id)
            attempt = attempt if attempt is not None and attempt.vm_name == name else None
        if held(attempt):
            kept[name] = vm
            continue
        if vm["metadata"].get("deletionTimestamp"):
            continue  # already going
        operations.vm_and_secret_delete(namespace=namespace, name=name)
        if attempt is not None and attempt.state in FINAL_STATES:
            Attempt.objects.filter(id=attempt.id, vm_deleted_at__isnull=True).update(vm_deleted_at=timezone.now())
        report.orphan_vms_deleted.append(f"{namespace}/{name}")
        logger.info("sweep: deleted VM %s/%s, which no active attempt or warm pool holds", namespace, name)

    vm_names = {vm["metadata"]["name"] for vm in listed}
    for secret in secrets:
        metadata = secret.get("metadata") or {}
        if _secret_orphaned(metadata, tenant=tenant, vm_names=vm_names, known=known, held=held, now=now):
            if operations.secret_delete(namespace=namespace, name=metadata["name"]):
                report.orphan_secrets_deleted.append(f"{namespace}/{metadata['name']}")
                logger.info("sweep: deleted Secret %s/%s, whose VM was never made", namespace, metadata["name"])

    active = list(Attempt.objects.filter(tenant=tenant, state__in=ACTIVE_STATES).select_related("lab"))
    for attempt in active:
        attempt_sweep(attempt=attempt, vm=kept.get(attempt.vm_name), listed_at=listed_at, now=now, report=report)
    rows = TenantNamespace.objects.filter(namespace=namespace)
    rows.update(swept_at=timezone.now())
    if not active:  # no sync lists it: a failure that passed must not tell its students of trouble for good
        rows.exclude(REFUSAL_RECORD).update(last_error="")


def _secret_orphaned(
    metadata: dict[str, Any], *, tenant: Tenant, vm_names: set[str], known: dict, held: Any, now: datetime
) -> bool:
    """Whether a cloud-init Secret of ours has no VM (one with a VM goes with it) and nothing holds it: no active
    attempt, or for a warm pool's, no unclaimed pool row and no making under way (it is young)."""
    labels = metadata.get("labels")
    attempt_id, pool_vm_id = names.attempt_id_from_labels(labels), names.pool_vm_id_from_labels(labels)
    if attempt_id is not None:
        vm_name = names.vm_name(attempt_id)
        ours = metadata.get("name") == names.cloud_init_secret_name(vm_name)
        return ours and vm_name not in vm_names and not held(known.get(attempt_id))
    if pool_vm_id is None:
        return False
    vm_name = names.pool_vm_name(pool_vm_id)
    if metadata.get("name") != names.cloud_init_secret_name(vm_name) or vm_name in vm_names:
        return False
    created = parse_datetime(metadata.get("creationTimestamp") or "")
    if created is None or created > now - POOL_SECRET_MIN_AGE or metadata.get("deletionTimestamp"):
        return False
    return not PoolVm.objects.filter(
        id=pool_vm_id, tenant=tenant, namespace=tenant.namespace, state__in=POOL_HOLDING_STATES
    ).exists()


def provision_redelivery_seconds() -> int:
    """How long provisioning may look stuck before it is queued again: past the task's hard time limit."""
    return max(60, settings.ATTEMPT_TASK_SOFT_TIME_LIMIT_SECONDS + 60)


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
        # A teardown grades first (up to the checks' timeouts), so it is given the whole task time limit.
        lost = since is not None and since < now - timedelta(seconds=max(120, settings.CELERY_TASK_TIME_LIMIT + 60))
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
    events = operations.events_said(namespace=attempt.namespace, name=attempt.vm_name)

    def detail() -> str:
        parts = [problem] if (problem := status.vm_problem(vm)) else []
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
