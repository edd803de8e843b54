"""The page where a person picks the time zone their pages use."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.generic import UpdateView

from portal.forms import PersonalTimeZoneForm
from portal.http import AuthenticatedRequest
from portal.services import user_time_zone_set
from portal.timezones import tenant_time_zone


class TimeZoneView(LoginRequiredMixin, UpdateView):
    """The signed-in person's own clock, which every page and the admin's typed times follow."""

    request: AuthenticatedRequest

    form_class = PersonalTimeZoneForm
    template_name = "portal/time_zone.html"

    def get_object(self, queryset=None):
        return self.request.user

    def next_url(self) -> str:
        candidate = self.request.POST.get("next") or self.request.GET.get("next") or ""
        if url_has_allowed_host_and_scheme(
            candidate, allowed_hosts={self.request.get_host()}, require_https=self.request.is_secure()
        ):
            return candidate
        return reverse("dashboard")

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["next"] = self.next_url()
        context["institution_zone"] = str(tenant_time_zone(self.request.user.tenant))
        return context

    def form_valid(self, form):
        person = user_time_zone_set(
            actor=self.request.user, user=self.request.user, time_zone=form.cleaned_data["time_zone"]
        )
        zone = person.time_zone or str(tenant_time_zone(person.tenant))
        messages.success(self.request, _("Dates and times are now shown in %(zone)s.") % {"zone": zone})
        return redirect(self.next_url())


def favicon_view(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers ask for /favicon.ico where a page names no icon (a JSON error, a file): send them to the icon."""
    return HttpResponseRedirect(static("img/favicon.svg"))
