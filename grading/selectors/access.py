"""Grading's own scoped lookups (a grading run, a course's student); which labs and attempts a user may see is
``labs.access``'s. A missing object and a forbidden one raise the same ``NotFound``."""

from __future__ import annotations

from django.utils.translation import gettext as _

from grading.models import GradingRun
from labs.access import attempts_visible_to
from portal.errors import NotFound
from portal.models import Course, Membership, Role, User


def run_get_for_user(*, user: User, run_id: int) -> GradingRun:
    run = (
        GradingRun.objects.filter(id=run_id, attempt__in=attempts_visible_to(user=user))
        .select_related("attempt")
        .prefetch_related("results")
        .first()
    )
    if run is None:
        raise NotFound(_("Grading run not found."))
    return run


def course_student_get(*, course: Course, student_id: int) -> User:
    """A student enrolled in the course (staff pages address students only through their course)."""
    membership = (
        Membership.objects.filter(course=course, user_id=student_id, role=Role.STUDENT, user__tenant=course.tenant)
        .select_related("user")
        .first()
    )
    if membership is None:
        raise NotFound(_("Student not found."))
    return membership.user
