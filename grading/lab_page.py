"""Grading's part of labs' pages: the Check button and the staff's lab page with its class view, routed at labs'
addresses and names (``grading.urls.lab_page_urlpatterns``)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.translation import gettext_lazy

from grading.models import GradingRun
from grading.selectors import grading_run_payload
from grading.selectors.class_view import class_view
from grading.services import grading_run_request
from labs.access import lab_get_for_staff
from labs.models import Attempt
from labs.views.actions import AttemptActionView
from labs.views.instructions import render_instructions
from labs.views.pages import LabDetailView
from portal.http import AuthenticatedRequest


class LabPageView(LabDetailView):
    """The lab page; course staff get the instructions and the class view of the attempts they may watch."""

    def _staff_page(self, request: AuthenticatedRequest, lab_id: int) -> HttpResponse:
        lab = lab_get_for_staff(user=request.user, lab_id=lab_id)
        rows = class_view(lab=lab)
        if request.GET.get("part") == "class":  # the table alone (the page's socket pushes the same rendering)
            return render(request, "labs/_class_view.html", {"lab": lab, "rows": rows})
        context = {"lab": lab, "instructions": render_instructions(lab.instructions, title=lab.title), "rows": rows}
        return render(request, "labs/lab_staff.html", context)


class AttemptCheckView(AttemptActionView):
    """The Check button: queue a grading run; results arrive on the attempt's events socket."""

    success_message = gettext_lazy("Checking your work; the results appear on this page.")

    def act(self, request: AuthenticatedRequest, attempt: Attempt) -> GradingRun:
        return grading_run_request(actor=request.user, attempt=attempt)

    def json_answer(self, done: Any) -> JsonResponse:
        return JsonResponse({"run": grading_run_payload(done)}, status=202)
