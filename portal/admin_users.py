"""The instructor admin's people: accounts of the person's own tenant, and password set-up links for new ones."""

from __future__ import annotations

import csv
import io
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from portal.admin_scoping import AuditedAdminMixin, ScopedFormFieldsMixin, admin_access
from portal.forms import TenantUserChangeForm, TenantUserCreationForm
from portal.http import request_user
from portal.models import Membership, User
from portal.services import PasswordSetupToken, user_password_setup_token


def password_links(request: HttpRequest, people: list[tuple[User, PasswordSetupToken]]) -> dict[str, Any]:
    """Set-password links for (person, token) pairs, also as a CSV to mail-merge (its BOM makes Excel read UTF-8)."""
    links = [
        {
            "username": person.username,
            "email": person.email,
            "name": person.full_name,
            "link": request.build_absolute_uri(
                reverse("password_reset_confirm", kwargs={"uidb64": token.uidb64, "token": token.token})
            ),
        }
        for person, token in people
    ]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["username", "email", "name", "link"])
    writer.writeheader()
    writer.writerows(links)
    return {"links": links, "links_csv": "\ufeff" + buffer.getvalue()}


@admin.register(User)
class UserAdmin(ScopedFormFieldsMixin, AuditedAdminMixin, DjangoUserAdmin):
    """An instructor sees and adds the people of their own tenant, and changes only accounts without staff rights
    whose every membership is in a course they teach. Deleting accounts is for superusers."""

    form = TenantUserChangeForm
    add_form = TenantUserCreationForm
    list_display = ("username", "full_name", "email", "tenant", "is_active", "is_staff")
    search_fields = ("username", "full_name", "email")
    actions = ("issue_password_links",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[User]:
        queryset = super().get_queryset(request)
        access = admin_access(request)
        if access.is_superuser:
            return queryset
        if not access.is_instructor or access.tenant_id is None:
            return queryset.none()
        return queryset.filter(tenant_id=access.tenant_id)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return admin_access(request).is_instructor

    def has_view_permission(self, request: HttpRequest, obj: User | None = None) -> bool:
        access = admin_access(request)
        if obj is None or access.is_superuser:
            return access.is_instructor
        return access.is_instructor and obj.tenant_id is not None and obj.tenant_id == access.tenant_id

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        access = admin_access(request)
        return access.is_superuser or (access.is_instructor and access.tenant_id is not None)

    def has_change_permission(self, request: HttpRequest, obj: User | None = None) -> bool:
        access = admin_access(request)
        if obj is None:
            return self.has_add_permission(request)
        if access.is_superuser:
            return True
        if not access.is_instructor or obj.tenant_id != access.tenant_id or obj.is_staff or obj.is_superuser:
            return False
        return not Membership.objects.filter(user=obj).exclude(course_id__in=access.taught_course_ids).exists()

    def has_delete_permission(self, request: HttpRequest, obj: User | None = None) -> bool:
        return admin_access(request).is_superuser

    def get_fieldsets(self, request: HttpRequest, obj: User | None = None):
        superuser = admin_access(request).is_superuser
        if obj is None:
            fields = ["username", "email", "full_name", "usable_password", "password1", "password2"]
            if superuser:
                fields.insert(3, "tenant")
            return ((None, {"classes": ("wide",), "fields": fields}),)
        # Instructors never see the fields that grant rights or move someone to another tenant.
        rights = (
            ("is_active", "is_staff", "is_superuser", "groups", "user_permissions") if superuser else ("is_active",)
        )
        return (
            (None, {"fields": ("username", "password")}),
            (_("Personal info"), {"fields": ("full_name", "email", "tenant", "time_zone")}),
            (_("Permissions") if superuser else _("Status"), {"fields": rights}),
            (_("Important dates"), {"fields": ("last_login", "date_joined")}),
        )

    def get_readonly_fields(self, request: HttpRequest, obj: User | None = None) -> tuple[str, ...]:
        if admin_access(request).is_superuser:
            return ()
        return ("tenant", "last_login", "date_joined")

    def get_list_filter(self, request: HttpRequest) -> tuple:
        if admin_access(request).is_superuser:
            return ("is_active", "is_staff", "is_superuser", "tenant")
        return ("is_active",)

    def get_list_display(self, request: HttpRequest) -> tuple[str, ...]:
        if admin_access(request).is_superuser:
            return self.list_display
        return ("username", "full_name", "email", "is_active")

    def save_model(self, request: HttpRequest, obj: User, form, change: bool) -> None:
        if not change and not admin_access(request).is_superuser:
            # An instructor's new account always joins their own tenant, with no rights beyond what memberships give.
            obj.tenant = request_user(request).tenant
            obj.is_staff = False
            obj.is_superuser = False
        super().save_model(request, obj, form, change)

    def audit_scope(self, obj: User) -> dict:
        return {"tenant": obj.tenant}

    @admin.action(description=_("Issue set-password links"), permissions=["change"])
    def issue_password_links(self, request: HttpRequest, queryset: QuerySet[User]) -> HttpResponse | None:
        """Links with which the selected people choose a password (new accounts, or a forgotten password)."""
        users = [user for user in queryset.select_related("tenant") if self.has_change_permission(request, user)]
        skipped = queryset.count() - len(users)
        if skipped:
            self.message_user(
                request,
                gettext(
                    "%(count)d selected accounts were skipped: staff accounts and people in courses you do not teach "
                    "get their links from a superuser."
                )
                % {"count": skipped},
                messages.WARNING,
            )
        if not users:
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": gettext("Set-password links"),
            **password_links(
                request, [(user, user_password_setup_token(actor=request_user(request), user=user)) for user in users]
            ),
        }
        # admin_view marks every admin response never_cache, so the links are not kept by any cache.
        return TemplateResponse(request, "admin/portal/user/password_links.html", context)
