"""Forms of the grading pages: the staff override of a grade."""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.core.validators import MaxValueValidator
from django.utils.translation import gettext_lazy as _

from grading.services.grades import MAX_REASON_CHARS


class GradeOverrideForm(forms.Form):
    score = forms.DecimalField(
        label=_("Score"),
        required=False,
        min_value=Decimal(0),
        max_digits=8,
        decimal_places=2,
        help_text=_("The grade the student gets, whatever their runs scored."),
    )
    reason = forms.CharField(
        label=_("Reason"),
        max_length=MAX_REASON_CHARS,
        error_messages={"required": _("Give a reason for the override.")},
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=_("Required. Kept in the audit log with your name."),
    )
    remove = forms.BooleanField(label=_("Remove the override and use the computed grade again"), required=False)

    def __init__(self, *args, max_score: Decimal | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if max_score is not None:
            self.fields["score"].validators.append(MaxValueValidator(max_score))
            self.fields["score"].widget.attrs["max"] = str(max_score)

    def clean(self) -> dict:
        cleaned = super().clean() or {}
        if not cleaned.get("remove") and cleaned.get("score") is None and "score" not in self.errors:
            self.add_error("score", _("Give the score, or choose to remove the override."))
        return cleaned
