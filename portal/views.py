"""The home page: a student's courses and labs (state of the latest attempt, due date, grade), and for course
staff the attempts they can watch now; and the page where a person picks the time zone their pages use."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.generic import TemplateView, UpdateView

from grading.models import Grade
from grading.selectors import attempts_visible_to, student_grades
from labs.models import ACTIVE_STATES, Attempt, Lab
from labs.services.attempts import attempt_stops_as_left_at
from portal.forms import PersonalTimeZoneForm
from portal.models import Course
from portal.selectors import staff_courses_for_user, user_tenant_ids
from portal.timezones import tenant_time_zone


@dataclass(frozen=True)
class DashboardLab:
    lab: Lab  # annotated with max_points
    latest: Attempt | None
    grade: Grade | None
    # The latest attempt runs, no page has it open, and its lab stops attempts left alone: when that happens.
    stops_as_left_at: datetime | None = None


@dataclass(frozen=True)
class DashboardCourse:
    course: Course
    labs: list[DashboardLab]


@dataclass(frozen=True)
class StaffCourse:
    course: Course
    active_attempts: list[Attempt]


def student_dashboard(*, user) -> list[DashboardCourse]:
    """The courses the user takes, each lab with its latest attempt and grade, in a fixed number of queries."""
    courses = student_grades(user=user)
    lab_ids = [entry.lab.id for course in courses for entry in course.labs]
    latest: dict[int, Attempt] = {}
    attempts = Attempt.objects.filter(
        student=user, lab_id__in=lab_ids, tenant_id__in=user_tenant_ids(user=user)
    ).order_by("lab_id", "-requested_at", "-id")
    for attempt in attempts:
        latest.setdefault(attempt.lab_id, attempt)
    now = timezone.now()

    def row(entry) -> DashboardLab:
        attempt = latest.get(entry.lab.id)
        stops_at = attempt_stops_as_left_at(attempt, idle_stop_minutes=entry.lab.idle_stop_minutes,
                                            now=now) if attempt else None
        return DashboardLab(lab=entry.lab, latest=attempt, grade=entry.grade, stops_as_left_at=stops_at)

    return [DashboardCourse(course=course.course, labs=[row(entry) for entry in course.labs]) for course in courses]


def staff_dashboard(*, user) -> list[StaffCourse]:
    """Courses the user teaches, with the attempts active in them now (to watch their consoles)."""
    courses = list(staff_courses_for_user(user=user).order_by("code", "term"))
    active: dict[int, list[Attempt]] = {course.id: [] for course in courses}
    attempts = (
        attempts_visible_to(user=user)
        .filter(lab__course__in=courses, state__in=ACTIVE_STATES)
        .select_related("lab", "student")
        .order_by("lab__title", "student__username")
    )
    for attempt in attempts:
        active[attempt.lab.course_id].append(attempt)
    return [StaffCourse(course=course, active_attempts=active[course.id]) for course in courses]


class DashboardView(LoginRequiredMixin, TemplateView):
    template_name = "portal/dashboard.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        user = self.request.user
        context["student_courses"] = student_dashboard(user=user)
        context["staff_courses"] = staff_dashboard(user=user)
        return context


class TimeZoneView(LoginRequiredMixin, UpdateView):
    """The signed-in person's own clock: their institution's (the default) or a zone they choose, for a student
    abroad or an instructor teaching from elsewhere. Every page, and the times they type in admin, follow it."""

    form_class = PersonalTimeZoneForm
    template_name = "portal/time_zone.html"

    def get_object(self, queryset=None):
        return self.request.user

    def next_url(self) -> str:
        candidate = self.request.POST.get("next") or self.request.GET.get("next") or ""
        if url_has_allowed_host_and_scheme(candidate, allowed_hosts={self.request.get_host()},
                                           require_https=self.request.is_secure()):
            return candidate
        return reverse("dashboard")

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["next"] = self.next_url()
        context["institution_zone"] = str(tenant_time_zone(self.request.user.tenant))
        return context

    def form_valid(self, form):
        person = form.save(commit=False)
        person.save(update_fields=["time_zone"])  # nothing else of the row, which another request may be changing
        zone = person.time_zone or str(tenant_time_zone(person.tenant))
        messages.success(self.request, _("Dates and times are now shown in %(zone)s.") % {"zone": zone})
        return redirect(self.next_url())


def favicon_view(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers ask for /favicon.ico where a page names no icon (a JSON error, a file): send them to the icon."""
    return HttpResponseRedirect(static("img/favicon.svg"))
