"""The attempt's state machine: the transition table, and ``attempt_transition``, the one function that writes
``Attempt.state`` (the cache holds flags and locks only, never an attempt's state)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone

from labs.models import Attempt, AttemptState

S = AttemptState
# to-state -> the states an attempt may reach it from (it is created ``requested``).
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PROVISIONING: frozenset({S.REQUESTED}),
    S.STARTING: frozenset({S.PROVISIONING}),
    # From requested too: an attempt that claimed a warm pool's VM is running as soon as the claim is finished.
    S.RUNNING: frozenset({S.STARTING, S.REQUESTED}),
    S.STOPPING: frozenset({S.REQUESTED, S.PROVISIONING, S.STARTING, S.RUNNING}),
    S.STOPPED: frozenset({S.STOPPING}),
    S.EXPIRED: frozenset({S.STOPPING}),
    S.FAILED: frozenset({S.REQUESTED, S.PROVISIONING, S.STARTING, S.RUNNING, S.STOPPING}),
}
# The timestamp each state records on entry (unless the caller gives it).
ENTERED_AT: dict[str, str] = {
    S.STARTING: "provisioned_at",
    S.RUNNING: "agent_ready_at",
    S.STOPPING: "stopping_at",
    S.STOPPED: "ended_at",
    S.EXPIRED: "ended_at",
    S.FAILED: "ended_at",
}


class IllegalTransition(ValueError):
    """A transition the table does not allow: a programming error, never a person's."""


def attempt_transition(
    *,
    attempt: Attempt | int,
    to: str,
    from_states: Iterable[str] | None = None,
    now: datetime | None = None,
    hold: float = 0.0,
    **fields: Any,
) -> Attempt | None:
    """Move the attempt to ``to`` if it is still in one of ``from_states`` (default: all the table allows), writing
    ``fields`` and ``to``'s timestamp in the same update, pushed to its pages on commit. Returns the attempt as
    written (an ``Attempt`` given is updated in place; an id is read back), or None when it had moved on."""
    from labs.services.events import attempt_push_on_commit

    allowed = TRANSITIONS.get(to, frozenset())
    sources = allowed if from_states is None else frozenset(from_states)
    if not sources or not sources <= allowed:
        raise IllegalTransition(f"{sorted(sources)} -> {to}")
    now = now or timezone.now()
    if to in ENTERED_AT:
        fields.setdefault(ENTERED_AT[to], now)
    attempt_id = attempt if isinstance(attempt, int) else attempt.pk
    # Outside a caller's transaction the update commits by itself and the push follows at once.
    if not Attempt.objects.filter(id=attempt_id, state__in=sources).update(state=to, updated_at=now, **fields):
        return None
    if isinstance(attempt, int):
        attempt = Attempt.objects.get(id=attempt_id)
    else:
        for name, value in {**fields, "state": to, "updated_at": now}.items():
            setattr(attempt, name, value)
    attempt_push_on_commit(attempt=attempt, hold=hold)
    return attempt
