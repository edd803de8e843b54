"""Reading JSON request bodies and writing JSON responses, shared by the API, subresource and admin handlers."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from kubesim.errors import ApiError


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    return web.Response(body=data, status=status, content_type="application/json", headers=headers)


async def optional_json_object(request: web.Request, *, what: str = "request body") -> dict[str, Any]:
    """The body as a JSON object, ``{}`` when there is none; anything else is a 400 saying so."""
    raw = await request.read()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"the {what} could not be decoded: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, f"the {what} must be a JSON object")
    return body


def wants_table(request: web.Request) -> bool:
    """kubectl asks for ``meta.k8s.io/v1`` Table output in its Accept header."""
    return "as=Table" in request.headers.get("Accept", "")


def int_param(query: Any, name: str) -> int:
    """An integer query parameter (0 when absent); anything else is a 400, not a traceback."""
    value = query.get(name)
    if value in (None, ""):
        return 0
    try:
        return int(value)
    except ValueError as exc:
        raise ApiError(400, f"invalid value for {name}: {value!r} is not an integer") from exc


def bool_param(value: str | None) -> bool:
    return value in ("true", "1", "True")
