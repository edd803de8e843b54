"""Reading JSON request bodies and writing JSON responses, shared by the API, subresource and admin handlers."""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web

from kubesim.errors import ApiError


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
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


def metadata_only_version(request: web.Request, *, kind: str) -> str | None:
    """The ``meta.k8s.io`` version (``v1`` or ``v1beta1``) of ``kind`` (``PartialObjectMetadata`` or
    ``PartialObjectMetadataList``) when the client's first acceptable media type asks for it, as client-go's
    metadata client does (``application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1``), else None."""
    for media_type in request.headers.get("Accept", "").split(","):
        params = dict(part.strip().partition("=")[::2] for part in media_type.split(";")[1:])
        if params.get("as") == kind and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1", "v1beta1"):
            return params["v"]
        if media_type.strip().split(";")[0] in ("application/json", "*/*"):
            return None  # plain JSON is acceptable before (or instead of) it
    return None


def partial_object_metadata(obj: dict[str, Any], *, version: str) -> dict[str, Any]:
    """What the apiserver answers for an object asked for as ``PartialObjectMetadata``: its metadata only."""
    return {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{version}", "metadata": obj["metadata"]}


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
