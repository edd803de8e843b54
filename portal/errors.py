"""The one application error type that services raise and a single handler maps to a clear 4xx; the API's error
format; and telling a database too busy to answer (its connection pool timed out) from other failures."""

from __future__ import annotations

from typing import Any

from psycopg_pool import PoolTimeout


class ApplicationError(Exception):
    """A refusal a person can understand: a message (translated), an HTTP status, and maybe a retry hint."""

    status_code = 400
    code = "invalid"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status_code: int | None = None,
        retry_after: int | None = None,
        extra: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.message = str(message)
        if code is not None:
            self.code = code
        if status_code is not None:
            self.status_code = status_code
        self.retry_after = retry_after
        self.extra = extra or {}


class NotFound(ApplicationError):
    """Raised alike for a missing object and for one the person may not see (no existence oracle)."""

    status_code = 404
    code = "not_found"


class PermissionDenied(ApplicationError):
    """For actions on objects the person can see but may not change (e.g. a TA typing into a console)."""

    status_code = 403
    code = "permission_denied"


class Conflict(ApplicationError):
    status_code = 409
    code = "conflict"


class Unavailable(ApplicationError):
    """Capacity is full (tenant quota or cluster): try again later."""

    status_code = 503
    code = "unavailable"


def error_body(
    *, code: str, message: str, retry_after: int | None = None, fields: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The API's error format (``api.errors``), also used for a failed API request (``portal.views.server_error``)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if retry_after is not None:
        error["retry_after"] = retry_after
    if fields:
        error["fields"] = fields
    return {"error": error}


def database_busy(error: BaseException | None) -> bool:
    """Did ``error`` come from the connection pool timing out (``PoolTimeout``, wrapped by Django)?"""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, PoolTimeout):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
