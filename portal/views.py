"""Every app's page base (PageView) and the core's pages: time zone, a course's audit log, favicon, 500 handler."""

from __future__ import annotations

import secrets
import sys
from typing import Any

from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.templatetags.static import static
from django.urls import Resolver404, resolve, reverse
from django.utils import formats, timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views import View
from django.views.generic import UpdateView

from portal.errors import NotFound, PermissionDenied, database_busy, error_body
from portal.forms import PersonalTimeZoneForm
from portal.http import AuthenticatedRequest
from portal.metrics import record_request_failure
from portal.selectors import audit_events_for_course, course_get_for_user
from portal.services import user_time_zone_set
from portal.timezones import API_NAMESPACE, tenant_time_zone

AUDIT_PAGE_SIZE = 50
# How the audit log names the actions people take; an action missing here is shown by its code.
ACTION_LABELS = {
    "attempt.start": gettext_lazy("started an attempt"),
    "attempt.stop": gettext_lazy("stopped an attempt"),
    "attempt.extend": gettext_lazy("extended an attempt"),
    "grading.run_requested": gettext_lazy("ran the checks"),
    "grading.override_set": gettext_lazy("overrode a grade"),
    "grading.override_removed": gettext_lazy("removed a grade override"),
    "grading.regraded": gettext_lazy("regraded an attempt"),
    "grading.lab_regrade_queued": gettext_lazy("queued a regrade of a lab"),
    "grading.lab_regraded": gettext_lazy("regraded a lab"),
    "console.take_control": gettext_lazy("took control of a console"),
    "console.release_control": gettext_lazy("released control of a console"),
    "enrollment.import": gettext_lazy("imported enrolments"),
    "membership.create": gettext_lazy("added a member"),
    "membership.role": gettext_lazy("changed a member's role"),
    "admin.lab.add": gettext_lazy("added a lab"),
    "admin.lab.change": gettext_lazy("changed a lab"),
    "admin.lab.delete": gettext_lazy("deleted a lab"),
    "admin.labpool.add": gettext_lazy("added a warm pool"),
    "admin.labpool.change": gettext_lazy("changed a warm pool"),
    "admin.labpool.delete": gettext_lazy("deleted a warm pool"),
    "admin.course.change": gettext_lazy("changed the course"),
    "admin.membership.delete": gettext_lazy("removed a member"),
    "admin.lab.checks": gettext_lazy("changed a lab's checks"),
    "course.create": gettext_lazy("created the course"),
}


def audit_detail_text(value: object, separator: str = ", ") -> str:
    """A detail as a person reads it: a time in the reader's zone, a list as its items, nothing as a dash."""
    if isinstance(value, list):
        return separator.join(audit_detail_text(item, " ") for item in value) or "—"
    try:
        moment = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # shaped like a time but not one, such as a reason typed by a person
        moment = None
    if moment is not None and timezone.is_aware(moment):
        return formats.date_format(timezone.localtime(moment), "DATETIME_FORMAT")
    return "—" if value is None else str(value)


