"""What preflight reads from the cluster (``gather``: /version, the KubeVirt CR, the nodes, the tenant namespaces),
with trouble met while reading already turned into findings."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils.translation import gettext as _

from labs.kubevirt import client, tenant_namespaces
from labs.kubevirt.operations import REQUEST_TIMEOUT, ClusterError, cluster_error

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
    # The tenant namespaces the portal knows of, as the cluster has them, and those whose objects it may not manage
    # (namespace, tenant name, what the cluster said).
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    forbidden: list[tuple[str, str, str]] = field(default_factory=list)
    # Problems met while reading (unreachable API, missing permission), already as findings.
    problems: list[Finding] = field(default_factory=list)


def parse_version(text: str) -> tuple[int, int, int] | None:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def gather() -> ClusterFacts:
    """Read the server version, the KubeVirt CR and the nodes. Never raises for cluster trouble: it is a finding."""
    facts = ClusterFacts()
    try:
        response = client.version_api().get_code(_preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        facts.server_version = json.loads(response.data).get("gitVersion", "")
    except Exception as exc:
        error = _as_cluster_error(exc, doing="reading /version")
        facts.problems.append(
            Finding(
                ERROR,
                "unreachable",
                _("Cannot talk to the cluster API: %(error)s") % {"error": error.message},
                _("Check KUBECONFIG (or the in-cluster service account) and that the API server is reachable."),
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
        response = client.core_v1().list_node(_preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        facts.nodes = list(json.loads(response.data).get("items") or [])
    except Exception as exc:
        error = _as_cluster_error(exc, doing="listing nodes")
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
    tenants = tenant_namespaces.read()
    facts.namespaces = tenants.namespaces
    facts.forbidden = tenants.forbidden
    facts.problems.extend(
        Finding(
            WARNING,
            "namespace_unreadable",
            _("Cannot read tenant namespace %(namespace)s, so its Pod Security level is not checked: %(error)s")
            % {"namespace": name, "error": said},
            _("Grant the portal's service account get on namespaces."),
        )
        for name, said in tenants.unreadable
    )
    facts.problems.extend(
        Finding(
            WARNING,
            "namespace_access_unchecked",
            _("Cannot ask the cluster whether the portal may manage tenant namespace %(namespace)s: %(error)s")
            % {"namespace": name, "error": said},
            _(
                "Every authenticated user may create SelfSubjectAccessReviews (system:basic-user): check that "
                "the cluster's RBAC still binds it."
            ),
        )
        for name, said in tenants.unreviewed
    )
    if tenants.unchecked:
        facts.problems.append(
            Finding(
                INFO,
                "namespaces_unchecked",
                _("Tenant namespaces were not checked: the portal's database cannot be read (%(error)s).")
                % {"error": tenants.unchecked},
                _("Run the check again once the database is migrated."),
            )
        )
    return facts


def _as_cluster_error(exc: Exception, *, doing: str) -> ClusterError:
    try:
        return cluster_error(exc, doing=doing)
    except Exception as other:  # anything else the client raised still ends up as a finding, not a traceback
        return ClusterError(f"{doing}: {other.__class__.__name__}: {other}")


def _read_kubevirt() -> dict[str, Any] | None:
    """The KubeVirt CR: listed cluster-wide, or in ``settings.KUBEVIRT_NAMESPACE`` when that is all RBAC allows."""
    api = client.custom_objects()
    try:
        response = api.list_cluster_custom_object(
            client.KUBEVIRT_GROUP,
            client.KUBEVIRT_VERSION,
            "kubevirts",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
    except Exception as exc:
        error = _as_cluster_error(exc, doing="listing KubeVirt resources")
        if error.status not in (401, 403):
            raise error from exc
        try:
            response = api.list_namespaced_custom_object(
                client.KUBEVIRT_GROUP,
                client.KUBEVIRT_VERSION,
                settings.KUBEVIRT_NAMESPACE,
                "kubevirts",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except Exception as inner:
            raise _as_cluster_error(inner, doing="listing KubeVirt resources") from inner
    items = json.loads(response.data).get("items") or []
    return items[0] if items else None
