"""The sync loop's heartbeat and the cluster probe (``GET /version``, remembered a few seconds per process), which
the readiness probe (``ops.health``) and the student's cluster notice read. Messages are translated when read
(``say``): a remembered probe is shown in each reader's language."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import urllib3
from django.conf import settings
from django.core.cache import cache
from django.utils.functional import Promise, lazy
from django.utils.translation import gettext, gettext_noop
from django.utils.translation import gettext as _

logger = logging.getLogger(__name__)

# The contract with the lifecycle's sync task (labs.tasks): after each pass it stores the time it finished
# (epoch seconds, or an ISO 8601 string) under SYNC_LAST_SUCCESS_KEY; after a failed pass it stores
# {"at": <epoch seconds>, "message": <text>} under SYNC_LAST_ERROR_KEY. record_sync_success() and
# record_sync_error() write exactly that.
SYNC_LAST_SUCCESS_KEY = "labs:sync:last_success"
SYNC_LAST_ERROR_KEY = "labs:sync:last_error"
# Kept well past any sensible staleness limit, so that "stale" and "never ran" stay distinguishable.
SYNC_HEARTBEAT_TTL_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class ComponentStatus:
    """One component's readiness, described in words an operator can act on."""

    name: str
    ok: bool
    message: str | Promise
    latency_ms: float | None = None


def _translated(message: str, params: dict[str, object]) -> str:
    return gettext(message) % params if params else gettext(message)


_lazy_translated = lazy(_translated, str)


def say(message: str, **params: object) -> str | Promise:
    """``message`` (marked with ``gettext_noop``) with ``params``, translated whenever it is turned into text."""
    return _lazy_translated(message, params)


@dataclass(frozen=True)
class SyncHeartbeat:
    last_success: datetime | None
    last_error_at: datetime | None
    last_error_message: str


def _as_datetime(value: object) -> datetime | None:
    """Read a heartbeat timestamp written as epoch seconds, an ISO 8601 string, or a datetime."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), tz=UTC)
    if isinstance(value, str):
        try:
            return datetime.fromtimestamp(float(value), tz=UTC)
        except ValueError:
            pass
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def record_sync_success(*, at: datetime | None = None) -> None:
    """Called by the sync task after a pass that read the cluster and updated the attempts."""
    moment = at or datetime.now(tz=UTC)
    cache.set(SYNC_LAST_SUCCESS_KEY, moment.timestamp(), timeout=SYNC_HEARTBEAT_TTL_SECONDS)


def record_sync_error(*, message: str, at: datetime | None = None) -> None:
    """Called by the sync task when a pass failed; the message is for operators (dashboard, logs)."""
    moment = at or datetime.now(tz=UTC)
    cache.set(
        SYNC_LAST_ERROR_KEY,
        {"at": moment.timestamp(), "message": message[:500]},
        timeout=SYNC_HEARTBEAT_TTL_SECONDS,
    )


def sync_heartbeat() -> SyncHeartbeat:
    """The sync loop's last success and last error, as written to the shared cache. Raises if the cache is down."""
    values = cache.get_many([SYNC_LAST_SUCCESS_KEY, SYNC_LAST_ERROR_KEY])
    error = values.get(SYNC_LAST_ERROR_KEY)
    error_at: datetime | None = None
    error_message = ""
    if isinstance(error, dict):
        error_at = _as_datetime(error.get("at"))
        error_message = str(error.get("message") or "")
    elif error is not None:
        error_at = _as_datetime(error)
    return SyncHeartbeat(
        last_success=_as_datetime(values.get(SYNC_LAST_SUCCESS_KEY)),
        last_error_at=error_at,
        last_error_message=error_message,
    )


def elapsed_ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


_cluster_lock = threading.Lock()
_cluster_cached: tuple[float, str, ComponentStatus] | None = None


def reset_cluster_probe() -> None:
    """Forget the remembered cluster probe (tests, or after the cluster configuration changed)."""
    global _cluster_cached
    with _cluster_lock:
        _cluster_cached = None


