"""``/ws/labs/<id>/class/``: the staff's class view of a lab, rendered in the reader's language and time zone on
changes to the group ``class-<lab id>`` (at most once per ``CLASS_REFRESH_SECONDS``) and every
``CLASS_TICK_SECONDS``; access is decided again with every rendering, so staff who lose the role stop receiving it."""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from django.template.loader import render_to_string
from django.utils import timezone, translation

from grading.selectors.class_view import class_view
from labs.access import lab_get_for_staff
from labs.services.events import lab_class_group
from portal.errors import ApplicationError
from portal.timezones import user_time_zone
from portal.websockets import NotAuthenticated, PageSocketConsumer, scope_language

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


class LabClassConsumer(PageSocketConsumer):
    refresh: asyncio.Task | None = None
    ticker: asyncio.Task | None = None

    async def connect(self) -> None:
        self.lab_id = int(self.scope["url_route"]["kwargs"]["lab_id"])
        self.language = scope_language(dict(self.scope))
        html = await self.join_and_accept(lab_class_group(self.lab_id), self._render_html)
        if html is not None:
            await self.send_json({"type": "class.view", "html": html})
            self.ticker = asyncio.ensure_future(self._tick())

    async def _render_html(self) -> str:
        return await _render(user=self.scope.get("user"), lab_id=self.lab_id, language=self.language)

    async def disconnect(self, code: int) -> None:
        for task in (self.refresh, self.ticker):
            if task is not None:
                task.cancel()
        await super().disconnect(code)

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
            html = await self._render_html()
        except (NotAuthenticated, ApplicationError) as exc:
            await self.refuse(exc)
            return
        except Exception:
            logger.exception("lab %s: the class view could not be rendered; the next change tries again", self.lab_id)
            return
        await self.send_json({"type": "class.view", "html": html})
