"""The sweep: the database and the cluster compared both ways, so nothing leaks and nothing stays stuck.

Per tenant namespace, one list of the portal's VMs and, every ten minutes, one of its Secrets (label-selected: an
object without the portal's ``managed-by`` label is never read, let alone deleted); tenants with no attempt active
or ended in the last hour only every ten minutes. Then:

- a VM of ours whose attempt is not active (or unknown to this database) is deleted, with its Secret; a warm
  pool's VM is kept while its pool holds it or its attempt is active (``labs.services.pool_sweeping``);
- an attempt starting or running whose VM has vanished fails, saying so;
- an attempt still starting after ``ATTEMPT_START_TIMEOUT_SECONDS`` fails with what the cluster says (the VM's
  printable status, the last problem seen, Warning events) and its VM is deleted;
- a stopping attempt whose VM is gone ends, freeing its quota; one whose teardown seems lost is torn down again;
- work whose task was lost (broker restarted, worker killed mid-provision) is queued again.
"""

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
from django.utils.translation import gettext as _

from labs.kubevirt import names, operations, status
from labs.kubevirt.operations import ClusterError
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt, AttemptState, TenantNamespace
from labs.services.namespaces import is_rbac_refusal, tenant_namespace_refused
from labs.services.pool_sweeping import is_pool_vm, pool_secrets_sweep, pool_vms_sweep
from labs.services.provisioning import attempt_end, attempt_fail
from labs.wording import with_cluster_words
from portal.models import Tenant

logger = logging.getLogger(__name__)


IDLE_SWEEP_KEY = "labs:sweep-idle:{namespace}"
IDLE_SWEEP_SECONDS = 600
CLOUD_INIT_SWEEP_KEY = "labs:sweep-secrets:{namespace}"
CLOUD_INIT_SWEEP_SECONDS = 600
# A tenant whose last attempt ended this recently is still swept every time.
RECENT_ACTIVITY_SECONDS = 3600


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


def provision_redelivery_seconds() -> int:
    """How long provisioning may look stuck before it is queued again: past the task's hard time limit."""
    return max(60, settings.ATTEMPT_TASK_SOFT_TIME_LIMIT_SECONDS + 60)


def teardown_redelivery_seconds() -> int:
    """A teardown grades first (up to the checks' timeouts), so it is given the whole task time limit."""
    return max(120, settings.CELERY_TASK_TIME_LIMIT + 60)


def attempts_sweep(*, now: datetime | None = None) -> SweepReport:
    now = now or timezone.now()
    report = SweepReport()
    recent = now - timedelta(seconds=RECENT_ACTIVITY_SECONDS)
    busy = set(
        Attempt.objects.filter(Q(state__in=ACTIVE_STATES) | Q(ended_at__gte=recent)).values_list("tenant_id", flat=True)
    )
    for tenant in Tenant.objects.all().only("id", "namespace"):
        # A tenant with nothing going on is swept less often: an orphan there can only come from a lost
        # database or a hand-made VM, and every request counts against the API budget.
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


