"""Warm pools in the admin: one per lab, with the size and window suggested from the course's enrolment and the
lab's dates, and the pool's figures."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db import models
from django.utils import formats, timezone
from django.utils.translation import gettext_lazy as _

from labs.pool_models import LabPool
from labs.pool_selectors import pool_suggestion
from portal.admin_scoping import AuditedAdminMixin, CourseScopedAdminMixin
from portal.forms import LabelledSplitDateTime


@admin.register(LabPool)
class LabPoolAdmin(CourseScopedAdminMixin, AuditedAdminMixin, admin.ModelAdmin):
    course_lookup = "lab__course"
    list_display = ("lab", "mode", "size", "starts_at", "ends_at", "misses")
    list_select_related = ("lab__course",)
    fields = ("lab", "suggested", "mode", "size", ("starts_at", "ends_at"), "misses")
    readonly_fields = ("suggested", "misses")
    formfield_overrides = {
        models.DateTimeField: {"form_class": forms.SplitDateTimeField, "widget": LabelledSplitDateTime}
    }

    @admin.display(description=_("suggested"))
    def suggested(self, pool: LabPool | None) -> str:
        lab = pool.lab if pool is not None and pool.pk else None
        if lab is None:
            return str(
                _("Save the pool with its lab first; the suggestion follows from the course and the lab's dates.")
            )
        suggestion = pool_suggestion(lab=lab)
        text = _(
            "%(enrolled)d students enrolled, quota %(quota)d VMs: always warm %(always)d, or scheduled %(size)d"
        ) % {
            "enrolled": suggestion.enrolled,
            "quota": suggestion.quota,
            "always": suggestion.always_size,
            "size": suggestion.scheduled_size,
        }
        if suggestion.starts_at and suggestion.ends_at:
            text += str(_(" from %(start)s until %(end)s")) % {
                "start": formats.date_format(timezone.localtime(suggestion.starts_at), "DATETIME_FORMAT"),
                "end": formats.date_format(timezone.localtime(suggestion.ends_at), "DATETIME_FORMAT"),
            }
        return text + "."

    def audit_scope(self, obj: models.Model) -> dict:
        assert isinstance(obj, LabPool)
        return {"tenant": obj.lab.course.tenant, "course": obj.lab.course}
