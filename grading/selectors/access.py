"""Tenant- and role-scoped lookups for grading pages: a missing object and a forbidden one raise the same
``NotFound``, so no URL reveals what exists in another course or tenant."""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django.utils.translation import gettext as _

from grading.models import GradingRun
from labs.models import Attempt, Lab
from portal.errors import NotFound
from portal.models import Course, Membership, Role, User
from portal.selectors import course_get_for_user, staff_courses_for_user, user_tenant_ids


def staff_course_get(*, user: User, course_id: int) -> Course:
    """A course the user teaches (instructor or TA) in their own tenant."""
    return course_get_for_user(user=user, course_id=course_id, roles=(Role.INSTRUCTOR, Role.TA))


def labs_for_staff(*, user: User) -> QuerySet[Lab]:
    return Lab.objects.filter(
        course__in=staff_courses_for_user(user=user), course__tenant_id__in=user_tenant_ids(user=user)
    )


def lab_get_for_staff(*, user: User, lab_id: int) -> Lab:
    lab = labs_for_staff(user=user).filter(id=lab_id).select_related("course__tenant").first()
    if lab is None:
        raise NotFound(_("Lab not found."))
    return lab


def lab_get_for_student(*, user: User, lab_id: int) -> Lab:
    """A lab of a course the user takes as a student (``student_role_shown``); any lab for a superuser."""
    if not user.is_authenticated:
        raise NotFound(_("Lab not found."))
    if user.is_superuser:
        lab = Lab.objects.filter(id=lab_id).select_related("course__tenant").order_by().first()
    elif user.tenant_id is None:  # a student belongs to a tenant
        lab = None
    else:
        lab = (
            Lab.objects.filter(id=lab_id, course__tenant_id=user.tenant_id, course__memberships__user_id=user.pk,
                               course__memberships__role=Role.STUDENT)
            .select_related("course__tenant").order_by().first()
        )
    if lab is None:
        raise NotFound(_("Lab not found."))
    return lab


def student_role_shown(*, user: User) -> str | None:
    """The user's role in the course of a lab ``lab_get_for_student`` found, as its query proved it: a student's
    membership for everyone but superusers, whose lab comes without one (None: the role is still to be read)."""
    return None if user.is_superuser else Role.STUDENT


def attempts_visible_to(*, user: User) -> QuerySet[Attempt]:
    """Attempts the user may see: their own, and every attempt in the courses they teach; never another
    tenant's."""
    return Attempt.objects.filter(tenant_id__in=user_tenant_ids(user=user)).filter(
        Q(student_id=user.pk) | Q(lab__course__in=staff_courses_for_user(user=user))
    )


def attempt_get_for_grading(*, user: User, attempt_id: int) -> Attempt:
    """The student's own attempt, or one in a course the user teaches (the Check button and run status)."""
    attempt = attempts_visible_to(user=user).filter(id=attempt_id).select_related("lab__course", "tenant").first()
    if attempt is None:
        raise NotFound(_("Attempt not found."))
    return attempt


def attempt_get_for_staff(*, user: User, attempt_id: int) -> Attempt:
    attempt = (
        Attempt.objects.filter(
            id=attempt_id, lab__course__in=staff_courses_for_user(user=user),
            tenant_id__in=user_tenant_ids(user=user),
        )
        .select_related("lab__course__tenant", "student")
        .first()
    )
    if attempt is None:
        raise NotFound(_("Attempt not found."))
    return attempt


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
