"""The attempt's buttons: Start, Stop and Extend (Check is grading's: ``grading.views``), POST with CSRF. Scripts
get JSON, a plain form a redirect and a message; refusals keep their status code and message either way."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy

from labs.access import attempt_get_for_user, lab_get_for_student, student_role_shown
from labs.models import Attempt
from labs.selectors import attempt_status_payload
from labs.services import attempt_extend, attempt_start_limited, attempt_stop
from labs.views.pages import lab_start_fragments
from portal.errors import ApplicationError
from portal.http import AuthenticatedRequest
from portal.views import PageView, wants_json


def refusal(request: HttpRequest, error: ApplicationError, *, fallback_url: str) -> HttpResponse:
    if wants_json(request):
        response = JsonResponse({"error": error.message, "code": error.code}, status=error.status_code)
        if error.retry_after:
            response["Retry-After"] = str(error.retry_after)
        return response
    messages.error(request, error.message)
    return redirect(fallback_url)


class AttemptStartView(PageView):
    def post(self, request: AuthenticatedRequest, lab_id: int) -> HttpResponse:
        fallback = reverse("labs:lab_detail", args=[lab_id])
        try:
            lab = lab_get_for_student(user=request.user, lab_id=lab_id)
            attempt = attempt_start_limited(
                actor=request.user,
                lab=lab,
                role=student_role_shown(user=request.user),
            )
        except ApplicationError as error:
            return refusal(request, error, fallback_url=fallback)
        if wants_json(request):
            return JsonResponse(
                {"attempt": attempt_status_payload(attempt), **lab_start_fragments(request=request, attempt=attempt)},
                status=201,
            )
        return redirect(fallback)


class AttemptActionView(PageView):
    """Look the attempt up for this user (same 404 for missing and forbidden), run the service, answer."""

    success_message: str | Promise  # after a plain form's press

    def act(self, request: AuthenticatedRequest, attempt: Attempt) -> object:
        raise NotImplementedError

    def json_answer(self, done: Any) -> JsonResponse:
        return JsonResponse({"attempt": attempt_status_payload(done)})

    def post(self, request: AuthenticatedRequest, attempt_id: int) -> HttpResponse:
        fallback = reverse("dashboard")
        try:
            attempt = attempt_get_for_user(user=request.user, attempt_id=attempt_id)
            fallback = reverse("labs:lab_detail", args=[attempt.lab_id])
            done = self.act(request, attempt)
        except ApplicationError as error:
            return refusal(request, error, fallback_url=fallback)
        if wants_json(request):
            return self.json_answer(done)
        messages.success(request, str(self.success_message))
        return redirect(fallback)


class AttemptStopView(AttemptActionView):
    success_message = gettext_lazy("Stopping the lab.")

    def act(self, request: AuthenticatedRequest, attempt: Attempt) -> Attempt:
        return attempt_stop(actor=request.user, attempt=attempt)


class AttemptExtendView(AttemptActionView):
    success_message = gettext_lazy("The time limit was extended.")

    def act(self, request: AuthenticatedRequest, attempt: Attempt) -> Attempt:
        return attempt_extend(actor=request.user, attempt=attempt)
