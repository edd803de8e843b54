"""One call to the cluster API: a timeout, the answer as raw JSON, and Kubernetes' failures as ``ClusterError``
(``transient`` for what is worth retrying: 5xx, 429, a quota an old VM still holds, the connection failing)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import urllib3
from kubernetes.client.exceptions import ApiException

from labs.kubevirt import client

# (connect, read) seconds for ordinary requests.
REQUEST_TIMEOUT = (5, 20)
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
# Celery redelivers a task whose countdown outlasts the broker's visibility timeout, so a Retry-After is capped.
MAX_RETRY_AFTER_SECONDS = 60.0
# RBAC's refusal in a tenant namespace means its Role is not applied yet: the portal holds no RBAC rights to fix
# that, so the message says what to apply.
RBAC_SIGNATURE = 'is forbidden: User "'
RBAC_HINT = (
    " (the portal's Role is not applied in this namespace: a cluster admin applies the tenant's manifests, "
    'python manage.py tenant_manifests "<tenant name>" | kubectl apply -f -)'
)


class ClusterError(Exception):
    """The cluster refused or failed a request. ``transient`` errors are retried with backoff."""

    def __init__(
        self, message: str, *, status: int | None = None, transient: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.transient = transient
        self.retry_after = retry_after


def _count_error(*, doing: str, reason: str) -> None:
    """Count the failure for /metrics by the first two words of ``doing`` ("creating VM"), never the object's name."""
    from portal.metrics import record_cluster_api_error

    record_cluster_api_error(operation="_".join(doing.split()[:2]).lower(), reason=reason)


def cluster_error(exc: BaseException, *, doing: str) -> ClusterError:
    """The portal's view of a failed request: what was being done, what the cluster said, retry or not."""
    if isinstance(exc, ClusterError):
        return exc
    if isinstance(exc, ApiException):
        try:
            body = json.loads(exc.body) if exc.body else {}
        except (TypeError, ValueError):
            body = {}
        has_message = isinstance(body, dict) and body.get("message")
        message = str(body["message"]) if has_message else f"{exc.status} {exc.reason}".strip()
        status = exc.status or None
        # A ResourceQuota refusal (403 "exceeded quota") while a stopped VM is still terminating clears by itself.
        quota = status == 403 and "exceeded quota" in message
        if status == 403 and RBAC_SIGNATURE in message:
            message += RBAC_HINT
        try:
            retry_after = min(max(float((exc.headers or {})["Retry-After"]), 0.0), MAX_RETRY_AFTER_SECONDS)
        except (KeyError, ValueError):
            retry_after = None
        transient = status in TRANSIENT_STATUSES or status is None or quota
        _count_error(doing=doing, reason=str(status or "unknown"))
        return ClusterError(f"{doing}: {message}", status=status, transient=transient, retry_after=retry_after)
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError, TimeoutError)):
        _count_error(doing=doing, reason="connection")
        return ClusterError(f"{doing}: cannot reach the cluster API ({exc.__class__.__name__}: {exc})", transient=True)
    if isinstance(exc, client.ClusterNotConfigured):
        return ClusterError(f"{doing}: {exc}", transient=False)
    raise exc


def api_call(doing: str, api: Any, method: str, *args: Any, tolerate: int | None = None, **kwargs: Any) -> Any:
    """``api.<method>(*args, **kwargs)``'s JSON answer; None when the cluster answers ``tolerate`` (409 on a
    create, 404 on a read or delete: the success they mean for a call that is repeated)."""
    try:
        response = getattr(api, method)(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
    except Exception as exc:
        if tolerate is not None and isinstance(exc, ApiException) and exc.status == tolerate:
            return None
        raise cluster_error(exc, doing=doing) from exc
    return orjson.loads(response.data) if response.data else {}
