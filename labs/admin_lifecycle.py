"""The lifecycle's part of the attempt admin: audited stop and extend actions, and a capacity page per tenant."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.timesince import timesince
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from labs.models import Attempt, TenantNamespace
from labs.selectors import tenant_capacity, tenants_for_capacity_view
from labs.services import attempt_extend, attempt_stop
from labs.services.namespaces import is_refusal_record
from portal.admin_scoping import CourseScopedAdminMixin
from portal.errors import ApplicationError
from portal.http import request_user


class AttemptLifecycleAdminMixin(CourseScopedAdminMixin):
    """Mixed into ``labs.admin.AttemptAdmin``: the stop and extend actions and the capacity page."""

    actions = ("stop_attempts", "extend_attempts")
    change_list_template = "admin/labs/attempt/change_list.html"

    def has_lifecycle_permission(self, request: HttpRequest) -> bool:
        return self.instructs(request)

    @admin.display(description=gettext_lazy("age"), ordering="requested_at")
    def age(self, attempt: Attempt) -> str:
        return timesince(attempt.requested_at, timezone.now())

    def _apply(self, request: HttpRequest, queryset: QuerySet[Attempt], service, done_message: str) -> None:
        done, refusals = 0, []
        for attempt in queryset.select_related("lab__course", "student"):
            if not self.instructs(request, attempt):
                refusal = _("you do not teach this course")
                refusals.append(f"{attempt}: {refusal}")
                continue
            try:
                service(actor=request_user(request), attempt=attempt)
                done += 1
            except ApplicationError as error:
                refusals.append(f"{attempt}: {error.message}")
        if done:
            self.message_user(request, done_message % {"count": done}, messages.SUCCESS)
        for refusal in refusals:
            self.message_user(request, refusal, messages.WARNING)

    @admin.action(
        description=gettext_lazy("Stop the selected attempts (grade once more, then delete the VM)"),
        permissions=["lifecycle"],
    )
    def stop_attempts(self, request: HttpRequest, queryset: QuerySet[Attempt]) -> None:
        self._apply(request, queryset, attempt_stop, _("Stopping %(count)d attempt(s)."))

    @admin.action(description=gettext_lazy("Extend the time limit of the selected attempts"), permissions=["lifecycle"])
    def extend_attempts(self, request: HttpRequest, queryset: QuerySet[Attempt]) -> None:
        self._apply(request, queryset, attempt_extend, _("Extended %(count)d attempt(s)."))

    def get_urls(self):
        opts = self.model._meta
        return [
            path(
                "capacity/",
                self.admin_site.admin_view(self.capacity_view),
                name=f"{opts.app_label}_{opts.model_name}_capacity",
            ),
            *super().get_urls(),
        ]

    def capacity_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.instructs(request):
            raise PermissionDenied
        tenants = list(tenants_for_capacity_view(user=request_user(request)))
        namespaces = {row.tenant_id: row for row in TenantNamespace.objects.filter(tenant__in=tenants)}
        rows = []
        for tenant in tenants:
            capacity = tenant_capacity(tenant=tenant)
            rows.append(
                {
                    "capacity": capacity,
                    "vms_percent": capacity.percent(capacity.active_vms, tenant.max_concurrent_vms),
                    "vcpus_percent": capacity.percent(capacity.vcpus, tenant.max_vcpus),
                    "memory_percent": capacity.percent(capacity.memory_mib, tenant.max_memory_mib),
                    "namespace": namespaces.get(tenant.id),
                    # The cluster refuses the portal there: the exact command for this tenant, under its words.
                    "role_missing": tenant.id in namespaces and is_refusal_record(namespaces[tenant.id].last_error),
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "title": _("Lab capacity"),
            "opts": self.model._meta,
            "rows": rows,
        }
        return TemplateResponse(request, "admin/labs/attempt/capacity.html", context)
