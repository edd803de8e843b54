"""Session authentication for WebSockets: ``scope["user"]`` is lazy, resolved (as ``get_user`` does) inside the
consumer's one ``thread_sensitive=False`` database call, so handshakes do not queue on the process's single thread
for sync code. Touching it from async code raises ``SynchronousOnlyOperation``: pass it to sync code unexamined."""

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
