"""Request bodies in Kubernetes' protobuf encoding, for the built-in kinds kubectl's typed clients send (client-go
has no fallback to JSON): the ``k8s\0`` envelope's object decoded by ``k8s.io/api/core/v1`` field numbers; other
kinds are a 415."""

from __future__ import annotations

import base64
from typing import Any

from kubesim.errors import ApiError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# A field is (name, kind): "string", "bytes" (base64 in JSON), "int", "bool", "quantity" (resource.Quantity, a
# message whose field 1 is the string form), a schema dict (a message), ("repeated", kind) or ("map", value kind).
# Fields not listed are skipped.
OWNER_REFERENCE = {
    1: ("kind", "string"),
    3: ("name", "string"),
    4: ("uid", "string"),
    5: ("apiVersion", "string"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
OBJECT_META = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    5: ("uid", "string"),
    6: ("resourceVersion", "string"),
    7: ("generation", "int"),
    10: ("deletionGracePeriodSeconds", "int"),
    11: ("labels", ("map", "string")),
    12: ("annotations", ("map", "string")),
    13: ("ownerReferences", ("repeated", OWNER_REFERENCE)),
    14: ("finalizers", ("repeated", "string")),
}
POLICY_RULE = {
    1: ("verbs", ("repeated", "string")),
    2: ("apiGroups", ("repeated", "string")),
    3: ("resources", ("repeated", "string")),
    4: ("resourceNames", ("repeated", "string")),
    5: ("nonResourceURLs", ("repeated", "string")),
}
SUBJECT = {1: ("kind", "string"), 2: ("apiGroup", "string"), 3: ("name", "string"), 4: ("namespace", "string")}
ROLE_REF = {1: ("apiGroup", "string"), 2: ("kind", "string"), 3: ("name", "string")}
KINDS: dict[str, dict[int, tuple[str, Any]]] = {
    "Namespace": {1: ("metadata", OBJECT_META), 2: ("spec", {1: ("finalizers", ("repeated", "string"))})},
    "Secret": {
        1: ("metadata", OBJECT_META),
        2: ("data", ("map", "bytes")),
        3: ("type", "string"),
        4: ("stringData", ("map", "string")),
        5: ("immutable", "bool"),
    },
    "ConfigMap": {
        1: ("metadata", OBJECT_META),
        2: ("data", ("map", "string")),
        3: ("binaryData", ("map", "bytes")),
        4: ("immutable", "bool"),
    },
    "ResourceQuota": {
        1: ("metadata", OBJECT_META),
        2: ("spec", {1: ("hard", ("map", "quantity")), 2: ("scopes", ("repeated", "string"))}),
    },
    "ServiceAccount": {1: ("metadata", OBJECT_META), 4: ("automountServiceAccountToken", "bool")},
    # k8s.io/api/rbac/v1/generated.proto: ``kubectl create role|rolebinding|clusterrole|clusterrolebinding``.
    "Role": {1: ("metadata", OBJECT_META), 2: ("rules", ("repeated", POLICY_RULE))},
    "ClusterRole": {1: ("metadata", OBJECT_META), 2: ("rules", ("repeated", POLICY_RULE))},
    "RoleBinding": {1: ("metadata", OBJECT_META), 2: ("subjects", ("repeated", SUBJECT)), 3: ("roleRef", ROLE_REF)},
    "ClusterRoleBinding": {
        1: ("metadata", OBJECT_META),
        2: ("subjects", ("repeated", SUBJECT)),
        3: ("roleRef", ROLE_REF),
    },
    # k8s.io/api/authorization/v1/generated.proto: what ``kubectl auth can-i`` sends.
    "SelfSubjectAccessReview": {
        1: ("metadata", OBJECT_META),
        2: (
            "spec",
            {
                1: (
                    "resourceAttributes",
                    {
                        1: ("namespace", "string"),
                        2: ("verb", "string"),
                        3: ("group", "string"),
                        4: ("version", "string"),
                        5: ("resource", "string"),
                        6: ("subresource", "string"),
                        7: ("name", "string"),
                    },
                ),
                2: ("nonResourceAttributes", {1: ("path", "string"), 2: ("verb", "string")}),
            },
        ),
    },
}
UNKNOWN = {
    1: ("typeMeta", {1: ("apiVersion", "string"), 2: ("kind", "string")}),
    2: ("raw", "raw"),
    3: ("contentEncoding", "string"),
    4: ("contentType", "string"),
}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs: varints as ints, length-delimited fields as bytes; fixed widths skipped."""
    fields, at = [], 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            fields.append((number, value))
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ValueError("truncated field")
            fields.append((number, data[at : at + length]))
            at += length
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return fields


def _scalar(kind: Any, value: int | bytes) -> Any:
    if isinstance(kind, dict):
        return _message(kind, value if isinstance(value, bytes) else b"")
    if kind == "string":
        return value.decode("utf-8") if isinstance(value, bytes) else ""
    if kind == "bytes":
        return base64.b64encode(value if isinstance(value, bytes) else b"").decode("ascii")
    if kind == "quantity":
        return _scalar("string", dict(_fields(value)).get(1, b"") if isinstance(value, bytes) else b"")
    if kind == "raw":
        return value
    if kind == "int":
        return value if isinstance(value, int) else 0
    if kind == "bool":
        return bool(value)
    raise ValueError(f"unknown field kind {kind!r}")


def _message(schema: dict[int, tuple[str, Any]], data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, value in _fields(data):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, tuple) and kind[0] == "repeated":
            out.setdefault(name, []).append(_scalar(kind[1], value))
        elif isinstance(kind, tuple) and kind[0] == "map":
            entry = dict(_fields(value)) if isinstance(value, bytes) else {}
            key = _scalar("string", entry.get(1, b""))
            out.setdefault(name, {})[key] = _scalar(kind[1], entry.get(2, b""))
        else:
            out[name] = _scalar(kind, value)
    return out


def decode(raw: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded built-in object; 400 when it is malformed, 415 for other kinds."""
    if not raw.startswith(MAGIC):
        raise ApiError(400, "the body of the request could not be decoded: protobuf body without the k8s magic")
    try:
        envelope = _message(UNKNOWN, raw[len(MAGIC) :])
        type_meta = envelope.get("typeMeta") or {}
        kind = type_meta.get("kind", "")
        if kind not in KINDS:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - kubesim reads {kind or 'this'} "
                "only as application/json or application/yaml",
                reason="UnsupportedMediaType",
            )
        obj = _message(KINDS[kind], envelope.get("raw") or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body of the request could not be decoded: {exc}") from exc
    return {"apiVersion": type_meta.get("apiVersion") or "v1", "kind": kind, **obj}
