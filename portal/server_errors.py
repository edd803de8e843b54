"""Django's ``handler500``: 503 with Retry-After when the database pool stayed exhausted (waiting helps), else 500,
in the API's format, as JSON for the pages' scripts, or as a page in the browser's language. It touches neither the
database nor the session, either of which may be what failed."""

from __future__ import annotations

import secrets
import sys

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.urls import Resolver404, resolve
from django.utils.translation import gettext as _

from portal.errors import database_busy, error_body
from portal.metrics import record_request_failure
from portal.timezones import API_NAMESPACE

# Seconds a client is asked to wait when the database is busy: short (the pool frees a connection as each request
# ends), spread so that a refused class does not come back in the same second.
BUSY_RETRY_AFTER_RANGE = (3, 10)


def wants_json(request: HttpRequest) -> bool:
    """Does the request come from a page's script that reads JSON (``Accept: application/json``)?"""
    return "application/json" in request.headers.get("Accept", "")


def _is_api(request: HttpRequest) -> bool:
    """A request for the API, whether or not its URL was resolved before it failed (middleware runs first)."""
    match = request.resolver_match
    if match is None:
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return False
    return API_NAMESPACE in match.namespaces


def server_error(request: HttpRequest) -> HttpResponse:
    """Counted in ``portal_requests_failed_total``; nothing of the error's own text reaches the person."""
    retry_after = None
    if database_busy(sys.exc_info()[1]):
        status, code = 503, "portal_busy"
        message = _("The portal is very busy right now and could not answer. Try again in a few seconds.")
        low, high = BUSY_RETRY_AFTER_RANGE
        retry_after = low + secrets.randbelow(high - low + 1)
    else:
        status, code = 500, "server_error"
        message = _(
            "Something went wrong on the portal's side. Try again; if it keeps happening, tell your instructor."
        )
    record_request_failure(reason=code)
    if _is_api(request):
        response: HttpResponse = JsonResponse(
            error_body(code=code, message=message, retry_after=retry_after), status=status
        )
    elif wants_json(request):
        response = JsonResponse({"error": message, "code": code}, status=status)
    else:
        response = HttpResponse(
            render_to_string("server_error.html", {"status": status, "message": message}), status=status
        )
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response
