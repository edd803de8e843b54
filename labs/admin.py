"""The instructor admin for labs: labs with their checks inline, and attempts (read-only) with their VM state.
Scoping by course role comes from ``portal.admin_scoping``; stop, extend and capacity from ``labs.admin_lifecycle``."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from labs.admin_lifecycle import AttemptLifecycleAdminMixin
from labs.models import Attempt, Check, Lab, extra_cloud_init_problem
from labs.selectors import PHASE_FIELDS
from portal.admin_scoping import AuditedAdminMixin, CourseScopedAdminMixin, CourseScopedInlineMixin
from portal.forms import LabelledSplitDateTime
from portal.http import request_user
from portal.services import audit_record


class CheckInline(CourseScopedInlineMixin, admin.StackedInline):
    model = Check
    extra = 0
    fields = (
        ("order", "title", "points", "timeout_s"),
        "command",
        ("expected_exit_code", "stdout_match"),
        "stdout_pattern",
        "hint",
    )

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        # Commands and patterns are usually one line; keep the inline compact and monospaced.
        if db_field.name in {"command", "stdout_pattern"}:
            kwargs["widget"] = forms.Textarea(attrs={"rows": 2, "cols": 80, "style": "font-family: monospace"})
        elif db_field.name == "hint":
            kwargs["widget"] = forms.Textarea(attrs={"rows": 2, "cols": 80})
        return super().formfield_for_dbfield(db_field, request, **kwargs)


@admin.register(Lab)
class LabAdmin(CourseScopedAdminMixin, AuditedAdminMixin, admin.ModelAdmin):
    inlines = (CheckInline,)
    list_display = ("title", "course", "size", "time_limit_minutes", "opens_at", "due_at", "check_count")
    formfield_overrides = {models.DateTimeField: {"widget": LabelledSplitDateTime}}
    list_filter = (("course", admin.RelatedOnlyFieldListFilter), "size")
    list_select_related = ("course",)
    search_fields = ("title", "course__code", "course__title")
    fieldsets = (
        (None, {"fields": ("course", "title", "instructions")}),
        (
            _("Virtual machine"),
            {
                "fields": (
                    "image",
                    "size",
                    "nested_virtualization",
                    "extra_cloud_init",
                    "time_limit_minutes",
                    "idle_stop_minutes",
                )
            },
        ),
        (
            _("Dates and grading"),
            {
                "fields": (
                    "opens_at",
                    "due_at",
                    "late_penalty_percent_per_day",
                    "late_cutoff_at",
                    "attempt_limit",
                    "grade_policy",
                )
            },
        ),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lab]:
        return super().get_queryset(request).annotate(num_checks=Count("checks"))

    @admin.display(description=_("checks"), ordering="num_checks")
    def check_count(self, lab: Lab) -> int:
        return lab.num_checks  # type: ignore[attr-defined]  # annotated by get_queryset

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        # A lab saved before its settings were checked at save says what stops it from starting, where it is fixed.
        if obj is not None and request.method == "GET" and (problem := extra_cloud_init_problem(obj.extra_cloud_init)):
            messages.error(
                request,
                _("Students cannot start this lab: its extra cloud-init is invalid (%(problem)s).")
                % {"problem": problem},
            )
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    def save_formset(self, request, form, formset, change):
        super().save_formset(request, form, formset, change)
        if formset.has_changed():
            # Check edits change how every later run is scored: record them with the lab.
            lab = form.instance
            audit_record(
                actor=request_user(request),
                action="admin.lab.checks",
                target=lab,
                tenant=lab.course.tenant,
                course=lab.course,
                data={"checks": [str(check) for check in lab.checks.all()]},
            )


@admin.register(Attempt)
class AttemptAdmin(AttemptLifecycleAdminMixin, CourseScopedAdminMixin, admin.ModelAdmin):
    course_lookup = "lab__course"
    read_only = True
    list_display = (
        "id",
        "student",
        "lab",
        "course",
        "number",
        "state",
        "phase",
        "node_name",
        "age",
        "expires_at",
        "short_failure_reason",
        "requested_at",
    )
    list_display_links = ("id", "student")
    list_filter = (
        "state",
        ("lab__course", admin.RelatedOnlyFieldListFilter),
        ("lab", admin.RelatedOnlyFieldListFilter),
    )
    list_select_related = ("student", "lab__course")
    search_fields = ("student__username", "student__full_name", "vm_name")
    # Never the agent token: it is the guest's secret.
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "lab",
                    "student",
                    "tenant",
                    "number",
                    "state",
                    "stop_reason",
                    "failure_reason_shown",
                    "language",
                )
            },
        ),
        (
            _("Virtual machine"),
            {
                "fields": (
                    "vm_name",
                    "namespace",
                    "phase",
                    "node_name",
                    "vcpus",
                    "memory_mib",
                    "launcher_cpu_millicores",
                    "launcher_memory_mib",
                )
            },
        ),
        (
            _("Timeline"),
            {"fields": (*PHASE_FIELDS, "expires_at", "extensions", "updated_at")},
        ),
    )

    @admin.display(description=_("course"), ordering="lab__course__code")
    def course(self, attempt: Attempt):
        return attempt.lab.course

    @admin.display(description=_("failure reason"))
    def failure_reason_shown(self, attempt: Attempt) -> str:
        return attempt.failure_reason_shown

    @admin.display(description=_("failure reason"))
    def short_failure_reason(self, attempt: Attempt) -> str:
        return Truncator(attempt.failure_reason_shown).chars(80)
