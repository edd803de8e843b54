"""Which labs and attempts a person may see, for every persona (student, TA, instructor, superuser, API token):
the tenant boundary, decided here only. A missing row and a forbidden one raise the same ``NotFound``."""

from __future__ import annotations

from typing import TypeVar

from django.db.models import F, Model, Q, QuerySet
from django.utils.translation import gettext as _

from labs.models import ACTIVE_STATES, Attempt, Lab
from portal.errors import NotFound
from portal.models import Role, User
from portal.selectors import courses_for_user, staff_courses_for_user

M = TypeVar("M", bound=Model)


def _first(rows: QuerySet[M], message: str) -> M:
    """The first of ``rows``, or the ``NotFound`` that a missing row and a forbidden one share."""
    row = rows.first()
    if row is None:
        raise NotFound(message)
    return row


def labs_visible_to(*, user: User) -> QuerySet[Lab]:
    """Labs of every course the user belongs to, in any role (every lab for a superuser)."""
    return Lab.objects.filter(course__in=courses_for_user(user=user)).select_related("course")


def lab_get_for_user(*, user: User, lab_id: int) -> Lab:
    return _first(labs_visible_to(user=user).filter(id=lab_id), _("Lab not found."))


def labs_for_staff(*, user: User) -> QuerySet[Lab]:
    """Labs of the courses the user teaches (instructor or TA)."""
    return Lab.objects.filter(course__in=staff_courses_for_user(user=user))


def lab_get_for_staff(*, user: User, lab_id: int) -> Lab:
    return _first(labs_for_staff(user=user).filter(id=lab_id).select_related("course__tenant"), _("Lab not found."))


def lab_get_for_student(*, user: User, lab_id: int) -> Lab:
    """A lab of a course the user takes as a student (any lab for a superuser), with its warm pool for a Start."""
    labs = Lab.objects.filter(course__in=courses_for_user(user=user, roles=(Role.STUDENT,)))
    return _first(labs.filter(id=lab_id).select_related("course__tenant", "pool").order_by(), _("Lab not found."))


def student_role_shown(*, user: User) -> str | None:
    """The role ``lab_get_for_student`` implies: a student's, or None for a superuser (read it from the course)."""
    return None if user.is_superuser else Role.STUDENT


def attempts_visible_to(*, user: User) -> QuerySet[Attempt]:
    """Their own attempts and those of the courses they teach, inside their tenant (all for a superuser)."""
    if not user.is_authenticated:
        return Attempt.objects.none()
    if user.is_superuser:
        return Attempt.objects.all()
    if user.tenant_id is None:
        return Attempt.objects.none()
    return Attempt.objects.filter(tenant_id=user.tenant_id).filter(
        Q(student=user) | Q(lab__course__in=staff_courses_for_user(user=user))
    )


def _attempt_rows(
    attempts: QuerySet[Attempt], *, attempt_id: int, related: bool, with_idle_stop: bool
) -> QuerySet[Attempt]:
    attempts = attempts.filter(id=attempt_id).order_by()  # one row at most: no ORDER BY
    if with_idle_stop:
        attempts = attempts.annotate(lab_idle_stop_minutes=F("lab__idle_stop_minutes"))
    # Never select_related() without fields: that follows every foreign key, and their foreign keys.
    return attempts.select_related("lab", "lab__course", "student", "tenant") if related else attempts


def attempt_get_for_user(*, user: User, attempt_id: int, related: bool = True, with_idle_stop: bool = False) -> Attempt:
    """The attempt if the user is its student or staff of its course; the same NotFound otherwise. ``related``
    joins its lab, course, student and tenant; ``with_idle_stop`` adds ``lab_idle_stop_minutes``."""
    # The common case first, without the join over the courses the user teaches: the student's own attempt.
    attempt = None
    if user.is_authenticated and not user.is_superuser and user.tenant_id is not None:
        own = Attempt.objects.filter(student_id=user.pk, tenant_id=user.tenant_id)
        attempt = _attempt_rows(own, attempt_id=attempt_id, related=related, with_idle_stop=with_idle_stop).first()
    visible = _attempt_rows(
        attempts_visible_to(user=user), attempt_id=attempt_id, related=related, with_idle_stop=with_idle_stop
    )
    return attempt or _first(visible, _("Attempt not found."))


def attempt_get_for_staff(*, user: User, attempt_id: int) -> Attempt:
    """An attempt in a course the user teaches (the TA pages; not the student's own)."""
    attempts = Attempt.objects.filter(id=attempt_id, lab__course__in=staff_courses_for_user(user=user))
    return _first(attempts.select_related("lab__course__tenant", "student"), _("Attempt not found."))


def attempts_for_student(*, user: User, lab: Lab | None = None) -> QuerySet[Attempt]:
    """The student's own attempts (newest first), optionally of one lab: the student dashboard's rows."""
    if user.tenant_id is None:
        return Attempt.objects.none()
    attempts = Attempt.objects.filter(student=user, tenant_id=user.tenant_id).select_related("lab", "lab__course")
    return attempts.filter(lab=lab) if lab is not None else attempts


def attempts_going_for_student(*, user: User) -> QuerySet[Attempt]:
    """The student's attempts that hold (or are about to hold) a VM, with their labs: what a per-student cap counts."""
    return attempts_for_student(user=user).filter(state__in=ACTIVE_STATES).order_by("requested_at", "id")
