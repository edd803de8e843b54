"""Liveness and readiness probes (``/healthz``, ``/readyz``): the databases, Redis, the cluster API and the sync
loop (the last two from ``labs.health``), each failing one named in plain words; details go to the log only."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

import redis
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, JsonResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from labs.health import ComponentStatus, check_cluster, elapsed_ms, say
from labs.sync_health import check_sync

logger = logging.getLogger(__name__)

COMPONENTS = ("database", "redis", "cluster", "sync")


def check_databases() -> list[ComponentStatus]:
    """A ``SELECT 1`` on every configured database connection."""
    statuses = []
    for alias in connections:
        name = "database" if alias == "default" else f"database:{alias}"
        started = time.monotonic()
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.fetchone()
        except Exception as exc:  # any driver error means "not usable"; the detail goes to the log only
            logger.warning("Readiness: database %s failed: %s", alias, exc)
            # A broken connection would otherwise be reused by the next request in this thread.
            connections[alias].close_if_unusable_or_obsolete()
            statuses.append(
                ComponentStatus(
                    name,
                    False,
                    say(gettext_noop("The database is not answering (%(error)s)."), error=type(exc).__name__),
                    elapsed_ms(started),
                )
            )
        else:
            statuses.append(
                ComponentStatus(name, True, say(gettext_noop("The database answered.")), elapsed_ms(started))
            )
    return statuses


def check_redis() -> ComponentStatus | None:
    """A PING to Redis (Celery broker, channel layer, shared cache); None when the portal runs without Redis."""
    if not settings.REDIS_URL:
        return None
    started = time.monotonic()
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1, **settings.REDIS_CONNECTION_OPTIONS
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        logger.warning("Readiness: Redis failed: %s", exc)
        return ComponentStatus(
            "redis",
            False,
            say(gettext_noop("Redis is not answering: tasks cannot be queued and live updates cannot be delivered.")),
            elapsed_ms(started),
        )
    finally:
        client.close()
    return ComponentStatus("redis", True, say(gettext_noop("Redis answered.")), elapsed_ms(started))


def readiness(*, exclude: tuple[str, ...] = ()) -> list[ComponentStatus]:
    """Every readiness component's status, skipping the names in ``exclude``."""
    statuses: list[ComponentStatus] = []
    if "database" not in exclude:
        statuses.extend(check_databases())
    if "redis" not in exclude:
        redis_status = check_redis()
        if redis_status is not None:
            statuses.append(redis_status)
    if "cluster" not in exclude:
        statuses.append(check_cluster())
    if "sync" not in exclude:
        statuses.append(check_sync())
    return statuses


@require_GET
@never_cache
def healthz_view(request: HttpRequest) -> JsonResponse:
    """Liveness: the process serves requests. No I/O, so a slow dependency never gets the process restarted."""
    return JsonResponse({"status": "alive"})


@require_GET
@never_cache
def readyz_view(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when every component is usable, 503 naming each failing one (``?exclude=sync,cluster``)."""
    requested = {part.strip() for part in request.GET.get("exclude", "").split(",") if part.strip()}
    unknown = sorted(requested - set(COMPONENTS))
    if unknown:
        return JsonResponse(
            {
                "error": _("Unknown component(s) in exclude: %(unknown)s; known: %(known)s.")
                % {"unknown": ", ".join(unknown), "known": ", ".join(COMPONENTS)}
            },
            status=400,
        )
    statuses = readiness(exclude=tuple(requested))
    failing = [status for status in statuses if not status.ok]
    components = {status.name: asdict(status) for status in statuses}
    for component in components.values():
        del component["name"]
    body = {
        "status": "ready" if not failing else "not ready",
        "failing": [status.name for status in failing],
        "problems": [status.message for status in failing],
        "components": components,
    }
    return JsonResponse(body, status=503 if failing else 200)
