"""The instructor admin for the core domain: tenants (superusers), courses, memberships, the audit log. Who sees
what is ``portal.admin_scoping``'s; writes with a business rule go through ``portal.services``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, cast

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from rest_framework.authtoken.models import TokenProxy

from portal.admin_scoping import (
    AuditedAdminMixin,
    CourseScopedAdminMixin,
    ScopedFormFieldsMixin,
    admin_access,
    forget_admin_access,
)

# Importing admin_users also registers the people's admin.
from portal.admin_users import password_links
from portal.enrollment_import import enrollment_import
from portal.errors import ApplicationError
from portal.forms import CourseAdminForm, EnrollmentImportForm, MembershipAdminForm, TenantAdminForm
from portal.http import request_user
from portal.models import AuditEvent, Course, Membership, Tenant
from portal.services import course_create, membership_create, membership_set_role

admin.site.site_header = _("Lab portal administration")
admin.site.site_title = _("Lab portal")
admin.site.index_title = _("Courses, labs and people")
# DRF's API-token admin lists every key in the clear; a token ends with revocation, a new password or deactivation.
if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class _CourseCounts(TypedDict):
    num_members: int
    num_labs: int


@admin.register(Tenant)
class TenantAdmin(ScopedFormFieldsMixin, AuditedAdminMixin, admin.ModelAdmin):
    """Platform-level: superusers only, invisible to everyone else."""

    form = TenantAdminForm
    list_display = ("name", "namespace", "time_zone", "max_concurrent_vms", "max_vcpus", "max_memory_mib", "created_at")
    search_fields = ("name", "namespace")
    readonly_fields = ("namespace", "created_at")
    fields = (
        "name",
        "namespace",
        "time_zone",
        "max_concurrent_vms",
        "max_vms_per_student",
        "max_vcpus",
        "max_memory_mib",
        "created_at",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tenant]:
        queryset = super().get_queryset(request)
        return queryset if admin_access(request).is_superuser else queryset.none()

    def _superuser(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        return admin_access(request).is_superuser

    has_module_permission = has_view_permission = has_add_permission = _superuser
    has_change_permission = has_delete_permission = _superuser

    def audit_scope(self, obj: Tenant) -> dict:
        return {"tenant": obj}


@admin.register(Course)
class CourseAdmin(CourseScopedAdminMixin, AuditedAdminMixin, admin.ModelAdmin):
    course_lookup = ""
    form = CourseAdminForm
    change_form_template = "admin/portal/course/change_form.html"
    list_display = ("code", "title", "term", "tenant", "member_count", "lab_count")
    list_display_links = ("code", "title")
    search_fields = ("code", "title", "term")
    ordering = ("code", "term")

    def get_fields(self, request: HttpRequest, obj: Course | None = None) -> tuple[str, ...]:
        fields = ("code", "title", "term")
        # The tenant is chosen by superusers only; an instructor's course always lands in their own tenant.
        return ("tenant", *fields) if admin_access(request).is_superuser else fields

    def get_list_filter(self, request: HttpRequest) -> tuple:
        return ("term", "tenant") if admin_access(request).is_superuser else ("term",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Course]:
        return (
            super()
            .get_queryset(request)
            .select_related("tenant")
            .annotate(num_members=Count("memberships", distinct=True), num_labs=Count("labs", distinct=True))
        )

    @admin.display(description=_("members"), ordering="num_members")
    def member_count(self, course: WithAnnotations[Course, _CourseCounts]) -> int:
        return course.num_members

    @admin.display(description=_("labs"), ordering="num_labs")
    def lab_count(self, course: WithAnnotations[Course, _CourseCounts]) -> int:
        return course.num_labs

    def get_form(
        self, request: HttpRequest, obj: Course | None = None, change: bool = False, **kwargs: Any
    ) -> type[CourseAdminForm]:
        # The admin builds a subclass of ``self.form`` (CourseAdminForm), typed as any model form.
        form = cast("type[CourseAdminForm]", super().get_form(request, obj, change, **kwargs))
        form.tenant = request_user(request).tenant
        return form

    def save_model(self, request: HttpRequest, obj: Course, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        if not admin_access(request).is_superuser:
            tenant = request_user(request).tenant
            if tenant is None:
                raise PermissionDenied
            obj.tenant = tenant
        course_create(actor=request_user(request), course=obj)
        forget_admin_access(request)

    def get_urls(self):
        return [
            path(
                "<path:object_id>/enrollment-import/",
                self.admin_site.admin_view(self.enrollment_import_view),
                name="portal_course_enrollment_import",
            ),
            *super().get_urls(),
        ]

    def enrollment_import_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Upload a CSV of people; show every bad line, or the result with set-password links (never cached)."""
        course = self.get_object(request, unquote(object_id))
        if course is None or not self.has_change_permission(request, course):
            raise Http404(gettext("Course not found."))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": course,
            "course": course,
            "title": gettext("Import enrollment into %(course)s") % {"course": course},
        }
        form = EnrollmentImportForm(request.POST, request.FILES) if request.method == "POST" else EnrollmentImportForm()
        if form.is_valid():
            try:
                result = enrollment_import(
                    actor=request_user(request), course=course, csv_file=form.cleaned_data["csv_file"]
                )
            except ApplicationError as exc:
                context.update(import_error=exc.message, row_errors=exc.extra.get("errors", []))
            else:
                people = [(person.user, person.password_setup) for person in result.people if person.password_setup]
                self.message_user(
                    request,
                    gettext(
                        "Imported. New accounts: %(accounts)d; new memberships: %(memberships)d; already "
                        "enrolled: %(unchanged)d."
                    )
                    % {
                        "accounts": result.accounts_created,
                        "memberships": result.memberships_created,
                        "unchanged": result.unchanged,
                    },
                    messages.SUCCESS,
                )
                context.update(result=result, **password_links(request, people))
                form = EnrollmentImportForm()
        context["form"] = form
        return TemplateResponse(request, "admin/portal/course/enrollment_import.html", context)


