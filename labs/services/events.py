"""Telling browsers that an attempt changed: ``attempt.update`` on the channel-layer group ``attempt-<id>``,
sent after the transaction that made the change commits (never for a change that was rolled back)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from labs.models import Attempt

logger = logging.getLogger(__name__)


def attempt_group(attempt_id: int) -> str:
    return f"attempt-{attempt_id}"


def attempt_push_on_commit(*, attempt: Attempt) -> None:
    """Queue an ``attempt.update`` with the attempt's payload as it stands now, to be sent on commit."""
    from labs.selectors import attempt_status_payload

    message = {"type": "attempt.update", "attempt": attempt_status_payload(attempt)}
    group = attempt_group(attempt.id)

    def push() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(group, message)
        except Exception:
            # The page also polls its status; a lost push delays the browser, it loses no state.
            logger.warning("could not push attempt.update to %s", group, exc_info=True)

    transaction.on_commit(push)


def on_commit_logged(action: Callable[[], object], *, what: str) -> None:
    """Run ``action`` after commit; if it fails (the broker is down), log it instead of failing the request that
    already committed. The sweep re-enqueues work an attempt is still waiting for."""

    def run() -> None:
        try:
            action()
        except Exception:
            logger.exception("after commit: %s failed; the sweep will retry it", what)

    transaction.on_commit(run)
