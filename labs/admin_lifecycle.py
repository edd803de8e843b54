"""The lifecycle's part of the admin: audited stop and extend actions and a capacity page per tenant for attempts,
and the warm pools with the size and window suggested from the course's enrolment and the lab's dates."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import formats, timezone
from django.utils.timesince import timesince
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from labs.models import Attempt, TenantNamespace
from labs.pool_models import LabPool
from labs.pool_selectors import pool_suggestion
from labs.selectors import tenant_capacity, tenants_for_capacity_view
from labs.services import attempt_extend, attempt_stop
from labs.services.namespaces import is_refusal_record
from portal.admin_scoping import AuditedAdminMixin, CourseScopedAdminMixin
from portal.errors import ApplicationError
from portal.forms import LabelledSplitDateTime
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
            self.message_user(
                request, done_message % {"count": done, "minutes": settings.ATTEMPT_EXTEND_MINUTES}, messages.SUCCESS
            )
        for refusal in refusals:
            self.message_user(request, refusal, messages.WARNING)

    @admin.action(
        description=gettext_lazy("Stop the selected attempts (grade once more, then delete the VM)"),
        permissions=["lifecycle"],
    )
    def stop_attempts(self, request: HttpRequest, queryset: QuerySet[Attempt]) -> None:
        self._apply(request, queryset, attempt_stop, _("Attempts being stopped: %(count)d."))

    @admin.action(description=gettext_lazy("Extend the time limit of the selected attempts"), permissions=["lifecycle"])
    def extend_attempts(self, request: HttpRequest, queryset: QuerySet[Attempt]) -> None:
        self._apply(request, queryset, attempt_extend, _("Attempts given %(minutes)d more minutes: %(count)d."))

    def get_urls(self):
        return [
            path(
                "capacity/",
                self.admin_site.admin_view(self.capacity_view),
                name="labs_attempt_capacity",
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
            "opts": self.opts,
            "rows": rows,
        }
        return TemplateResponse(request, "admin/labs/attempt/capacity.html", context)


@admin.register(LabPool)
class LabPoolAdmin(CourseScopedAdminMixin, AuditedAdminMixin, admin.ModelAdmin):
    course_lookup = "lab__course"
    list_display = ("lab", "mode", "size", "starts_at", "ends_at", "misses")
    list_select_related = ("lab__course",)
    fields = ("lab", "suggested", "mode", "size", ("starts_at", "ends_at"), "misses")
    readonly_fields = ("suggested", "misses")
    formfield_overrides = {models.DateTimeField: {"widget": LabelledSplitDateTime}}

    @admin.display(description=gettext_lazy("suggested"))
    def suggested(self, pool: LabPool | None) -> str:
        if pool is None or not pool.pk:
            return _("Save the pool with its lab first; the suggestion follows from the course and the lab's dates.")
        suggestion = pool_suggestion(lab=pool.lab)
        text = _(
            "%(enrolled)d students enrolled, quota %(quota)d VMs: always warm %(always)d, or scheduled %(size)d"
        ) % {
            "enrolled": suggestion.enrolled,
            "quota": suggestion.quota,
            "always": suggestion.always_size,
            "size": suggestion.scheduled_size,
        }
        if suggestion.starts_at and suggestion.ends_at:
            text += _(" from %(start)s until %(end)s") % {
                "start": formats.date_format(timezone.localtime(suggestion.starts_at), "DATETIME_FORMAT"),
                "end": formats.date_format(timezone.localtime(suggestion.ends_at), "DATETIME_FORMAT"),
            }
        return text + "."