class PageView(LoginRequiredMixin, View):
    """Sign-in required; ``NotFound`` from a selector or service is the 404 page, ``PermissionDenied`` a 403."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        # A page's script (Start, Check, Stop) would follow the redirect to the sign-in page and take it for success.
        if not request.user.is_authenticated and wants_json(request):
            message = _("You are signed out. Reload the page to sign in again.")
            return JsonResponse({"error": message, "code": "signed_out"}, status=401)
        try:
            return super().dispatch(request, *args, **kwargs)
        except NotFound as exc:
            raise Http404(exc.message) from exc
        except PermissionDenied as exc:
            raise DjangoPermissionDenied(exc.message) from exc


class CourseAuditPage(PageView):
    """Who started, stopped, extended, checked or overrode what in the course, and when; newest first."""

    def get(self, request: AuthenticatedRequest, course_id: int) -> HttpResponse:
        events = audit_events_for_course(user=request.user, course_id=course_id)
        course = course_get_for_user(user=request.user, course_id=course_id)
        action = request.GET.get("action", "")[:80]
        actions = sorted(set(events.values_list("action", flat=True).order_by()))
        if action:
            events = events.filter(action=action)
        page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
        rows = [
            {
                "event": event,
                "label": ACTION_LABELS.get(event.action, event.action),
                "details": [(key, audit_detail_text(value)) for key, value in sorted((event.data or {}).items())],
            }
            for event in page.object_list
        ]
        return render(
            request,
            "audit/course_audit.html",
            {
                "course": course,
                "page": page,
                "rows": rows,
                "action": action,
                "actions": [(code, ACTION_LABELS.get(code, code)) for code in actions],
            },
        )


class TimeZoneView(LoginRequiredMixin, UpdateView):
    """The signed-in person's own clock, which every page and the admin's typed times follow."""

    request: AuthenticatedRequest

    form_class = PersonalTimeZoneForm
    template_name = "portal/time_zone.html"

    def get_object(self, queryset=None):
        return self.request.user

    def next_url(self) -> str:
        candidate = self.request.POST.get("next") or self.request.GET.get("next") or ""
        if url_has_allowed_host_and_scheme(
            candidate, allowed_hosts={self.request.get_host()}, require_https=self.request.is_secure()
        ):
            return candidate
        return reverse("dashboard")

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["next"] = self.next_url()
        context["institution_zone"] = str(tenant_time_zone(self.request.user.tenant))
        return context

    def form_valid(self, form):
        person = user_time_zone_set(
            actor=self.request.user, user=self.request.user, time_zone=form.cleaned_data["time_zone"]
        )
        zone = person.time_zone or str(tenant_time_zone(person.tenant))
        messages.success(self.request, _("Dates and times are now shown in %(zone)s.") % {"zone": zone})
        return redirect(self.next_url())


def favicon_view(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers ask for /favicon.ico where a page names no icon (a JSON error, a file): send them to the icon."""
    return HttpResponseRedirect(static("img/favicon.svg"))


# Seconds a client is asked to wait when the database is busy: short (the pool frees a connection as each request
# ends), spread so that a refused class does not come back in the same second.
BUSY_RETRY_AFTER_SECONDS = range(3, 11)


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def _is_api(request: HttpRequest) -> bool:
    """A request for the API, whether or not its URL was resolved before it failed (middleware runs first), or one
    under the API's prefix that matches none of its routes."""
    match = request.resolver_match
    if match is None:
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return request.path_info.startswith(f"/{API_NAMESPACE}/")
    return API_NAMESPACE in match.namespaces


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``handler404``: the API's error format for the API, JSON for the pages' scripts, else the portal's own page."""
    if _is_api(request):
        return JsonResponse(error_body(code="not_found", message=_("Not found.")), status=404)
    message = _("There is nothing here. The link may be mistyped, or lead to something your account may not see.")
    if wants_json(request):
        return JsonResponse({"error": message, "code": "not_found"}, status=404)
    return render(request, "error_page.html", {"heading": _("Page not found"), "message": message}, status=404)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: most often a form from a page older than a sign-in or sign-out in another tab."""
    message = _(
        "This page is out of date (you may have signed in or out in another tab), so nothing was done. Reload the "
        "page and try again; if this keeps happening, allow cookies for this site."
    )
    if wants_json(request):
        return JsonResponse({"error": message, "code": "csrf_failed"}, status=403)
    return render(request, "error_page.html", {"heading": _("Page out of date"), "message": message}, status=403)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: 503 with Retry-After when the database pool stayed exhausted, else 500; in the API's format, as
    JSON or as a page. It touches neither the database nor the session, and shows nothing of the error's text."""
    retry_after = None
    if database_busy(sys.exc_info()[1]):
        status, code = 503, "portal_busy"
        message = _("The portal is very busy right now and could not answer. Try again in a few seconds.")
        retry_after = secrets.choice(BUSY_RETRY_AFTER_SECONDS)
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
