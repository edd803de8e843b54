"""Grading's part of labs' pages: the Check button and the staff's lab page with its class view, routed at labs'
addresses and names (``grading.urls.lab_page_urlpatterns``)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views import View

from grading.selectors import grading_run_payload
from grading.selectors.class_view import class_view
from grading.services import grading_run_request
from labs.access import attempt_get_for_user, lab_get_for_staff
from labs.views.actions import lab_url, refusal
from labs.views.instructions import render_instructions
from labs.views.pages import LabDetailView
from portal.errors import ApplicationError, NotFound
from portal.http import AuthenticatedRequest
from portal.server_errors import wants_json


class LabPageView(LabDetailView):
    """The lab page; course staff get the instructions and the class view of the attempts they may watch."""

    def _staff_page(self, request: AuthenticatedRequest, lab_id: int) -> HttpResponse:
        try:
            lab = lab_get_for_staff(user=request.user, lab_id=lab_id)
        except NotFound as exc:
            raise Http404(exc.message) from exc
        rows = class_view(lab=lab)
        if request.GET.get("part") == "class":  # the table alone (the page's socket pushes the same rendering)
            return render(request, "labs/_class_view.html", {"lab": lab, "rows": rows})
        context = {"lab": lab, "instructions": render_instructions(lab.instructions, title=lab.title), "rows": rows}
        return render(request, "labs/lab_staff.html", context)


class AttemptCheckView(LoginRequiredMixin, View):
    """The Check button: queue a grading run; results arrive on the attempt's events socket."""

    def post(self, request: AuthenticatedRequest, attempt_id: int) -> HttpResponse:
        fallback = reverse("dashboard")
        try:
            attempt = attempt_get_for_user(user=request.user, attempt_id=attempt_id)
            fallback = lab_url(attempt)
            run = grading_run_request(actor=request.user, attempt=attempt)
        except ApplicationError as error:
            return refusal(request, error, fallback_url=fallback)
        if wants_json(request):
            return JsonResponse({"run": grading_run_payload(run)}, status=202)
        messages.success(request, _("Checking your work; the results appear on this page."))
        return redirect(fallback)
