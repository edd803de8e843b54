"""The sweep's view of warm pools' VMs (``pool-<id>``): an unclaimed one whose pool row holds it is left alone,
a claimed one belongs to its attempt while that is active, and anything else of that name is an orphan. So is a
pool Secret whose VM was never made and that no pool row holds."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from labs.kubevirt import names, operations
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt
from labs.pool_models import POOL_HOLDING_STATES, PoolVm, PoolVmState
from portal.models import Tenant

logger = logging.getLogger(__name__)

# A pool Secret younger than this is left alone: its VM may be being made right now.
POOL_SECRET_MIN_AGE = timedelta(minutes=10)


def is_pool_vm(vm: dict[str, Any]) -> bool:
    return names.pool_vm_id_from_vm_name((vm.get("metadata") or {}).get("name", "")) is not None


def pool_vms_sweep(*, tenant: Tenant, listed: list[dict[str, Any]], orphans: list[str]) -> dict[str, dict[str, Any]]:
    """Delete the orphans among the listed pool VMs of ``tenant`` (their names appended to ``orphans``); return
    the claimed ones that active attempts own, by name, for the sweep's look at those attempts."""
    namespace = tenant.namespace
    by_id: dict[int, dict[str, Any]] = {}
    for vm in listed:
        metadata = vm.get("metadata") or {}
        pool_vm_id = names.pool_vm_id_from_vm_name(metadata.get("name", ""))
        if pool_vm_id is None or names.pool_vm_id_from_labels(metadata.get("labels")) != pool_vm_id:
            logger.warning(
                "VM %s/%s: its name and pool label disagree; leaving it alone", namespace, metadata.get("name")
            )
            continue
        by_id[pool_vm_id] = vm
    rows = {row.id: row for row in PoolVm.objects.filter(id__in=list(by_id))}
    attempts = {
        a.id: a
        for a in Attempt.objects.filter(id__in=[r.attempt_id for r in rows.values() if r.attempt_id]).only(
            "id", "state", "tenant_id", "vm_name"
        )
    }
    owned: dict[str, dict[str, Any]] = {}
    for pool_vm_id, vm in by_id.items():
        row = rows.get(pool_vm_id)
        name = vm["metadata"]["name"]
        if row is not None and row.tenant_id == tenant.id and row.namespace == namespace:
            if row.state in POOL_HOLDING_STATES:
                continue
            attempt = attempts.get(row.attempt_id) if row.attempt_id else None
            if row.state == PoolVmState.CLAIMED and attempt is not None and attempt.vm_name == name:
                if attempt.state in ACTIVE_STATES and attempt.tenant_id == tenant.id:
                    owned[name] = vm
                    continue
                if attempt.state in FINAL_STATES:
                    Attempt.objects.filter(id=attempt.id, vm_deleted_at__isnull=True).update(
                        vm_deleted_at=timezone.now()
                    )
        if vm["metadata"].get("deletionTimestamp"):
            continue
        operations.vm_delete(namespace=namespace, name=name)
        operations.secret_delete(namespace=namespace, name=names.cloud_init_secret_name(name))
        orphans.append(f"{namespace}/{name}")
        logger.info("sweep: deleted pool VM %s/%s, which neither its pool nor an active attempt holds", namespace, name)
    return owned


def pool_secrets_sweep(
    *, tenant: Tenant, secrets: list[dict[str, Any]], vm_names: set[str], orphans: list[str], now: datetime
) -> None:
    """Delete the pool Secrets of ``tenant`` (listed by their metadata) that have no VM, that no unclaimed pool row
    holds and that are older than ``POOL_SECRET_MIN_AGE``; their names are appended to ``orphans``. A Secret whose
    VM was made is owned by it and goes with it."""
    namespace = tenant.namespace
    candidates: dict[int, dict[str, Any]] = {}
    for secret in secrets:
        metadata = secret.get("metadata") or {}
        pool_vm_id = names.pool_vm_id_from_labels(metadata.get("labels"))
        if pool_vm_id is None:
            continue
        vm_name = names.pool_vm_name(pool_vm_id)
        if metadata.get("name") != names.cloud_init_secret_name(vm_name) or vm_name in vm_names:
            continue
        created = parse_datetime(metadata.get("creationTimestamp") or "")
        if created is None or created > now - POOL_SECRET_MIN_AGE or metadata.get("deletionTimestamp"):
            continue
        candidates[pool_vm_id] = metadata
    held = set(
        PoolVm.objects.filter(
            id__in=list(candidates), tenant=tenant, namespace=namespace, state__in=POOL_HOLDING_STATES
        ).values_list("id", flat=True)
    )
    for pool_vm_id, metadata in candidates.items():
        if pool_vm_id in held:
            continue
        if operations.secret_delete(namespace=namespace, name=metadata["name"]):
            orphans.append(f"{namespace}/{metadata['name']}")
            logger.info("sweep: deleted pool Secret %s/%s, whose VM was never made", namespace, metadata["name"])
