"""Attempts: list, start, detail, and the stop, extend and check actions. Each resolves the attempt through a scoped
selector first (404 for what the user may not see), then the service decides what the user may do."""

from __future__ import annotations

from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.grading_serializers import GradingRunDetailSerializer
from api.serializers import AttemptSerializer, AttemptStartSerializer, EmptyInputSerializer, ErrorSerializer
from api.views.common import ID, choice_param, filter_by_ids, ordered, ordering_param
from grading import services as grading_services
from labs import services as lab_services
from labs.access import attempt_get_for_user, attempts_visible_to, lab_get_for_user
from labs.models import AttemptState
from portal.http import request_user
from portal.models import User
from portal.ratelimit import rate_limit_hit
from portal.selectors import staff_courses_for_user

ATTEMPT_ORDERING = {
    "id": "id",
    "requested_at": "requested_at",
    "state": "state",
    "lab": "lab_id",
    "expires_at": "expires_at",
}
REFUSALS = dict.fromkeys((400, 403, 404, 409, 429, 503), ErrorSerializer)


def staff_course_ids(*, user: User) -> set[int]:
    return set(staff_courses_for_user(user=user).values_list("id", flat=True))


def attempt_data(attempt, *, user: User) -> dict:
    return AttemptSerializer(attempt, context={"staff_course_ids": staff_course_ids(user=user)}).data


def refuse_body(request: Request) -> None:
    """Actions that take no input refuse every key, so ``{"state": "running"}`` is a 400, not ignored."""
    EmptyInputSerializer(data=request.data).is_valid(raise_exception=True)


@extend_schema_view(
    get=extend_schema(
        parameters=[
            OpenApiParameter("lab", ID, description="Only attempts of this lab"),
            OpenApiParameter("course", ID, description="Only attempts in this course"),
            OpenApiParameter("student", ID, description="Only attempts of this student (staff)"),
            OpenApiParameter("state", str, enum=AttemptState.values),
            ordering_param(ATTEMPT_ORDERING),
        ],
        summary="Attempts you may see",
    )
)
class AttemptListView(ListAPIView):
    """``GET`` lists your attempts (and, for staff, those of your courses); ``POST`` starts one."""

    serializer_class = AttemptSerializer

    def get_queryset(self):
        attempts = attempts_visible_to(user=self.request.user).select_related("lab", "student")
        params = {"lab": "lab_id", "course": "lab__course_id", "student": "student_id"}
        attempts = filter_by_ids(attempts, self.request, params)
        state = choice_param(self.request, "state", AttemptState.values)
        if state is not None:
            attempts = attempts.filter(state=state)
        return ordered(attempts, self.request, allowed=ATTEMPT_ORDERING, default=["-requested_at", "-id"])

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "staff_course_ids": staff_course_ids(user=self.request.user)}

    @extend_schema(
        request=AttemptStartSerializer,
        responses={201: AttemptSerializer, **REFUSALS},
        summary="Start an attempt of a lab",
        description=(
            "Starts are limited per user (429 with Retry-After when exceeded); a refusal for want of room "
            "(503 with Retry-After) started nothing and is not counted."
        ),
    )
    def post(self, request: Request) -> Response:
        serializer = AttemptStartSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = request_user(request)
        lab = lab_get_for_user(user=user, lab_id=serializer.validated_data["lab"])
        attempt = lab_services.attempt_start_limited(actor=user, lab=lab)
        return Response(attempt_data(attempt, user=user), status=status.HTTP_201_CREATED)


class AttemptDetailView(APIView):
    @extend_schema(responses={200: AttemptSerializer, 404: ErrorSerializer}, summary="An attempt")
    def get(self, request: Request, attempt_id: int) -> Response:
        user = request_user(request)
        attempt = attempt_get_for_user(user=user, attempt_id=attempt_id)
        return Response(attempt_data(attempt, user=user))


class AttemptStopView(APIView):
    @extend_schema(request=None, responses={200: AttemptSerializer, **REFUSALS}, summary="Stop an attempt")
    def post(self, request: Request, attempt_id: int) -> Response:
        refuse_body(request)
        user = request_user(request)
        attempt = attempt_get_for_user(user=user, attempt_id=attempt_id)
        attempt = lab_services.attempt_stop(actor=user, attempt=attempt)
        return Response(attempt_data(attempt, user=user))


class AttemptExtendView(APIView):
    @extend_schema(
        request=None, responses={200: AttemptSerializer, **REFUSALS}, summary="Extend an attempt's time limit"
    )
    def post(self, request: Request, attempt_id: int) -> Response:
        refuse_body(request)
        user = request_user(request)
        attempt = attempt_get_for_user(user=user, attempt_id=attempt_id)
        attempt = lab_services.attempt_extend(actor=user, attempt=attempt)
        return Response(attempt_data(attempt, user=user))


class AttemptCheckView(APIView):
    @extend_schema(
        request=None,
        responses={202: GradingRunDetailSerializer, **REFUSALS},
        summary="Run the lab's checks against the attempt's VM",
        description="Queues a grading run; follow it at /api/v1/grading-runs/{id}/. Checks are limited per "
        "attempt (429 with Retry-After when exceeded).",
    )
    def post(self, request: Request, attempt_id: int) -> Response:
        refuse_body(request)
        user = request_user(request)
        attempt = attempt_get_for_user(user=user, attempt_id=attempt_id)
        rate_limit_hit(
            scope="attempt_check",
            key=f"attempt:{attempt.pk}",
            message=_("This attempt has been checked too often in a short time. Wait a little and check again."),
        )
        run = grading_services.grading_run_request(actor=user, attempt=attempt)
        context = {"staff_course_ids": staff_course_ids(user=user)}
        return Response(GradingRunDetailSerializer(run, context=context).data, status=status.HTTP_202_ACCEPTED)