def requeue_requested(*, report: SweepReport, now: datetime) -> None:
    """Attempts still ``requested`` long after they were made: their provisioning task never arrived. It is queued
    again; one still unserved after the start timeout fails, so that no attempt waits in ``requested`` forever."""
    from labs.tasks import provision_attempt

    timeout = settings.ATTEMPT_START_TIMEOUT_SECONDS
    given_up = now - timedelta(seconds=timeout)

    def reason() -> str:
        return _(
            "The lab did not start: the portal's task queue did not pick it up within %(minutes)d minutes. "
            "Start it again; this attempt does not count against your limit."
        ) % {"minutes": max(1, timeout // 60)}

    for attempt_id in Attempt.objects.filter(state=AttemptState.REQUESTED, requested_at__lt=given_up).values_list(
        "id", flat=True
    ):
        if attempt_fail(attempt_id=attempt_id, reason=reason, from_states=(AttemptState.REQUESTED,)):
            report.timed_out.append(attempt_id)
    cutoff = now - timedelta(seconds=provision_redelivery_seconds())
    for attempt_id in Attempt.objects.filter(state=AttemptState.REQUESTED, requested_at__lt=cutoff).values_list(
        "id", flat=True
    ):
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


def _ours(vm: dict[str, Any]) -> int | None:
    """The attempt id of one of our VMs; None (and left alone) if its name and labels do not agree."""
    metadata = vm.get("metadata") or {}
    attempt_id = names.attempt_id_from_labels(metadata.get("labels"))
    if attempt_id is None or names.attempt_id_from_vm_name(metadata.get("name", "")) != attempt_id:
        logger.warning(
            "VM %s/%s carries the portal's label but no matching attempt label; leaving it alone",
            metadata.get("namespace"),
            metadata.get("name"),
        )
        return None
    return attempt_id


def namespace_sweep(*, tenant: Tenant, report: SweepReport, now: datetime) -> None:
    namespace = tenant.namespace
    listed_at = timezone.now()
    listed = operations.vms_list(namespace=namespace)
    vms = {vm["metadata"]["name"]: vm for vm in listed if not is_pool_vm(vm) and _ours(vm) is not None}
    claimed = pool_vms_sweep(
        tenant=tenant, listed=[vm for vm in listed if is_pool_vm(vm)], orphans=report.orphan_vms_deleted
    )
    # Secrets are owned by their VM (garbage-collected with it); only one made just before a crash can be left
    # behind, so they are listed now and then rather than on every sweep.
    secrets = []
    if cache.add(CLOUD_INIT_SWEEP_KEY.format(namespace=namespace), "1", timeout=CLOUD_INIT_SWEEP_SECONDS):
        secrets = operations.secrets_list(namespace=namespace)
    attempt_ids = {names.attempt_id_from_vm_name(name) for name in vms}
    attempt_ids |= {names.attempt_id_from_labels((s.get("metadata") or {}).get("labels")) for s in secrets}
    known: dict[int | None, Attempt] = {
        a.id: a
        for a in Attempt.objects.filter(id__in=[i for i in attempt_ids if i is not None]).only(
            "id", "state", "namespace", "tenant_id", "vm_deleted_at", "vm_name"
        )
    }

    for name, vm in vms.items():
        attempt = known.get(names.attempt_id_from_vm_name(name))
        if attempt is not None and attempt.state in ACTIVE_STATES and attempt.tenant_id == tenant.id:
            continue
        if (vm.get("metadata") or {}).get("deletionTimestamp"):
            continue  # already going
        operations.vm_delete(namespace=namespace, name=name)
        operations.secret_delete(namespace=namespace, name=names.cloud_init_secret_name(name))
        if attempt is not None and attempt.state in FINAL_STATES:
            Attempt.objects.filter(id=attempt.id, vm_deleted_at__isnull=True).update(vm_deleted_at=timezone.now())
        report.orphan_vms_deleted.append(f"{namespace}/{name}")
        logger.info("sweep: deleted VM %s/%s, which no active attempt owns", namespace, name)

    for secret in secrets:
        metadata = secret.get("metadata") or {}
        attempt_id = names.attempt_id_from_labels(metadata.get("labels"))
        if attempt_id is None or names.cloud_init_secret_name(names.vm_name(attempt_id)) != metadata.get("name"):
            continue
        attempt = known.get(attempt_id)
        if attempt is not None and attempt.state in ACTIVE_STATES and attempt.tenant_id == tenant.id:
            continue
        if names.vm_name(attempt_id) in vms:
            continue  # deleted with its VM above
        if operations.secret_delete(namespace=namespace, name=metadata["name"]):
            report.orphan_secrets_deleted.append(f"{namespace}/{metadata['name']}")
    pool_secrets_sweep(
        tenant=tenant,
        secrets=secrets,
        vm_names={vm["metadata"]["name"] for vm in listed},
        orphans=report.orphan_secrets_deleted,
        now=now,
    )

    for attempt in Attempt.objects.filter(tenant=tenant, state__in=ACTIVE_STATES).select_related("lab"):
        found = vms.get(attempt.vm_name) or claimed.get(attempt.vm_name)
        _sweep_attempt(attempt=attempt, vm=found, listed_at=listed_at, now=now, report=report)
    TenantNamespace.objects.filter(namespace=namespace).update(swept_at=timezone.now())


def _sweep_attempt(
    *, attempt: Attempt, vm: dict[str, Any] | None, listed_at: datetime, now: datetime, report: SweepReport
) -> None:
    from labs.tasks import provision_attempt, teardown_attempt

    provision_cutoff = now - timedelta(seconds=provision_redelivery_seconds())
    if attempt.state == AttemptState.PROVISIONING:
        timeout = settings.ATTEMPT_START_TIMEOUT_SECONDS
        if attempt.requested_at < now - timedelta(seconds=timeout):
            # Queued again sweep after sweep and still not through: say so instead of retrying for ever.
            if attempt_fail(
                attempt_id=attempt.id,
                reason=lambda: _start_timed_out(timeout),
                from_states=(AttemptState.PROVISIONING,),
            ):
                report.timed_out.append(attempt.id)
        elif attempt.updated_at < provision_cutoff:
            _queue_again(provision_attempt, attempt.id, report=report)  # a worker died mid-provision
        return
    if attempt.state in (AttemptState.STARTING, AttemptState.RUNNING):
        made_before_list = attempt.provisioned_at is not None and attempt.provisioned_at < listed_at
        if vm is None and made_before_list:
            if attempt_fail(
                attempt_id=attempt.id,
                reason=lambda: _("The VM was deleted outside the portal."),
                from_states=(AttemptState.STARTING, AttemptState.RUNNING),
            ):
                report.vanished.append(attempt.id)
            return
        timeout = settings.ATTEMPT_START_TIMEOUT_SECONDS
        if attempt.state == AttemptState.STARTING and attempt.requested_at < now - timedelta(seconds=timeout):
            detail = start_failure_detail(attempt=attempt, vm_listed=vm is not None)

            def reason() -> str:
                return with_cluster_words(_start_timed_out(timeout), detail())

            if attempt_fail(attempt_id=attempt.id, reason=reason, from_states=(AttemptState.STARTING,)):
                report.timed_out.append(attempt.id)
        return
    if attempt.state == AttemptState.STOPPING:
        if vm is None:
            if attempt.vm_deleted_at is None:
                # Nothing to grade or delete; let the teardown (queued or lost) finish the bookkeeping.
                stale = now - timedelta(seconds=provision_redelivery_seconds())
                if attempt.stopping_at and attempt.stopping_at < stale and attempt_end(attempt_id=attempt.id):
                    report.ended.append(attempt.id)
                return
            if attempt_end(attempt_id=attempt.id):
                report.ended.append(attempt.id)
            return
        teardown_cutoff = now - timedelta(seconds=teardown_redelivery_seconds())
        since = attempt.vm_deleted_at or attempt.stopping_at
        if since is not None and since < teardown_cutoff and not (vm.get("metadata") or {}).get("deletionTimestamp"):
            _queue_again(teardown_attempt, attempt.id, report=report)


def _start_timed_out(timeout: int) -> str:
    return _("The VM did not start within %(minutes)d minutes.") % {"minutes": max(1, timeout // 60)}


def start_failure_detail(*, attempt: Attempt, vm_listed: bool) -> Callable[[], str]:
    """What the cluster says about a VM that would not start (printable status, last problem, Warning events), as a
    function that words it in the active language; the cluster is asked once, here. The sweep's list holds the VMs'
    metadata only: a VM it listed is read whole for its status."""
    vm = None
    if vm_listed:
        try:
            vm = operations.vm_get(namespace=attempt.namespace, name=attempt.vm_name)
        except ClusterError as error:
            logger.info("attempt %s: VM status unavailable (%s)", attempt.id, error.message)
    try:
        events = status.events_problem(operations.events_for(namespace=attempt.namespace, name=attempt.vm_name))
    except ClusterError as error:
        logger.info("attempt %s: events unavailable (%s)", attempt.id, error.message)
        events = ""

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
