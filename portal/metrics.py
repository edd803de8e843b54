"""Counters of events that leave no row (cluster API errors, failed requests, console sessions), shared by every
process through Redis hashes (process memory without Redis); ``ops.metrics`` exports them."""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter, defaultdict

import redis
from asgiref.sync import sync_to_async
from django.conf import settings

logger = logging.getLogger(__name__)

# Redis hashes shared by every process. Fields of the error hash are "<operation>|<reason>".
CLUSTER_API_ERRORS_KEY = "portal:metrics:cluster_api_errors"
CONSOLE_SESSIONS_KEY = "portal:metrics:console_sessions"
REQUEST_FAILURES_KEY = "portal:metrics:request_failures"
# portal.views.server_error's two answers, always exported so that each series exists (at 0) before its first failure.
REQUEST_FAILURE_REASONS = ("portal_busy", "server_error")


@functools.cache
def _redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1, **settings.REDIS_CONNECTION_OPTIONS)


class _CounterStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def incr(self, key: str, field: str) -> None:
        if settings.REDIS_URL:
            _redis_client(settings.REDIS_URL).hincrby(settings.REDIS_KEY_PREFIX + key, field, 1)
        else:
            with self._lock:
                self._local[key][field] += 1

    def read(self, key: str) -> dict[str, int]:
        if settings.REDIS_URL:
            fields = _redis_client(settings.REDIS_URL).hgetall(settings.REDIS_KEY_PREFIX + key)
            return {name.decode() if isinstance(name, bytes) else name: int(value) for name, value in fields.items()}
        with self._lock:
            return dict(self._local[key])

    def clear(self, key: str) -> None:
        if settings.REDIS_URL:
            _redis_client(settings.REDIS_URL).delete(settings.REDIS_KEY_PREFIX + key)
        else:
            with self._lock:
                self._local.pop(key, None)


counters = _CounterStore()


def _count_safely(key: str, field: str) -> None:
    # A metrics hiccup must never break the work being counted; it only shows up in the log.
    try:
        counters.incr(key, field)
    except redis.RedisError as exc:
        logger.warning("Could not count %s %s: %s", key, field, exc)


def record_cluster_api_error(*, operation: str, reason: str) -> None:
    """``operation``: a short fixed name ("list_vmis"); ``reason``: the HTTP status, "timeout" or "connection"."""
    _count_safely(CLUSTER_API_ERRORS_KEY, f"{operation}|{reason}")


def record_request_failure(*, reason: str) -> None:
    """``reason``: ``portal_busy`` (503, no database connection came free in time) or ``server_error`` (500)."""
    _count_safely(REQUEST_FAILURES_KEY, reason)


def console_session_opened() -> None:
    _count_safely(CONSOLE_SESSIONS_KEY, "opened")


def console_session_closed() -> None:
    _count_safely(CONSOLE_SESSIONS_KEY, "closed")


aconsole_session_closed = sync_to_async(console_session_closed, thread_sensitive=False)
