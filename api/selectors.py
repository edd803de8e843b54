"""Tenant- and role-scoped querysets the API lists from where the apps offer none (grading runs, grades, a course's
staff check, the audit log), built on ``labs.access`` and ``portal.selectors``."""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django.utils.translation import gettext as _

from grading.models import Grade, GradingRun
from labs.access import attempts_visible_to
from portal.errors import NotFound, PermissionDenied
from portal.models import Course, Role, User
from portal.selectors import course_get_for_user, course_role, courses_for_user, staff_courses_for_user


def grading_runs_for_user(*, user: User) -> QuerySet[GradingRun]:
    return GradingRun.objects.filter(attempt__in=attempts_visible_to(user=user).values("id")).select_related(
        "attempt", "attempt__lab", "attempt__student"
    )


def grades_for_user(*, user: User) -> QuerySet[Grade]:
    """A student's own grades, plus every grade in the courses where the user is staff."""
    if not user.is_authenticated:
        return Grade.objects.none()
    member = courses_for_user(user=user)
    staff = staff_courses_for_user(user=user)
    return Grade.objects.filter(Q(student=user, lab__course__in=member) | Q(lab__course__in=staff)).select_related(
        "lab", "lab__course", "student"
    )


def grade_get_for_user(*, user: User, grade_id: int) -> Grade:
    grade = grades_for_user(user=user).filter(id=grade_id).first()
    if grade is None:
        raise NotFound(_("Grade not found."))
    return grade


def staff_course_get_for_user(*, user: User, course_id: int) -> Course:
    """A course the user may see, refused with 403 (not 404) when the user is only a student there."""
    course = course_get_for_user(user=user, course_id=course_id)
    if course_role(user=user, course=course) not in (Role.INSTRUCTOR, Role.TA):
        raise PermissionDenied(_("Only the course's staff may see this."))
    return course