def _probe_cluster(*, timeout: float) -> tuple[str, ComponentStatus]:
    """GET /version on the API server with the portal's credentials, no retries, within ``timeout`` seconds."""
    from labs.kubevirt import client as kube_client

    started = time.monotonic()
    try:
        api = kube_client.api_client()
    except kube_client.ClusterNotConfigured as exc:
        logger.warning("Readiness: %s", exc)
        return "", ComponentStatus(
            "cluster",
            False,
            say(gettext_noop("No cluster is configured (no in-cluster account and no readable kubeconfig).")),
        )
    cfg = api.configuration
    if cfg.refresh_api_key_hook is not None:  # bound service-account tokens rotate
        cfg.refresh_api_key_hook(cfg)
    headers = {"Accept": "application/json"}
    for auth in cfg.auth_settings().values():
        if auth.get("in") == "header" and auth.get("value"):
            headers[auth["key"]] = auth["value"]
    host = cfg.host.rstrip("/")
    try:
        response = api.rest_client.pool_manager.request(
            "GET",
            f"{host}/version",
            headers=headers,
            retries=False,
            timeout=urllib3.Timeout(connect=timeout, read=timeout),
        )
    except urllib3.exceptions.NewConnectionError as exc:  # a subclass of the timeout error, but a refusal
        _count_cluster_error(reason="connection")
        logger.warning("Readiness: cluster /version failed: %s", exc)
        return host, ComponentStatus(
            "cluster",
            False,
            say(gettext_noop("The cluster API is not reachable (the connection failed).")),
            elapsed_ms(started),
        )
    except urllib3.exceptions.TimeoutError as exc:
        _count_cluster_error(reason="timeout")
        logger.warning("Readiness: cluster /version timed out: %s", exc)
        return host, ComponentStatus(
            "cluster",
            False,
            say(gettext_noop("The cluster API did not answer within %(seconds)s seconds."), seconds=f"{timeout:g}"),
            elapsed_ms(started),
        )
    except urllib3.exceptions.HTTPError as exc:
        _count_cluster_error(reason="connection")
        logger.warning("Readiness: cluster /version failed: %s", exc)
        return host, ComponentStatus(
            "cluster",
            False,
            say(gettext_noop("The cluster API is not reachable (the connection failed).")),
            elapsed_ms(started),
        )
    elapsed = elapsed_ms(started)
    if response.status in (401, 403):
        _count_cluster_error(reason=str(response.status))
        return host, ComponentStatus(
            "cluster",
            False,
            say(
                gettext_noop("The cluster API refused the portal's credentials (HTTP %(status)s)."),
                status=response.status,
            ),
            elapsed,
        )
    if response.status != 200:
        _count_cluster_error(reason=str(response.status))
        return host, ComponentStatus(
            "cluster",
            False,
            say(gettext_noop("The cluster API answered with an error (HTTP %(status)s)."), status=response.status),
            elapsed,
        )
    return host, ComponentStatus("cluster", True, say(gettext_noop("The cluster API answered.")), elapsed)


def _count_cluster_error(*, reason: str) -> None:
    from portal.metrics import record_cluster_api_error

    record_cluster_api_error(operation="version", reason=reason)


def check_cluster(*, max_age: float | None = None) -> ComponentStatus:
    """The cluster probe's result, at most ``max_age`` seconds old (HEALTH_CLUSTER_CACHE_SECONDS by default).

    Remembered per process and per API server address, so a probe every second from several load balancers
    costs the API server one request every few seconds.
    """
    global _cluster_cached
    max_age = settings.HEALTH_CLUSTER_CACHE_SECONDS if max_age is None else max_age
    with _cluster_lock:
        cached = _cluster_cached
    if cached is not None and time.monotonic() - cached[0] < max_age:
        from labs.kubevirt import client as kube_client

        try:
            current_host = kube_client.configuration().host.rstrip("/")
        except kube_client.ClusterNotConfigured:
            current_host = ""
        if current_host == cached[1]:
            return cached[2]
    host, status = _probe_cluster(timeout=float(settings.HEALTH_CLUSTER_TIMEOUT_SECONDS))
    with _cluster_lock:
        _cluster_cached = (time.monotonic(), host, status)
    return status


