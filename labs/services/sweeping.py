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
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone

from labs.kubevirt import names, operations
from labs.kubevirt.operations import ClusterError
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt, TenantNamespace
from labs.services.namespaces import is_rbac_refusal, tenant_namespace_refused
from labs.services.pool_sweeping import is_pool_vm, pool_secrets_sweep, pool_vms_sweep
from labs.services.stuck_attempts import attempt_sweep, requeue_requested
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
        attempt_sweep(attempt=attempt, vm=found, listed_at=listed_at, now=now, report=report)
    TenantNamespace.objects.filter(namespace=namespace).update(swept_at=timezone.now())
