"""Tenant scoping for the Django admin, by course role rather than model permissions: instructors see the courses
they teach and what hangs off them (changelists, URLs, autocomplete, dropdowns, filters), TAs and students nothing,
superusers everything. Every portal ModelAdmin mixes in one of these classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db import models
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest

from portal.http import request_user
from portal.models import Role
from portal.selectors import courses_for_user
from portal.services import audit_record

_ACCESS_ATTR = "_portal_admin_access"
# Fields that hold a secret (an attempt's agent token, a password hash, an API token's key): no admin lists,
# searches or filters on them, and a filter on one in the address is refused (400).
SECRET_FIELDS = frozenset({"agent_token", "password", "key"})

if TYPE_CHECKING:
    _AdminBase = admin.ModelAdmin[Any]
else:
    _AdminBase = object


@dataclass(frozen=True)
class AdminAccess:
    is_superuser: bool
    tenant_id: int | None
    taught_course_ids: frozenset[int]

    @property
    def is_instructor(self) -> bool:
        return self.is_superuser or bool(self.taught_course_ids)


def admin_access(request: HttpRequest) -> AdminAccess:
    """Cached on the request: the admin asks many times while rendering a page."""
    if not hasattr(request, _ACCESS_ATTR):
        user: Any = request.user
        staff = user.is_authenticated and user.is_active and user.is_staff
        teaches = staff and not user.is_superuser
        taught = courses_for_user(user=user, roles=(Role.INSTRUCTOR,)).values_list("id", flat=True) if teaches else ()
        access = AdminAccess(
            is_superuser=staff and user.is_superuser,
            tenant_id=user.tenant_id if staff else None,
            taught_course_ids=frozenset(taught),
        )
        setattr(request, _ACCESS_ATTR, access)
    return getattr(request, _ACCESS_ATTR)


def forget_admin_access(request: HttpRequest) -> None:
    """Drop the cached access after a change to the person's own memberships (e.g. they created a course)."""
    vars(request).pop(_ACCESS_ATTR, None)


class ScopedFormFieldsMixin(_AdminBase):
    """The base of every portal admin: no lookup through a secret field (``?agent_token__startswith=K`` would give a
    token away one character at a time), and choices scoped like the related model's admin."""

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if SECRET_FIELDS.intersection(lookup.split(LOOKUP_SEP)):
            return False
        return super().lookup_allowed(lookup, value, request)

    def _scoped_choices(self, db_field, request: HttpRequest, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A dropdown offers what the related model's portal admin shows (nothing without one: fail closed)."""
        if not admin_access(request).is_superuser:
            related_admin = self.admin_site._registry.get(db_field.related_model)
            if isinstance(related_admin, ScopedFormFieldsMixin):
                kwargs["queryset"] = related_admin.get_queryset(request)
            else:
                kwargs["queryset"] = db_field.related_model._default_manager.none()
        return kwargs

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        return super().formfield_for_foreignkey(db_field, request, **self._scoped_choices(db_field, request, kwargs))

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        return super().formfield_for_manytomany(db_field, request, **self._scoped_choices(db_field, request, kwargs))


class CourseScopedAdminMixin(ScopedFormFieldsMixin):
    """Rows reached through a course (``course_lookup``: the ORM path to it, "" for Course itself); the person's role
    there decides. With ``read_only`` nobody writes through the admin, superusers included: the services do."""

    course_lookup: str = "course"
    read_only = False

    def course_id_of(self, obj: models.Model) -> int | None:
        if not self.course_lookup:
            return obj.pk
        *path, last = self.course_lookup.split("__")
        target: Any = obj
        for part in path:
            target = getattr(target, part, None)
            if target is None:
                return None
        return getattr(target, f"{last}_id", None)

    def audit_scope(self, obj: Any) -> dict[str, Any]:
        """For ``AuditedAdminMixin``: the course ``obj`` is reached through, and its tenant."""
        course = obj
        if self.course_lookup:
            for part in self.course_lookup.split("__"):
                course = getattr(course, part)
        return {"tenant": course.tenant, "course": course}

    def instructs(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        """Superuser, or instructor of ``obj``'s course (of any course when ``obj`` is None)."""
        access = admin_access(request)
        if obj is None:
            return access.is_instructor
        return access.is_superuser or self.course_id_of(obj) in access.taught_course_ids

    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        queryset = super().get_queryset(request)
        access = admin_access(request)
        if access.is_superuser:
            return queryset
        course_id_field = f"{self.course_lookup}_id" if self.course_lookup else "id"
        return queryset.filter(**{f"{course_id_field}__in": access.taught_course_ids})

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.instructs(request)

    def has_view_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return self.instructs(request, obj)

    def _writes(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return not self.read_only and self.instructs(request, obj)

    has_add_permission = has_change_permission = has_delete_permission = _writes


class CourseScopedInlineMixin(ScopedFormFieldsMixin):
    """An inline whose rights follow the parent object's course (the parent admin's ``course_lookup``)."""

    read_only = False
    parent_model: type[models.Model]  # set by Django's InlineModelAdmin, which this is mixed into

    def _parent_instructs(self, request: HttpRequest, obj: models.Model | None) -> bool:
        parent_admin = self.admin_site._registry.get(self.parent_model)
        if not isinstance(parent_admin, CourseScopedAdminMixin):
            return admin_access(request).is_superuser
        return parent_admin.instructs(request, obj)

    def has_view_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return self._parent_instructs(request, obj)

    def _parent_writes(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return not self.read_only and self._parent_instructs(request, obj)

    has_add_permission = has_change_permission = has_delete_permission = _parent_writes


class AuditedAdminMixin:
    """Every save and delete made through the admin is also an AuditEvent (LogEntry is not tenant-scoped)."""

    def audit_scope(self, obj: Any) -> dict[str, Any]:
        """The tenant and course an object's events belong to; admins override for their model."""
        return {}

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        audit_record(
            actor=request_user(request),
            action=f"admin.{obj._meta.model_name}.{'change' if change else 'add'}",
            target=obj,
            data={"fields": sorted(form.changed_data)} if change else {},
            **self.audit_scope(obj),
        )

    def _audit_delete(self, request, obj) -> None:
        audit_record(
            actor=request_user(request),
            action=f"admin.{obj._meta.model_name}.delete",
            target=obj,
            **self.audit_scope(obj),
        )

    def delete_model(self, request, obj):
        self._audit_delete(request, obj)
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self._audit_delete(request, obj)
        super().delete_queryset(request, queryset)
