"""HTML pages of the API's subject area: the course audit log for the course's instructors."""

from __future__ import annotations

from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views import View

from api.selectors import audit_events_for_course
from portal.errors import NotFound, PermissionDenied
from portal.selectors import course_get_for_user

AUDIT_PAGE_SIZE = 50


class CourseAuditPage(LoginRequiredMixin, View):
    """Who started, stopped, extended, checked or overrode what in the course, and when; newest first."""

    def get(self, request: HttpRequest, course_id: int) -> HttpResponse:
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
        return render(
            request, "audit/course_audit.html",
            {"course": course, "page": page, "events": page.object_list, "actions": actions, "action": action},
        )
