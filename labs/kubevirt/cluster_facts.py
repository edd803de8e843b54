"""What preflight reads from the cluster (``gather``: /version, the KubeVirt CR, the nodes, the tenant namespaces and
whether the portal may manage them), with trouble met while reading already turned into findings."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.utils.translation import gettext as _
from kubernetes.client import VersionApi

from labs.kubevirt import client
from labs.kubevirt.operations import ClusterError, access_refusal, api_call

ERROR = "error"
WARNING = "warning"
INFO = "info"


@dataclass(frozen=True)
class Finding:
    level: str
    code: str
    message: str
    fix: str = ""


@dataclass
class ClusterFacts:
    server_version: str = ""
    kubevirt: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)
    # The tenant namespaces as the cluster has them, and those the portal may not manage (namespace, tenant, said).
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    forbidden: list[tuple[str, str, str]] = field(default_factory=list)
    # Problems met while reading (unreachable API, missing permission), already as findings.
    problems: list[Finding] = field(default_factory=list)


def _read(doing: str, api: Callable[[], Any], method: str, *args: Any, **kwargs: Any) -> Any:
    """``api_call`` on ``api()``, with anything else raised (a kubeconfig that cannot be loaded too) reported as a
    ``ClusterError``: a finding."""
    try:
        return api_call(doing, api(), method, *args, **kwargs)
    except ClusterError:
        raise
    except Exception as exc:
        raise ClusterError(f"{doing}: {exc.__class__.__name__}: {exc}") from exc


def gather() -> ClusterFacts:
    """Read the cluster; never raises for cluster trouble: it is a finding."""
    facts = ClusterFacts()
    try:
        version = _read("reading /version", lambda: VersionApi(client.api_client()), "get_code")
        facts.server_version = version.get("gitVersion", "")
    except ClusterError as error:
        facts.problems.append(
            Finding(
                ERROR,
                "unreachable",
                _("Cannot talk to the cluster API: %(error)s") % {"error": error.message},
                _("Check KUBECONFIG (or the in-cluster service account) and that the API server is reachable.")
                if settings.KUBECONFIG or os.environ.get("KUBERNETES_SERVICE_HOST")
                else _(
                    "No KUBECONFIG is set, so this is the embedded kubesim, which runs only while the portal does: "
                    "start bin/run (with the same PORTAL_VAR_DIR), or set KUBECONFIG for another cluster."
                ),
            )
        )
        return facts
    try:
        facts.kubevirt = _read_kubevirt()
    except ClusterError as unreadable:
        facts.problems.append(
            Finding(
                ERROR,
                "kubevirt_unreadable",
                _("Cannot read the KubeVirt resource: %(error)s") % {"error": unreadable.message},
                _("Grant the portal get/list on kubevirts.kubevirt.io, or check that KubeVirt is installed."),
            )
        )
    try:
        facts.nodes = list(_read("listing nodes", client.core_v1, "list_node").get("items") or [])
    except ClusterError as error:
        facts.problems.append(
            Finding(
                WARNING,
                "nodes_unreadable",
                _(
                    "Cannot list the cluster's nodes, so KVM support and the container runtime are not checked: "
                    "%(error)s"
                )
                % {"error": error.message},
                _("Grant the portal's service account list on nodes to enable these checks."),
            )
        )
    _read_tenant_namespaces(facts)
    return facts


def _read_kubevirt() -> dict[str, Any] | None:
    """The KubeVirt CR: listed cluster-wide, or in ``settings.KUBEVIRT_NAMESPACE`` when that is all RBAC allows."""
    api = client.custom_objects
    kubevirt = (client.KUBEVIRT_GROUP, client.KUBEVIRT_VERSION)
    doing = "listing KubeVirt resources"
    try:
        answer = _read(doing, api, "list_cluster_custom_object", *kubevirt, "kubevirts")
    except ClusterError as error:
        if error.status not in (401, 403):
            raise
        answer = _read(doing, api, "list_namespaced_custom_object", *kubevirt, settings.KUBEVIRT_NAMESPACE, "kubevirts")
    items = answer.get("items") or []
    return items[0] if items else None


def _read_tenant_namespaces(facts: ClusterFacts) -> None:
    """Every tenant's namespace, set up or not: its Pod Security labels, and whether the portal may manage it."""
    from labs.models import TenantNamespace
    from portal.models import Tenant

    try:
        recorded = dict(TenantNamespace.objects.values_list("namespace", "tenant__name"))
        # A tenant that never started a lab has no row yet: its namespace is where its first Start would go.
        for namespace, tenant in Tenant.objects.filter(cluster_namespace__isnull=True).values_list("namespace", "name"):
            recorded.setdefault(namespace, tenant)
    except DatabaseError as exc:
        unchecked = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        facts.problems.append(
            Finding(
                INFO,
                "namespaces_unchecked",
                _("Tenant namespaces were not checked: the portal's database cannot be read (%(error)s).")
                % {"error": unchecked},
                _("Run the check again once the database is migrated."),
            )
        )
        return
    core = client.core_v1
    for namespace, tenant in sorted(recorded.items()):
        try:
            said = access_refusal(namespace)
        except ClusterError as unanswered:
            facts.problems.append(
                Finding(
                    WARNING,
                    "namespace_access_unchecked",
                    _("Cannot ask the cluster whether the portal may manage tenant namespace %(namespace)s: %(error)s")
                    % {"namespace": namespace, "error": unanswered.message},
                    _(
                        "Every authenticated user may create SelfSubjectAccessReviews (system:basic-user): check that "
                        "the cluster's RBAC still binds it."
                    ),
                )
            )
        else:
            if said is not None:
                facts.forbidden.append((namespace, tenant, said))
        try:
            facts.namespaces.append(_read(f"reading namespace {namespace}", core, "read_namespace", namespace))
        except ClusterError as error:
            if error.status != 404:  # not made yet: the portal creates it, with the right labels
                facts.problems.append(
                    Finding(
                        WARNING,
                        "namespace_unreadable",
                        _(
                            "Cannot read tenant namespace %(namespace)s, so its Pod Security level is not checked: "
                            "%(error)s"
                        )
                        % {"namespace": namespace, "error": error.message},
                        _("Grant the portal's service account get on namespaces."),
                    )
                )
