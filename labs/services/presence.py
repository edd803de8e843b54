"""Whether a page of the student has an attempt open: stamped by its events socket, read by the stop when left."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from labs.models import ACTIVE_STATES, Attempt, AttemptState


def attempt_seen(*, attempt_id: int, now: datetime | None = None) -> bool:
    """A page of the student has the attempt open now (its events socket); False once the attempt has ended."""
    return bool(
        Attempt.objects.filter(id=attempt_id, state__in=ACTIVE_STATES).update(last_seen_at=now or timezone.now())
    )


# While the student's page has an attempt open, its events socket stamps the attempt as seen this often
# (labs.consumers.events; well under the shortest stop when left, IDLE_STOP_MIN_MINUTES).
PRESENCE_STAMP_SECONDS = 60

# A last stamp older than this means no page has the attempt open now (one stamp missed, and a margin).
PRESENCE_LOST_AFTER_SECONDS = 2 * PRESENCE_STAMP_SECONDS + 30


def attempt_stops_as_left_at(
    attempt: Attempt, *, idle_stop_minutes: int, now: datetime | None = None
) -> datetime | None:
    """When the running attempt will be stopped as left, while no page has it open (for the dashboard); else None."""
    now = now or timezone.now()
    since = attempt_left_since(attempt)
    if attempt.state != AttemptState.RUNNING or not idle_stop_minutes or since is None:
        return None
    if (now - since).total_seconds() < PRESENCE_LOST_AFTER_SECONDS:
        return None
    return since + timedelta(minutes=idle_stop_minutes)


def attempt_left_since(attempt: Attempt) -> datetime | None:
    """Since when no page has had the attempt open: its last stamp, or when its agent answered if later; None until
    it runs."""
    stamps = [stamp for stamp in (attempt.last_seen_at, attempt.agent_ready_at) if stamp is not None]
    return max(stamps) if attempt.agent_ready_at is not None else None
