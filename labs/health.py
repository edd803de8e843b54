"""Readiness in words: a component's status, and the cluster probe (``GET /version``, remembered a few seconds per
process). Messages are translated when read (``say``). The sync loop's heartbeat is in ``labs.sync_health``."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import urllib3
from django.conf import settings
from django.utils.functional import Promise, lazy
from django.utils.translation import gettext, gettext_noop

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ComponentStatus:
    """One component's readiness, described in words an operator can act on."""

    name: str
    ok: bool
    message: str | Promise
    latency_ms: float | None = None


def _say(message: str, **params: object) -> str:
    return gettext(message) % params if params else gettext(message)


# ``message`` (marked with ``gettext_noop``) with ``params``, translated whenever it is turned into text.
say = lazy(_say, str)


def elapsed_ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


_cluster_cached: tuple[float, str, ComponentStatus] | None = None


def reset_cluster_probe() -> None:
    """Forget the remembered cluster probe (tests, or after the cluster configuration changed)."""
    global _cluster_cached
    _cluster_cached = None


def _probe_cluster(*, timeout: float) -> tuple[str, ComponentStatus]:
    """GET /version on the API server with the portal's credentials, no retries, within ``timeout`` seconds."""
    from labs.kubevirt import client as kube_client
    from portal.metrics import record_cluster_api_error

    started = time.monotonic()
    try:
        api = kube_client.api_client()
    except kube_client.ClusterNotConfigured as exc:
        logger.warning("Readiness: %s", exc)
        message = say(gettext_noop("No cluster is configured (no in-cluster account and no readable kubeconfig)."))
        return "", ComponentStatus("cluster", False, message)
    host = api.configuration.host.rstrip("/")
    try:
        response = api.rest_client.pool_manager.request(
            "GET",
            f"{host}/version",
            headers={"Accept": "application/json", **kube_client.auth_headers(api.configuration)},
            retries=False,
            timeout=urllib3.Timeout(connect=timeout, read=timeout),
        )
    except urllib3.exceptions.HTTPError as exc:
        # A refused connection is a subclass of the timeout error, but it is no timeout.
        timed_out = isinstance(exc, urllib3.exceptions.TimeoutError) and not isinstance(
            exc, urllib3.exceptions.NewConnectionError
        )
        record_cluster_api_error(operation="version", reason="timeout" if timed_out else "connection")
        logger.warning("Readiness: cluster /version failed: %s", exc)
        if timed_out:
            message = say(
                gettext_noop("The cluster API did not answer within %(seconds)s seconds."), seconds=f"{timeout:g}"
            )
        else:
            message = say(gettext_noop("The cluster API is not reachable (the connection failed)."))
        return host, ComponentStatus("cluster", False, message, elapsed_ms(started))
    if response.status == 200:
        message = say(gettext_noop("The cluster API answered."))
    elif response.status in (401, 403):
        message = say(
            gettext_noop("The cluster API refused the portal's credentials (HTTP %(status)s)."), status=response.status
        )
    else:
        message = say(gettext_noop("The cluster API answered with an error (HTTP %(status)s)."), status=response.status)
    if response.status != 200:
        record_cluster_api_error(operation="version", reason=str(response.status))
    return host, ComponentStatus("cluster", response.status == 200, message, elapsed_ms(started))


def check_cluster() -> ComponentStatus:
    """The cluster probe, remembered per process and API server for HEALTH_CLUSTER_CACHE_SECONDS: probes come often."""
    global _cluster_cached
    cached = _cluster_cached
    if cached is not None and time.monotonic() - cached[0] < settings.HEALTH_CLUSTER_CACHE_SECONDS:
        from labs.kubevirt import client as kube_client

        try:
            current_host = kube_client.configuration().host.rstrip("/")
        except kube_client.ClusterNotConfigured:
            current_host = ""
        if current_host == cached[1]:
            return cached[2]
    host, status = _probe_cluster(timeout=float(settings.HEALTH_CLUSTER_TIMEOUT_SECONDS))
    _cluster_cached = (time.monotonic(), host, status)
    return status
