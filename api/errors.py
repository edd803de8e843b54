"""The API's one error format, ``{"error": {"code", "message", "retry_after"?, "fields"?, "details"?}}``, and the DRF
exception handler that gives it to every refusal (services, DRF, Django's ``Http404``), with ``Retry-After`` when
waiting helps."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from django.utils.translation import gettext as _
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from portal.errors import ApplicationError, error_body


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Map every known refusal to the error format; anything else propagates and is a server error (500)."""
    headers: dict[str, str] = {}
    retry_after: int | None = None
    fields: dict[str, Any] | None = None

    if isinstance(exc, ApplicationError):
        status_code, code, message = exc.status_code, exc.code, exc.message
        retry_after = exc.retry_after
    elif isinstance(exc, Http404 | ObjectDoesNotExist):
        # Django's messages may name a model or a query; the client learns only that nothing is there.
        status_code, code, message = status.HTTP_404_NOT_FOUND, "not_found", _("Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        status_code, code = status.HTTP_403_FORBIDDEN, "permission_denied"
        message = _("You do not have permission to perform this action.")
    elif isinstance(exc, exceptions.ValidationError):
        status_code, code = status.HTTP_400_BAD_REQUEST, "invalid"
        detail = exc.detail  # ErrorDetail is a str: the tree renders as plain JSON
        if isinstance(detail, dict):
            fields = dict(detail)
            non_field: Any = fields.pop("non_field_errors", None)
            message = str(non_field[0]) if non_field else _("Some fields are not valid.")
        else:
            message = str(detail[0] if isinstance(detail, list) and detail else detail)
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        status_code, message = exc.status_code, str(exc.detail)
        code = codes if isinstance(codes, str) else exc.default_code
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            headers["WWW-Authenticate"] = auth_header
    else:
        return None

    if retry_after is not None:
        retry_after = max(1, int(retry_after))
        headers["Retry-After"] = str(retry_after)
    # A refused request changes nothing, even under ATOMIC_REQUESTS.
    set_rollback()
    body = error_body(code=code, message=message, retry_after=retry_after, fields=fields)
    if isinstance(exc, ApplicationError) and exc.extra:
        body["error"]["details"] = exc.extra  # what a conflict is with, e.g. the attempt in progress
    return Response(body, status=status_code, headers=headers)
