"""Forms of the core domain: the admin's course, membership and user forms, the enrollment CSV upload, and a
date-and-time widget that names each of its inputs for screen readers."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib.admin.widgets import AdminSplitDateTime
from django.contrib.auth.forms import AdminUserCreationForm, SetUnusablePasswordMixin, UserChangeForm
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from portal.models import Course, Membership, Tenant, User
from portal.timezones import tenant_time_zone, time_zone_names


def zone_choice_field(form: forms.ModelForm, *, blank_label: str | Promise | None = None) -> None:
    """Make ``form``'s ``time_zone`` a choice among the known zones (and the stored one, even if tzdata dropped it)."""
    field = form.fields["time_zone"]
    current = form.instance.time_zone
    blank = blank_label or _("The portal's default (%(zone)s)") % {"zone": settings.TIME_ZONE}
    choices: list[tuple[str, str | Promise]] = [("", blank), *((name, name) for name in time_zone_names())]
    if current and current not in dict(choices):
        choices.append((current, current))
    form.fields["time_zone"] = forms.ChoiceField(
        choices=choices, required=False, label=field.label, help_text=field.help_text, validators=field.validators
    )


class TenantAdminForm(forms.ModelForm):
    """The tenant's time zone from a list of the zones this installation knows, rather than typed."""

    class Meta:
        model = Tenant
        fields = ["name", "max_concurrent_vms", "max_vms_per_student", "max_vcpus", "max_memory_mib", "time_zone"]
        # Beside the per-student limit, where 0 means none, this 0 means the opposite.
        help_texts = {"max_concurrent_vms": _("Lab VMs held at once, warm-pool VMs included. 0: no lab can start.")}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        zone_choice_field(self)


class PersonalTimeZoneForm(forms.ModelForm):
    """A person's own clock, chosen on their time zone page."""

    class Meta:
        model = User
        fields = ["time_zone"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        institution_zone = _("My institution's (%(zone)s)") % {"zone": tenant_time_zone(self.instance.tenant)}
        zone_choice_field(self, blank_label=institution_zone)
        # The page says what the choice does; the model's help text is written for admins.
        self.fields["time_zone"].label = _("Your time zone")
        self.fields["time_zone"].help_text = ""


class CourseAdminForm(forms.ModelForm):
    """A course. For instructors the tenant is not a field: the admin sets ``tenant`` (their own) on the class."""

    # Set by the admin on the form class it builds per request (modelform_factory makes a new class each time).
    tenant: Tenant | None = None

    class Meta:
        model = Course
        fields = ("tenant", "code", "title", "term")

    def clean(self):
        cleaned = super().clean()
        # Django skips the (tenant, code, term) constraint when tenant is not a form field (an IntegrityError later).
        if "tenant" not in self.fields:
            tenant = self.instance.tenant if self.instance.tenant_id else self.tenant
            duplicate = Course.objects.filter(
                tenant=tenant, code=cleaned.get("code"), term=cleaned.get("term", "")
            ).exclude(pk=self.instance.pk)
            if tenant is not None and duplicate.exists():
                raise forms.ValidationError(
                    _("Your institution already has a course with this code in this term."), code="duplicate"
                )
        return cleaned


class MembershipAdminForm(forms.ModelForm):
    class Meta:
        model = Membership
        fields = ("user", "course", "role")

    def clean(self):
        cleaned = super().clean()
        user, course = cleaned.get("user"), cleaned.get("course")
        if user is not None and course is not None and user.tenant_id != course.tenant_id:
            raise forms.ValidationError(
                _("%(user)s belongs to another institution than the course.") % {"user": user}, code="tenant"
            )
        return cleaned


class TenantUserCreationForm(AdminUserCreationForm):
    """A new account. Instructors do not see the tenant field: the account joins their own tenant."""

    usable_password = SetUnusablePasswordMixin.create_usable_password_field(
        help_text=_(
            "Disabled: the person chooses their own password from a set-password link; select them in the "
            "user list and use the action “Issue set-password links”."
        )
    )

    class Meta(AdminUserCreationForm.Meta):
        model = User
        fields = ("username", "email", "full_name", "tenant")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["email"].required = True


class TenantUserChangeForm(UserChangeForm):
    class Meta(UserChangeForm.Meta):
        model = User
        fields = "__all__"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if "time_zone" in self.fields:
            zone_choice_field(self, blank_label=_("The institution's (the tenant's time zone)"))


class EnrollmentImportForm(forms.Form):
    csv_file = forms.FileField(
        label=_("CSV file"), help_text=_("UTF-8 (Excel: “CSV UTF-8”), first line username,email,name,role.")
    )


class LabelledSplitDateTime(AdminSplitDateTime):
    """Django's date and time pair, each input with its own accessible name (the field's label names neither)."""

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        for subwidget, label in zip(context["widget"]["subwidgets"], (_("Date"), _("Time")), strict=True):
            subwidget["attrs"]["aria-label"] = str(label)
        return context
