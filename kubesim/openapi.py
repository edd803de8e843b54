"""A minimal OpenAPI v3 discovery: enough for kubectl to see that the server validates fields itself
(``fieldValidation`` on every PATCH) so it sends ``fieldValidation=Strict`` instead of downloading schemas.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any

from kubesim.resources import RESOURCES, ResourceType


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


@lru_cache(maxsize=1)
def _documents() -> dict[str, dict[str, Any]]:
    documents: dict[str, dict[str, Any]] = {}
    for rt in RESOURCES:
        document = documents.setdefault(
            _gv_path(rt.group, rt.version),
            {
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": "kubesim"},
                "paths": {},
                "components": {"schemas": {}},
            },
        )
        document["paths"].update(_paths(rt))
    return documents


def _paths(rt: ResourceType) -> dict[str, Any]:
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    params = [
        {"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
        for name in ("dryRun", "fieldManager", "fieldValidation")
    ]
    item = rt.path("{namespace}" if rt.namespaced else None, "{name}")
    collection = rt.path("{namespace}" if rt.namespaced else None)

    def op(action: str) -> dict[str, Any]:
        return {
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "parameters": params,
            "responses": {"200": {"description": "OK"}},
        }

    paths = {
        item: {"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")},
        collection: {"get": op("list"), "post": op("post")},
    }
    if rt.status_subresource:
        paths[item + "/status"] = {"get": op("get"), "put": op("put"), "patch": op("patch")}
    return paths


def root_document() -> dict[str, Any]:
    return {"paths": {path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={_hash(path)}"} for path in _documents()}}


def _hash(path: str) -> str:
    return hashlib.sha512(path.encode()).hexdigest()[:64].upper()


def group_version_document(path: str) -> dict[str, Any] | None:
    return _documents().get(path.strip("/"))
