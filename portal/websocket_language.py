"""The language a WebSocket speaks: the one the page that opened it was served in.

Channels runs no ``LocaleMiddleware``, so a consumer would build its messages in the default language whatever
the student reads. The handshake carries what a page request carries (the language cookie the switcher sets, the
browser's ``Accept-Language``), and Django's own rules pick from them, as they do for pages.
"""

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
