"""The course audit log page, for the course's instructors."""

from __future__ import annotations

from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext_lazy as _
from django.views import View

from portal.errors import NotFound, PermissionDenied
from portal.http import AuthenticatedRequest
from portal.selectors import audit_events_for_course, course_get_for_user

AUDIT_PAGE_SIZE = 50
# How the audit log names the actions people take; an action missing here is shown by its code.
ACTION_LABELS = {
    "attempt.start": _("started an attempt"),
    "attempt.stop": _("stopped an attempt"),
    "attempt.extend": _("extended an attempt"),
    "grading.run_requested": _("ran the checks"),
    "grading.override_set": _("overrode a grade"),
    "grading.override_removed": _("removed a grade override"),
    "grading.regraded": _("regraded an attempt"),
    "grading.lab_regrade_queued": _("queued a regrade of a lab"),
    "grading.lab_regraded": _("regraded a lab"),
    "console.take_control": _("took control of a console"),
    "console.release_control": _("released control of a console"),
    "enrollment.import": _("imported enrolments"),
    "membership.create": _("added a member"),
    "membership.role": _("changed a member's role"),
    "admin.lab.add": _("added a lab"),
    "admin.lab.checks": _("changed a lab's checks"),
    "course.create": _("created the course"),
}


class CourseAuditPage(LoginRequiredMixin, View):
    """Who started, stopped, extended, checked or overrode what in the course, and when; newest first."""

    def get(self, request: AuthenticatedRequest, course_id: int) -> HttpResponse:
        try:
            events = audit_events_for_course(user=request.user, course_id=course_id)
            course = course_get_for_user(user=request.user, course_id=course_id)
        except NotFound as exc:
            raise Http404(exc.message) from exc
        except PermissionDenied as exc:
            raise DjangoPermissionDenied(exc.message) from exc
        action = request.GET.get("action", "")[:80]
        actions = sorted(set(events.values_list("action", flat=True).order_by()))
        if action:
            events = events.filter(action=action)
        page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
        rows = [
            {
                "event": event,
                "label": ACTION_LABELS.get(event.action, event.action),
                "details": sorted((event.data or {}).items()),
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
