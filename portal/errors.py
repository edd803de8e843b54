"""The one application error type that services raise and a single handler maps to a clear 4xx."""

from __future__ import annotations


class ApplicationError(Exception):
    """A refusal a person can understand: a message (translated), an HTTP status, and maybe a retry hint."""

    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, code: str | None = None, status_code: int | None = None,
                 retry_after: int | None = None, extra: dict | None = None) -> None:
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
