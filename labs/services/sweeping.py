"""The sweep: the database and the cluster compared both ways, per tenant namespace, so nothing leaks and nothing
stays stuck. VMs and Secrets of the portal (label-selected: nobody else's is ever read) that no active attempt and
no warm pool holds are deleted; each active attempt is judged on its VM (``stuck_attempts``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from labs.kubevirt import names, operations
from labs.kubevirt.operations import ClusterError
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt, TenantNamespace
from labs.pool_models import POOL_HOLDING_STATES, PoolVm, PoolVmState
from labs.services.namespaces import is_rbac_refusal, tenant_namespace_refused
from labs.services.stuck_attempts import attempt_sweep, requeue_requested
from portal.models import Tenant

logger = logging.getLogger(__name__)

# A tenant with nothing going on is swept this often only (an orphan there can only come from a lost database or a
# hand-made VM); Secrets, which go with their VM but for one made just before a crash, are listed as often.
IDLE_SWEEP_KEY = "labs:sweep-idle:{namespace}"
IDLE_SWEEP_SECONDS = 600
CLOUD_INIT_SWEEP_KEY = "labs:sweep-secrets:{namespace}"
CLOUD_INIT_SWEEP_SECONDS = 600
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
    if cache.add(CLOUD_INIT_SWEEP_KEY.format(namespace=namespace), "1", timeout=CLOUD_INIT_SWEEP_SECONDS):
        secrets = operations.secrets_list(namespace=namespace)
    pool_rows = {
        row.id: row
        for row in PoolVm.objects.filter(
            id__in=[i for _vm, (kind, i) in owners.values() if kind == "pool"], tenant=tenant, namespace=namespace
        )
    }
    attempt_ids = {i for _vm, (kind, i) in owners.values() if kind == "attempt"}
    attempt_ids |= {row.attempt_id for row in pool_rows.values() if row.attempt_id}
    for secret in secrets:
        if (attempt_id := names.attempt_id_from_labels((secret.get("metadata") or {}).get("labels"))) is not None:
            attempt_ids.add(attempt_id)
    known = {
        a.id: a
        for a in Attempt.objects.filter(id__in=attempt_ids).only("id", "state", "tenant_id", "vm_deleted_at", "vm_name")
    }

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

    for attempt in Attempt.objects.filter(tenant=tenant, state__in=ACTIVE_STATES).select_related("lab"):
        attempt_sweep(attempt=attempt, vm=kept.get(attempt.vm_name), listed_at=listed_at, now=now, report=report)
    TenantNamespace.objects.filter(namespace=namespace).update(swept_at=timezone.now())


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
