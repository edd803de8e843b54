"""The sync loop's heartbeat and readiness (``check_sync``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.core.cache import cache
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext_noop

from labs.health import ComponentStatus, say

logger = logging.getLogger(__name__)

# After each pass the sync task stores when it finished (epoch seconds, or an ISO 8601 string) under the first;
# after a failed pass, {"at": <epoch seconds>, "message": <text>} under the second.
SYNC_LAST_SUCCESS_KEY = "labs:sync:last_success"
SYNC_LAST_ERROR_KEY = "labs:sync:last_error"
# Kept well past any sensible staleness limit, so that "stale" and "never ran" stay distinguishable.
SYNC_HEARTBEAT_TTL_SECONDS = 7 * 24 * 3600
# The trouble the sync task last told the students' pages of, per namespace (``wording.cluster_trouble``).
SYNC_NOTICE_KEY = "labs:sync:notices"


@dataclass(frozen=True)
class SyncHeartbeat:
    last_success: datetime | None
    last_error_at: datetime | None
    last_error_message: str


def _as_datetime(value: object) -> datetime | None:
    """Read a heartbeat timestamp written as epoch seconds or an ISO 8601 string."""
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, tz=UTC)
    if not isinstance(value, str) or (parsed := parse_datetime(value)) is None:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def record_sync_success(*, at: datetime | None = None) -> None:
    """Called by the sync task after a pass that read the cluster and updated the attempts."""
    cache.set(SYNC_LAST_SUCCESS_KEY, (at or datetime.now(tz=UTC)).timestamp(), timeout=SYNC_HEARTBEAT_TTL_SECONDS)


def record_sync_error(*, message: str, at: datetime | None = None) -> None:
    """Called by the sync task when a pass failed; the message is for operators (dashboard, logs)."""
    error = {"at": (at or datetime.now(tz=UTC)).timestamp(), "message": message[:500]}
    cache.set(SYNC_LAST_ERROR_KEY, error, timeout=SYNC_HEARTBEAT_TTL_SECONDS)


def notices_changed(*, troubles: dict[str, str], everyone: bool = False) -> dict[str, str]:
    """Remember each namespace's trouble after a pass; those whose pages were told otherwise (never told: no notice),
    or all when ``everyone`` (after a stall, whose notice pages drawn meanwhile show and no pass told)."""
    told = cache.get(SYNC_NOTICE_KEY) or {}
    cache.set(SYNC_NOTICE_KEY, troubles, timeout=SYNC_HEARTBEAT_TTL_SECONDS)
    return {space: trouble for space, trouble in troubles.items() if everyone or told.get(space, "") != trouble}


def sync_heartbeat() -> SyncHeartbeat:
    """The sync loop's last success and last error, as written to the shared cache. Raises if the cache is down."""
    values = cache.get_many([SYNC_LAST_SUCCESS_KEY, SYNC_LAST_ERROR_KEY])
    error = values.get(SYNC_LAST_ERROR_KEY) or {}
    return SyncHeartbeat(
        last_success=_as_datetime(values.get(SYNC_LAST_SUCCESS_KEY)),
        last_error_at=_as_datetime(error.get("at")),
        last_error_message=str(error.get("message") or ""),
    )


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
            message = say(
                gettext_noop("The attempt sync loop has never succeeded; its last pass failed %(failed)s s ago."),
                failed=_seconds_ago(now, beat.last_error_at),
            )
        else:
            message = say(
                gettext_noop("The attempt sync loop has not run yet (is the Celery worker and beat running?).")
            )
        return ComponentStatus("sync", False, message)
    succeeded = _seconds_ago(now, beat.last_success)
    error_at = beat.last_error_at
    failed = _seconds_ago(now, error_at) if error_at is not None and error_at > beat.last_success else None
    stale = (now - beat.last_success).total_seconds() > max_age
    if stale and failed is not None:
        text = gettext_noop(
            "The attempt sync loop last succeeded %(succeeded)s s ago (limit %(limit)s s); its "
            "last pass failed %(failed)s s ago."
        )
    elif stale:
        text = gettext_noop("The attempt sync loop last succeeded %(succeeded)s s ago (limit %(limit)s s).")
    elif failed is not None:
        text = gettext_noop(
            "The attempt sync loop succeeded %(succeeded)s s ago. Its last pass failed %(failed)s s ago."
        )
    else:
        text = gettext_noop("The attempt sync loop succeeded %(succeeded)s s ago.")
    return ComponentStatus("sync", not stale, say(text, succeeded=succeeded, limit=max_age, failed=failed))


def _seconds_ago(now: datetime, then: datetime) -> int:
    return max(0, int((now - then).total_seconds()))
