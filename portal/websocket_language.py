"""The language a WebSocket speaks: the page's, picked by Django's own rules from what the handshake carries (the
language cookie, ``Accept-Language``), since Channels runs no ``LocaleMiddleware``."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from django.utils import translation


def scope_language(scope: Mapping[str, Any]) -> str:
    """The language code for this connection: the language cookie, then ``Accept-Language``, then the default."""
    headers = dict(scope.get("headers") or ())
    accept = headers.get(b"accept-language", b"").decode("latin-1")
    request = SimpleNamespace(COOKIES=scope.get("cookies") or {}, META={"HTTP_ACCEPT_LANGUAGE": accept})
    # Malformed headers and unknown cookie values fall back to the default language there; nothing raises.
    # It reads only COOKIES and META, which the namespace gives it.
    return translation.get_language_from_request(request, check_path=False)  # type: ignore[arg-type]
