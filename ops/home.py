"""The home page: a student's courses and labs (state of the latest attempt, due date, grade), and for course
staff the attempts they can watch now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.mixins import LoginRequiredMixin
from django.utils import timezone
from django.views.generic import TemplateView

from grading.models import Grade
from grading.selectors import student_grades
from labs.access import attempts_visible_to
from labs.models import ACTIVE_STATES, Attempt, Lab
from labs.services.stopping import attempt_stops_as_left_at
from portal.http import AuthenticatedRequest
from portal.models import Course
from portal.selectors import staff_courses_for_user, user_tenant_ids


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
        stops_at = (
            attempt_stops_as_left_at(attempt, idle_stop_minutes=entry.lab.idle_stop_minutes, now=now)
            if attempt
            else None
        )
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
    request: AuthenticatedRequest

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        user = self.request.user
        context["student_courses"] = student_dashboard(user=user)
        context["staff_courses"] = staff_dashboard(user=user)
        return context