def check_sync(*, now: datetime | None = None) -> ComponentStatus:
    """Whether the attempt sync loop (Celery beat → sync task) finished a pass recently."""
    now = now or datetime.now(tz=UTC)
    max_age = settings.HEALTH_SYNC_MAX_AGE_SECONDS
    try:
        beat = sync_heartbeat()
    except Exception as exc:  # the cache backend's connection errors have no common base class
        logger.warning("Readiness: cannot read the sync heartbeat: %s", exc)
        return ComponentStatus(
            "sync", False, say(gettext_noop("Cannot read the sync loop's heartbeat: the cache is not answering."))
        )
    if beat.last_success is None:
        if beat.last_error_at is not None:
            return ComponentStatus(
                "sync",
                False,
                say(
                    gettext_noop("The attempt sync loop has never succeeded; its last pass failed %(failed)s s ago."),
                    failed=_seconds_ago(now, beat.last_error_at),
                ),
            )
        return ComponentStatus(
            "sync",
            False,
            say(gettext_noop("The attempt sync loop has not run yet (is the Celery worker and beat running?).")),
        )
    age = (now - beat.last_success).total_seconds()
    error_at = beat.last_error_at
    failed_since = error_at is not None and error_at > beat.last_success
    succeeded = _seconds_ago(now, beat.last_success)
    failed = _seconds_ago(now, error_at) if error_at is not None and failed_since else None
    if age > max_age:
        if failed_since:
            return ComponentStatus(
                "sync",
                False,
                say(
                    gettext_noop(
                        "The attempt sync loop last succeeded %(succeeded)s s ago (limit %(limit)s s); its "
                        "last pass failed %(failed)s s ago."
                    ),
                    succeeded=succeeded,
                    limit=max_age,
                    failed=failed,
                ),
            )
        return ComponentStatus(
            "sync",
            False,
            say(
                gettext_noop("The attempt sync loop last succeeded %(succeeded)s s ago (limit %(limit)s s)."),
                succeeded=succeeded,
                limit=max_age,
            ),
        )
    if failed_since:
        return ComponentStatus(
            "sync",
            True,
            say(
                gettext_noop(
                    "The attempt sync loop succeeded %(succeeded)s s ago. Its last pass failed %(failed)s s ago."
                ),
                succeeded=succeeded,
                failed=failed,
            ),
        )
    return ComponentStatus(
        "sync", True, say(gettext_noop("The attempt sync loop succeeded %(succeeded)s s ago."), succeeded=succeeded)
    )


def _seconds_ago(now: datetime, then: datetime) -> int:
    return max(0, int((now - then).total_seconds()))


CLUSTER_NOT_ANSWERING = "cluster"
SYNC_DELAYED = "sync"


def cluster_trouble() -> str | None:
    """``CLUSTER_NOT_ANSWERING``, ``SYNC_DELAYED`` or None when all is well.

    Reads only the remembered cluster probe (refreshed at most every few seconds) and the sync heartbeat, so a
    page can call it on every render.
    """
    if not check_cluster().ok:
        return CLUSTER_NOT_ANSWERING
    if not check_sync().ok:
        return SYNC_DELAYED
    return None


def cluster_health_summary() -> str | None:
    """A sentence for a page with no attempt in it when the cluster is in trouble, or None when all is well (a
    student's attempt has its own words: ``labs.wording.cluster_notice``)."""
    trouble = cluster_trouble()
    if trouble == CLUSTER_NOT_ANSWERING:
        return _("The cluster is not answering; your lab may be slow to start.")
    if trouble == SYNC_DELAYED:
        return sync_delayed_notice()
    return None


def sync_delayed_notice() -> str:
    return _("Lab status updates are delayed; what you see here may be out of date for a while.")
