"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902), as the API server applies them."""

from __future__ import annotations

import copy
from typing import Any

from kubesim.errors import ApiError


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply a merge patch; ``null`` deletes a key, lists are replaced whole."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [_unescape(token) for token in path[1:].split("/")]


def _resolve(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise ApiError(422, f"doc is missing path: /{'/'.join(tokens)}")
            node = node[token]
        elif isinstance(node, list):
            try:
                node = node[int(token)]
            except (ValueError, IndexError) as exc:
                raise ApiError(422, f"doc is missing path: /{'/'.join(tokens)}") from exc
        else:
            raise ApiError(422, f"doc is missing path: /{'/'.join(tokens)}")
    return node


def _add(doc: Any, tokens: list[str], value: Any, *, replace: bool) -> Any:
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, f"replace operation does not apply: doc is missing key: /{'/'.join(tokens)}")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
            return doc
        try:
            index = int(last)
        except ValueError as exc:
            raise ApiError(422, f"invalid array index {last!r}") from exc
        if replace:
            if not 0 <= index < len(parent):
                raise ApiError(422, f"replace operation does not apply: index {index} out of range")
            parent[index] = value
        else:
            if not 0 <= index <= len(parent):
                raise ApiError(422, f"add operation does not apply: index {index} out of range")
            parent.insert(index, value)
    else:
        raise ApiError(422, f"doc is missing path: /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise ApiError(422, "cannot remove the document root")
    parent = _resolve(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise ApiError(422, f"remove operation does not apply: doc is missing path: /{'/'.join(tokens)}")
        return parent.pop(last)
    if isinstance(parent, list):
        try:
            return parent.pop(int(last))
        except (ValueError, IndexError) as exc:
            raise ApiError(422, f"remove operation does not apply: doc is missing path: /{'/'.join(tokens)}") from exc
    raise ApiError(422, f"doc is missing path: /{'/'.join(tokens)}")


def json_patch(target: Any, operations: Any) -> Any:
    """Apply RFC 6902 operations to a copy of ``target``; a failed ``test`` is a 422 as in the API server."""
    if not isinstance(operations, list):
        raise ApiError(400, "json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise ApiError(400, f"invalid json patch operation: {operation!r}")
        op, tokens = operation["op"], _split(operation["path"])
        if op == "add":
            doc = _add(doc, tokens, copy.deepcopy(operation.get("value")), replace=False)
        elif op == "replace":
            doc = _add(doc, tokens, copy.deepcopy(operation.get("value")), replace=True)
        elif op == "remove":
            _remove(doc, tokens)
        elif op == "test":
            if _resolve(doc, tokens) != operation.get("value"):
                raise ApiError(422, f"testing value {operation['path']} failed")
        elif op in ("move", "copy"):
            source = _split(operation.get("from", ""))
            value = copy.deepcopy(_resolve(doc, source))
            if op == "move":
                _remove(doc, source)
            doc = _add(doc, tokens, value, replace=False)
        else:
            raise ApiError(400, f"unexpected json patch operation {op!r}")
    return doc
