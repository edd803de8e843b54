"""Admin widgets that name each of their inputs for screen readers."""

from __future__ import annotations

from django.contrib.admin.widgets import AdminSplitDateTime
from django.utils.translation import gettext_lazy as _


class LabelledSplitDateTime(AdminSplitDateTime):
    """Django's date and time pair, each input with its own accessible name (the field's label names neither)."""

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        for subwidget, label in zip(context["widget"]["subwidgets"], (_("Date"), _("Time")), strict=True):
            subwidget["attrs"]["aria-label"] = str(label)
        return context
