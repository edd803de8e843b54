"""Read-only admin views of grading (runs with their results, grades), scoped by course role: grades are overridden
and runs requested through the grading services, never by editing rows."""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from grading.models import CheckResult, Grade, GradingRun
from portal.admin_scoping import CourseScopedAdminMixin, CourseScopedInlineMixin


class CheckResultInline(CourseScopedInlineMixin, admin.TabularInline):
    model = CheckResult
    read_only = True
    extra = 0
    fields = ("order", "check_title", "passed", "points", "max_points", "exit_code", "timed_out", "duration_ms")
    show_change_link = True


@admin.register(GradingRun)
class GradingRunAdmin(CourseScopedAdminMixin, admin.ModelAdmin):
    course_lookup = "attempt__lab__course"
    read_only = True
    inlines = (CheckResultInline,)
    list_display = (
        "id",
        "attempt",
        "state",
        "trigger",
        "score",
        "max_score",
        "late_penalty_percent",
        "created_at",
        "finished_at",
    )
    list_filter = (
        "state",
        "trigger",
        ("attempt__lab__course", admin.RelatedOnlyFieldListFilter),
        ("attempt__lab", admin.RelatedOnlyFieldListFilter),
    )
    list_select_related = ("attempt__lab", "attempt__student")
    search_fields = ("attempt__student__username", "attempt__student__full_name", "attempt__lab__title")
    fields = (
        "attempt",
        "state",
        "trigger",
        "requested_by",
        "regrade_of",
        "created_at",
        "started_at",
        "finished_at",
        "score",
        "max_score",
        "late_penalty_percent",
        "error",
    )


@admin.register(CheckResult)
class CheckResultAdmin(CourseScopedAdminMixin, admin.ModelAdmin):
    course_lookup = "run__attempt__lab__course"
    read_only = True
    list_display = ("id", "run", "check_title", "passed", "points", "max_points", "exit_code", "duration_ms")
    list_filter = ("passed", ("run__attempt__lab__course", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("run__attempt__lab", "run__attempt__student")
    search_fields = ("check_title", "run__attempt__student__username")


@admin.register(Grade)
class GradeAdmin(CourseScopedAdminMixin, admin.ModelAdmin):
    course_lookup = "lab__course"
    read_only = True
    list_display = ("student", "lab", "score", "max_score", "late", "override_score", "final", "updated_at")
    list_filter = ("late", ("lab__course", admin.RelatedOnlyFieldListFilter), ("lab", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("student", "lab")
    search_fields = ("student__username", "student__full_name", "lab__title")
    fields = (
        "lab",
        "student",
        "source_run",
        "score",
        "max_score",
        "late",
        "override_score",
        "override_reason",
        "overridden_by",
        "overridden_at",
        "updated_at",
    )

    @admin.display(description=_("final score"))
    def final(self, grade: Grade):
        return grade.final_score
