"""What the preflight reads about each tenant namespace, every tenant's whether set up or not: its Pod Security
labels, and whether the tenant's Role (applied by a cluster admin) lets the portal manage its objects, asked with
SelfSubjectAccessReviews (``access.refusal``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError

from labs.kubevirt import access, client
from labs.kubevirt.operations import REQUEST_TIMEOUT, ClusterError, cluster_error


@dataclass
class TenantNamespaceFacts:
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    # (namespace, what the cluster said) for a namespace the portal could not read.
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    # (namespace, tenant name, what the cluster said) for a namespace whose objects the portal may not manage.
    forbidden: list[tuple[str, str, str]] = field(default_factory=list)
    # (namespace, what the cluster said) for a namespace the cluster could not answer the access review of.
    unreviewed: list[tuple[str, str]] = field(default_factory=list)
    # Why no namespace was checked (the portal's database cannot be read, e.g. before migrate), or "".
    unchecked: str = ""


def _error(exc: Exception, doing: str) -> ClusterError:
    try:
        return cluster_error(exc, doing=doing)
    except Exception as other:  # anything else the client raised is still reported, not a traceback
        return ClusterError(f"{doing}: {other.__class__.__name__}: {other}")


def read() -> TenantNamespaceFacts:
    from labs.models import TenantNamespace
    from portal.models import Tenant

    facts = TenantNamespaceFacts()
    try:
        recorded = dict(TenantNamespace.objects.values_list("namespace", "tenant__name"))
        # A tenant that never started a lab has no row yet: its namespace is where its first Start would go.
        for namespace, tenant in Tenant.objects.filter(cluster_namespace__isnull=True).values_list("namespace", "name"):
            recorded.setdefault(namespace, tenant)
    except DatabaseError as exc:
        facts.unchecked = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        return facts
    core = client.core_v1()
    for namespace, tenant in sorted(recorded.items()):
        try:
            said = access.refusal(namespace)
        except ClusterError as unanswered:
            facts.unreviewed.append((namespace, unanswered.message))
        else:
            if said is not None:
                facts.forbidden.append((namespace, tenant, said))
        try:
            response = core.read_namespace(namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            error = _error(exc, f"reading namespace {namespace}")
            if error.status != 404:  # not made yet: the portal creates it, with the right labels
                facts.unreadable.append((namespace, error.message))
            continue
        facts.namespaces.append(json.loads(response.data))
    return facts
