"""Tenant- and role-scoped reads of the core domain. Views, API, consumers and tasks serving a person read
through these, never through bare ``Model.objects.get``."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils.translation import gettext as _

from portal.errors import NotFound, PermissionDenied
from portal.models import STAFF_ROLES, AuditEvent, Course, Membership, Role, Tenant, User


def user_tenant_ids(*, user: User) -> list[int]:
    if not user.is_authenticated:
        return []
    if user.is_superuser:
        return list(Tenant.objects.values_list("id", flat=True))
    return [user.tenant_id] if user.tenant_id else []


def courses_for_user(*, user: User, roles: tuple[str, ...] | None = None) -> QuerySet[Course]:
    """Courses the user belongs to (with one of ``roles`` if given), always inside the user's tenant."""
    if not user.is_authenticated:
        return Course.objects.none()
    if user.is_superuser:
        return Course.objects.all()
    if user.tenant_id is None:
        return Course.objects.none()
    memberships = Membership.objects.filter(user=user, course__tenant_id=user.tenant_id)
    if roles:
        memberships = memberships.filter(role__in=roles)
    return Course.objects.filter(id__in=memberships.values("course_id"))


def staff_courses_for_user(*, user: User) -> QuerySet[Course]:
    return courses_for_user(user=user, roles=tuple(STAFF_ROLES))


def course_role(*, user: User, course: Course) -> str | None:
    """The user's role in the course, or None. Superusers act as instructors everywhere."""
    if not user.is_authenticated:
        return None
    if user.is_superuser:
        return Role.INSTRUCTOR
    if user.tenant_id != course.tenant_id:
        return None
    # One row at most (unique per user and course): no ORDER BY, whose default would join the users table.
    return Membership.objects.filter(user=user, course=course).order_by().values_list("role", flat=True).first()


def course_get_for_user(*, user: User, course_id: int, roles: tuple[str, ...] | None = None) -> Course:
    course = courses_for_user(user=user, roles=roles).filter(id=course_id).select_related("tenant").first()
    if course is None:
        raise NotFound(_("Course not found."))
    return course


def audit_events_for_course(*, user: User, course_id: int) -> QuerySet[AuditEvent]:
    """The course's audit log, for its instructors only (TAs and students of the course get 403)."""
    course = course_get_for_user(user=user, course_id=course_id)
    if course_role(user=user, course=course) != Role.INSTRUCTOR:
        raise PermissionDenied(_("Only the course's instructors may read its audit log."))
    return AuditEvent.objects.filter(course=course).select_related("actor").order_by("-created_at", "-id")
