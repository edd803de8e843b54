"""Tenant- and role-scoped querysets the API lists from, where the apps' own selectors offer no such list.

Attempts come from ``labs.selectors``, single grading runs from ``grading.selectors`` and the audit log from
``portal.selectors``; the lists of labs, grading runs and grades and the staff check on a course are here.
Each one starts from ``portal.selectors.courses_for_user`` / ``staff_courses_for_user`` or
``labs.selectors.attempts_for_user`` (which keep to the user's tenant), so a row of another tenant can never
appear. Single objects are fetched through these same querysets, and a missing row and a forbidden one raise
the same ``NotFound``.
"""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django.utils.translation import gettext as _

from grading.models import Grade, GradingRun
from labs.models import Lab
from labs.selectors import attempts_for_user
from portal.errors import NotFound, PermissionDenied
from portal.models import Course, Role, User
from portal.selectors import course_get_for_user, course_role, courses_for_user, staff_courses_for_user


def labs_for_user(*, user: User) -> QuerySet[Lab]:
    """Labs of every course the user belongs to, in any role."""
    return Lab.objects.filter(course__in=courses_for_user(user=user)).select_related("course")


def lab_get_for_user(*, user: User, lab_id: int) -> Lab:
    lab = labs_for_user(user=user).filter(id=lab_id).first()
    if lab is None:
        raise NotFound(_("Lab not found."))
    return lab


def grading_runs_for_user(*, user: User) -> QuerySet[GradingRun]:
    return (
        GradingRun.objects.filter(attempt__in=attempts_for_user(user=user).values("id"))
        .select_related("attempt", "attempt__lab", "attempt__student")
    )


def grades_for_user(*, user: User) -> QuerySet[Grade]:
    """A student's own grades, plus every grade in the courses where the user is staff."""
    if not user.is_authenticated:
        return Grade.objects.none()
    member = courses_for_user(user=user)
    staff = staff_courses_for_user(user=user)
    return (
        Grade.objects.filter(Q(student=user, lab__course__in=member) | Q(lab__course__in=staff))
        .select_related("lab", "lab__course", "student")
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


