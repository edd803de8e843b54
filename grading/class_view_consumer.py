"""``/ws/labs/<id>/class/``: the staff's class view of a lab, rendered in the reader's language and time zone on
changes to the group ``class-<lab id>`` (at most once per ``CLASS_REFRESH_SECONDS``) and every
``CLASS_TICK_SECONDS``; access is decided again with every rendering, so staff who lose the role stop receiving it."""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.template.loader import render_to_string
from django.utils import timezone, translation

from grading.selectors.class_view import class_view
from labs.access import lab_get_for_staff
from labs.consumers.events import NotAuthenticated, refusal_close_code
from labs.services.events import lab_class_group
from portal.errors import ApplicationError
from portal.timezones import user_time_zone
from portal.websocket_consumer import PortalConsumer
from portal.websocket_language import scope_language

logger = logging.getLogger(__name__)

CLASS_REFRESH_SECONDS = 1.0
CLASS_TICK_SECONDS = 60.0


def class_view_html(*, user, lab_id: int, language: str) -> str:
    """The class view's table for ``user`` (staff of the lab's course, else NotFound), in their language and zone."""
    if user is None or not user.is_authenticated:
        raise NotAuthenticated
    lab = lab_get_for_staff(user=user, lab_id=lab_id)
    with translation.override(language), timezone.override(user_time_zone(user) or timezone.get_default_timezone()):
        return render_to_string("labs/_class_view.html", {"lab": lab, "rows": class_view(lab=lab)})


_render = database_sync_to_async(class_view_html, thread_sensitive=False)


# PortalConsumer.send wraps the channel-level send that the WebSocket send calls (portal.websocket_consumer): the two
# signatures differ by design.
class LabClassConsumer(AsyncJsonWebsocketConsumer, PortalConsumer):  # type: ignore[misc]
    group: str | None = None
    refresh: asyncio.Task | None = None
    ticker: asyncio.Task | None = None

    async def connect(self) -> None:
        """Join the group before rendering: a change committed meanwhile triggers one more rendering, never none."""
        self.lab_id = int(self.scope["url_route"]["kwargs"]["lab_id"])
        self.language = scope_language(dict(self.scope))
        group = lab_class_group(self.lab_id)
        await self.channel_layer.group_add(group, self.channel_name)
        try:
            html = await _render(user=self.scope.get("user"), lab_id=self.lab_id, language=self.language)
        except (NotAuthenticated, ApplicationError) as exc:
            await self.channel_layer.group_discard(group, self.channel_name)
            await self.close(code=refusal_close_code(exc))
            return
        self.group = group
        await self.accept()
        await self.send_json({"type": "class.view", "html": html})
        self.ticker = asyncio.ensure_future(self._tick())

    async def disconnect(self, code: int) -> None:
        for task in (self.refresh, self.ticker):
            if task is not None:
                task.cancel()
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        try:
            content = await self.decode_json(text_data) if text_data is not None else None
        except (ValueError, RecursionError):
            content = None
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})
        else:
            await self.send_json({"type": "error", "code": "bad_message"})

    async def class_changed(self, event: dict) -> None:
        if self.group is not None and (self.refresh is None or self.refresh.done()):
            self.refresh = asyncio.ensure_future(self._refresh(delay=CLASS_REFRESH_SECONDS))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(CLASS_TICK_SECONDS)
            await self.class_changed({})

    async def _refresh(self, *, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            html = await _render(user=self.scope.get("user"), lab_id=self.lab_id, language=self.language)
        except (NotAuthenticated, ApplicationError) as exc:
            await self.close(code=refusal_close_code(exc))
            return
        except Exception:
            logger.exception("lab %s: the class view could not be rendered; the next change tries again", self.lab_id)
            return
        await self.send_json({"type": "class.view", "html": html})
