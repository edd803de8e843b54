"""``/ws/attempts/<id>/events/``: the attempt's status and grading results, pushed as they change.

Joined to the channel-layer group ``attempt-<id>``, which the lifecycle (``attempt.update``) and grading
(``grading.update``) push to after commit. On connect the current status (and the latest grading run) is sent
first, so a page that reconnects after a gap shows the present state without polling.
"""

from __future__ import annotations

import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from grading.selectors import grading_run_payload
from labs.selectors import attempt_get_for_user, attempt_status_payload
from portal.errors import ApplicationError

logger = logging.getLogger(__name__)

# Close codes the page understands (4000-4999 are the application's).
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


def attempt_group(attempt_id: int) -> str:
    return f"attempt-{int(attempt_id)}"


def attempt_access_check(*, user, attempt_id: int) -> None:
    """Raises NotFound unless the user is the attempt's student or staff of its course."""
    attempt_get_for_user(user=user, attempt_id=attempt_id)


def attempt_initial_messages(*, user, attempt_id: int) -> list[dict]:
    """The messages a (re)connecting page needs: the attempt's status and its latest grading run, if any."""
    attempt = attempt_get_for_user(user=user, attempt_id=attempt_id)
    messages = [{"type": "attempt.update", "attempt": attempt_status_payload(attempt)}]
    # Reached through the attempt just checked above, so scoped like it.
    run = attempt.runs.prefetch_related("results").order_by("-created_at", "-id").first()
    if run is not None:
        messages.append({"type": "grading.update", "run": grading_run_payload(run)})
    return messages


class AttemptEventsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.group = None
        user = self.scope.get("user")
        attempt_id = int(self.scope["url_route"]["kwargs"]["attempt_id"])
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        try:
            await database_sync_to_async(attempt_access_check)(user=user, attempt_id=attempt_id)
        except ApplicationError:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = attempt_group(attempt_id)
        # Join before reading the snapshot: an update committed in between is delivered after it, never lost.
        await self.channel_layer.group_add(self.group, self.channel_name)
        try:
            initial = await database_sync_to_async(attempt_initial_messages)(user=user, attempt_id=attempt_id)
        except ApplicationError:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.accept()
        for message in initial:
            await self.send_json(message)

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        # The page only listens; a ping keeps proxies from closing an idle socket.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def attempt_update(self, event: dict) -> None:
        await self.send_json({"type": "attempt.update", "attempt": event["attempt"]})

    async def grading_update(self, event: dict) -> None:
        await self.send_json({"type": "grading.update", "run": event["run"]})
