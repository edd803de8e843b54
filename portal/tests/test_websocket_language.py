"""The language of a WebSocket, from its handshake as Django picks it for a page."""

from __future__ import annotations

import pytest
from django.conf import settings

from portal.websockets import scope_language


def scope(*, accept: bytes | None = None, cookie_language: str | None = None) -> dict:
    headers = [(b"accept-language", accept)] if accept is not None else []
    cookies = {settings.LANGUAGE_COOKIE_NAME: cookie_language} if cookie_language else {}
    return {"type": "websocket", "headers": headers, "cookies": cookies}


@pytest.mark.parametrize(
    ("accept", "cookie", "expected"),
    [
        (None, None, "en"),
        (b"ja,en;q=0.8", None, "ja"),
        (b"ja-JP", None, "ja"),
        (b"fr-FR,fr;q=0.9", None, "en"),  # not offered: the default
        (b"ja", "en", "en"),  # the switcher's choice wins over the browser
        (b"en", "ja", "ja"),
        (b"", "xx", "en"),  # an unknown cookie value is ignored
        (b";;;q=,\xff", None, "en"),  # garbage is no reason to refuse a socket
    ],
)
def test_language_of_the_connection(accept, cookie, expected):
    assert scope_language(scope(accept=accept, cookie_language=cookie)) == expected


def test_a_scope_without_headers_or_cookies_gets_the_default():
    assert scope_language({"type": "websocket"}) == settings.LANGUAGE_CODE
