"""API errors and the ``metav1.Status`` bodies the API server answers with."""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    """An error answered to the client as a Status body with the matching HTTP code."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def not_found(group_resource: str, name: str, *, kind_plural: str) -> ApiError:
    return ApiError(
        404,
        f'{group_resource} "{name}" not found',
        details={"name": name, "group": _group(group_resource), "kind": kind_plural},
    )


def already_exists(group_resource: str, name: str, *, kind_plural: str) -> ApiError:
    return ApiError(
        409,
        f'{group_resource} "{name}" already exists',
        reason="AlreadyExists",
        details={"name": name, "group": _group(group_resource), "kind": kind_plural},
    )


def conflict(group_resource: str, name: str, *, kind_plural: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {group_resource} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        details={"name": name, "group": _group(group_resource), "kind": kind_plural},
    )


def invalid(kind: str, group: str, name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid in the API server's wording: ``Kind.group "name" is invalid: field: message``."""
    qualified = f"{kind}.{group}" if group else kind
    summary = ", ".join(f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes)
    return ApiError(
        422,
        f'{qualified} "{name}" is invalid: {summary}',
        details={"name": name, "group": group, "kind": kind, "causes": causes},
    )


def _group(group_resource: str) -> str:
    return group_resource.split(".", 1)[1] if "." in group_resource else ""