@admin.register(Membership)
class MembershipAdmin(CourseScopedAdminMixin, AuditedAdminMixin, admin.ModelAdmin):
    form = MembershipAdminForm
    autocomplete_fields = ("user", "course")
    list_display = ("user", "user_username", "user_email", "course", "role", "created_at")
    list_filter = ("role", ("course", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("user", "course")
    search_fields = ("user__username", "user__full_name", "user__email", "course__code", "course__title")

    @admin.display(description=_("username"), ordering="user__username")
    def user_username(self, membership: Membership) -> str:
        return membership.user.username

    @admin.display(description=_("email address"), ordering="user__email")
    def user_email(self, membership: Membership) -> str:
        return membership.user.email

    def get_readonly_fields(self, request: HttpRequest, obj: Membership | None = None) -> tuple[str, ...]:
        # A membership is a person in a course; to move someone, remove the membership and add another.
        return ("user", "course") if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: Membership, form, change: bool) -> None:
        if change:
            # The form has already put the new role on ``obj``; the service compares with the stored one.
            stored = Membership.objects.select_related("user", "course__tenant").get(pk=obj.pk)
            membership_set_role(actor=request_user(request), membership=stored, role=obj.role)
            return
        membership_create(actor=request_user(request), membership=obj)
        if obj.user_id == request_user(request).pk:
            forget_admin_access(request)


@admin.register(AuditEvent)
class AuditEventAdmin(CourseScopedAdminMixin, admin.ModelAdmin):
    read_only = True
    list_display = ("created_at", "actor", "action", "target_repr", "course")
    list_filter = ("action", ("course", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("actor", "course")
    search_fields = ("action", "target_repr", "actor__username")
    fields = ("created_at", "actor", "action", "tenant", "course", "target_type", "target_id", "target_repr", "data")
