"""The tenant's namespace on the cluster (namespace, NetworkPolicies, ResourceQuota), made again when its settings
change or it was deleted; whether the cluster lets the portal in (a new tenant's Role may not be applied yet)."""

from __future__ import annotations

import hashlib
import json

from django.conf import settings
from django.utils import timezone

from labs.kubevirt import manifests, operations
from labs.kubevirt.operations import RBAC_SIGNATURE, ClusterError
from labs.models import TenantNamespace
from portal.models import Tenant

# Tenant id -> digest of the objects this process applied (a namespace deleted since makes the next create force it).
_applied_digests: dict[int, str] = {}


def tenant_namespace_ensure(*, tenant: Tenant, force: bool = False) -> bool:
    """Create the tenant's namespace objects unless the same were applied already; True when it asked the cluster."""
    namespace = manifests.namespace(name=tenant.namespace, tenant_id=tenant.id)
    policies = manifests.network_policies(
        namespace=tenant.namespace,
        tenant_id=tenant.id,
        agent_port=settings.AGENT_PORT,
        kubevirt_namespace=settings.KUBEVIRT_NAMESPACE,
        portal_namespace=settings.PORTAL_NAMESPACE,
    )
    quota = manifests.resource_quota(
        namespace=tenant.namespace,
        tenant_id=tenant.id,
        max_vms=tenant.max_concurrent_vms,
        max_vcpus=tenant.max_vcpus,
        max_memory_mib=tenant.max_memory_mib,
    )
    digest = hashlib.sha256(json.dumps([namespace, policies, quota], sort_keys=True).encode()).hexdigest()
    if not force and _applied_digests.get(tenant.id) == digest:
        return False
    # get_or_create retries the read when two provisions of the tenant's first attempts race to create the row.
    row, _created = TenantNamespace.objects.get_or_create(tenant=tenant, defaults={"namespace": tenant.namespace})
    if not force and row.bootstrapped_at is not None and row.bootstrap_digest == digest:
        _applied_digests[tenant.id] = digest
        return False
    _applied_digests.pop(tenant.id, None)
    operations.namespace_bootstrap(namespace=namespace, policies=policies, quota=quota)
    TenantNamespace.objects.filter(pk=row.pk).update(bootstrapped_at=timezone.now(), bootstrap_digest=digest)
    _applied_digests[tenant.id] = digest
    return True


# A namespace known to refuse the portal is asked about again by the first Start after this long.
NOT_READY_RECHECK_SECONDS = 30
# Tenants whose namespace this process found open to the portal by review, before any provisioning set it up.
_reviewed_ready: set[int] = set()


def is_rbac_refusal(error: ClusterError) -> bool:
    return error.status == 403 and RBAC_SIGNATURE in error.message


def is_refusal_record(text: str) -> bool:
    """Whether a namespace's recorded error says the cluster refuses the portal there (a 403 or a review)."""
    return RBAC_SIGNATURE in text or operations.REVIEW_REFUSAL in text


def tenant_namespace_refused(*, namespace: str, said: str) -> None:
    """Record that RBAC refuses the portal in the namespace: Starts are refused until the tenant's Role is applied."""
    tenant = Tenant.objects.filter(namespace=namespace).only("id", "namespace").first()
    if tenant is not None:
        _reviewed_ready.discard(tenant.id)
        TenantNamespace.objects.update_or_create(
            tenant=tenant, defaults={"namespace": namespace, "last_error": said[:2000], "last_error_at": timezone.now()}
        )


def tenant_namespace_ready(*, tenant: Tenant) -> bool:
    """False while the cluster refuses the portal in the namespace (asked once per process, a refusal again later)."""
    row = TenantNamespace.objects.filter(tenant=tenant).values("bootstrapped_at", "last_error", "last_error_at").first()
    refused = row is not None and is_refusal_record(row["last_error"])
    if not refused and (tenant.id in _reviewed_ready or (row is not None and row["bootstrapped_at"] is not None)):
        return True
    if refused and row is not None and row["last_error_at"] is not None:
        if (timezone.now() - row["last_error_at"]).total_seconds() < NOT_READY_RECHECK_SECONDS:
            return False
    try:
        said = operations.access_refusal(tenant.namespace)
    except ClusterError:
        return True
    if said is not None:
        tenant_namespace_refused(namespace=tenant.namespace, said=said)
        return False
    _reviewed_ready.add(tenant.id)
    if refused:
        TenantNamespace.objects.filter(tenant=tenant).update(last_error="")
    return True
