"""Session authentication for the portal's WebSockets, resolved in the consumer's own database call.

channels' ``AuthMiddlewareStack`` loads the session and the user before the consumer runs, through
``database_sync_to_async`` with its default ``thread_sensitive=True``: every handshake of a daphne process then
queues for the one thread that runs thread-sensitive code, and a class opening its pages together waits past
daphne's connect timeout. Here ``scope["user"]`` is a lazy object instead: it is resolved (session row, user row,
session hash check, exactly as ``django.contrib.auth.get_user`` does for a request) the first time sync code
touches it, which a consumer does inside the one ``database_sync_to_async(..., thread_sensitive=False)`` call
that also decides access, so handshakes run side by side on the thread pool.

Touching ``scope["user"]`` from async code before that call raises Django's ``SynchronousOnlyOperation``: pass it
to the sync function unexamined.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from channels.middleware import BaseMiddleware
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.utils.functional import SimpleLazyObject


def session_user(scope: dict[str, Any]):
    """The scope's user from its session, or ``AnonymousUser``. Sync code only: it reads the database."""
    from django.contrib.auth import get_user

    if "session" not in scope:
        raise ValueError("The WebSocket scope has no session: wrap the route in SessionMiddleware.")
    # get_user reads only the request's session.
    return get_user(SimpleNamespace(session=scope["session"]))  # type: ignore[arg-type]


class LazySessionAuthMiddleware(BaseMiddleware):
    """Puts a lazily resolved ``scope["user"]`` in place (or keeps one a caller already put there)."""

    async def __call__(self, scope, receive, send):
        scope = dict(scope)
        if "user" not in scope:
            scope["user"] = SimpleLazyObject(lambda: session_user(scope))
        return await super().__call__(scope, receive, send)


def LazySessionAuthMiddlewareStack(inner):  # noqa: N802 (named like channels' AuthMiddlewareStack)
    return CookieMiddleware(SessionMiddleware(LazySessionAuthMiddleware(inner)))
