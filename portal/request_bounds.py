"""The bound on request bodies for every HTTP request: 413 before any of the body is read when its
``Content-Length`` is past it, or as soon as a chunked body passes it (Django and the API's parsers would read it
whole). A proxy in front should bound it too (deploy/README.md)."""

from __future__ import annotations

import json

from django.conf import settings
from django.http.cookie import parse_cookie
from django.utils import translation
from django.utils.translation import gettext as _

from portal.errors import error_body
from portal.websockets import scope_language


class BodyTooLarge(Exception):
    """The body read so far is past the bound (a body sent without ``Content-Length``)."""


async def _refuse(scope, headers: dict[bytes, bytes], send, limit: int) -> None:
    # Refused before LocaleMiddleware runs: the language is chosen here by the same rules (cookie, Accept-Language).
    cookies = parse_cookie(headers.get(b"cookie", b"").decode("latin-1"))
    with translation.override(scope_language({**scope, "cookies": cookies})):
        message = _("The request is too large: at most %(size)s bytes may be sent.") % {"size": limit}
    wants_json = scope["path"].startswith("/api/") or b"application/json" in headers.get(b"accept", b"")
    if wants_json:
        body = json.dumps(error_body(code="request_too_large", message=message)).encode()
        content_type = b"application/json"
    else:
        body = message.encode()
        content_type = b"text/plain; charset=utf-8"
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequestBodyLimit:
    """ASGI middleware: answers 413 to a request whose body is past its bound, reading no more of it."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", []))
        # Uploads (multipart/form-data) get the larger bound.
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        upload = content_type == b"multipart/form-data"
        limit = settings.REQUEST_UPLOAD_MAX_BYTES if upload else settings.REQUEST_BODY_MAX_BYTES
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await _refuse(scope, headers, send, limit)
        received = 0

        async def bounded_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge
            return message

        try:
            return await self.app(scope, bounded_receive, send)
        except BodyTooLarge:
            # Django reads the whole body before it starts a response, so none has been sent yet.
            return await _refuse(scope, headers, send, limit)
