"""Grading runs and grades: students read their own, course staff read their courses' and may override."""

from __future__ import annotations

from decimal import Decimal

from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.grading_serializers import GradeSerializer, GradingRunDetailSerializer, GradingRunSerializer
from api.selectors import grade_get_for_user, grades_for_user, grading_runs_for_user
from api.serializers import ErrorSerializer, StrictInputSerializer
from api.views.attempts import staff_course_ids
from api.views.common import ID, choice_param, filter_by_ids, ordered, ordering_param
from grading.models import RunState
from grading.selectors import run_get_for_user
from grading.services import grade_override
from portal.errors import PermissionDenied
from portal.http import request_user

RUN_ORDERING = {"id": "id", "created_at": "created_at", "finished_at": "finished_at", "score": "score"}
GRADE_ORDERING = {
    "id": "id",
    "lab": "lab_id",
    "student": "student__username",
    "score": "score",
    "updated_at": "updated_at",
}


@extend_schema_view(
    get=extend_schema(
        parameters=[
            OpenApiParameter("attempt", ID, description="Only runs of this attempt"),
            OpenApiParameter("lab", ID, description="Only runs of attempts of this lab"),
            OpenApiParameter("state", str, enum=RunState.values),
            ordering_param(RUN_ORDERING),
        ],
        summary="Grading runs you may see",
    )
)
class GradingRunListView(ListAPIView):
    serializer_class = GradingRunSerializer

    def get_queryset(self):
        runs = grading_runs_for_user(user=self.request.user)
        runs = filter_by_ids(runs, self.request, {"attempt": "attempt_id", "lab": "attempt__lab_id"})
        state = choice_param(self.request, "state", RunState.values)
        if state is not None:
            runs = runs.filter(state=state)
        return ordered(runs, self.request, allowed=RUN_ORDERING, default=["-created_at", "-id"])

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "staff_course_ids": staff_course_ids(user=self.request.user)}


class GradingRunDetailView(APIView):
    @extend_schema(
        responses={200: GradingRunDetailSerializer, 404: ErrorSerializer},
        summary="A grading run with its per-check results",
    )
    def get(self, request: Request, run_id: int) -> Response:
        user = request_user(request)
        run = run_get_for_user(user=user, run_id=run_id)
        context = {"staff_course_ids": staff_course_ids(user=user)}
        return Response(GradingRunDetailSerializer(run, context=context).data)


@extend_schema_view(
    get=extend_schema(
        parameters=[
            OpenApiParameter("lab", ID, description="Only grades of this lab"),
            OpenApiParameter("course", ID, description="Only grades in this course"),
            OpenApiParameter("student", ID, description="Only grades of this student (staff)"),
            ordering_param(GRADE_ORDERING),
        ],
        summary="Grades you may see",
    )
)
class GradeListView(ListAPIView):
    serializer_class = GradeSerializer

    def get_queryset(self):
        grades = grades_for_user(user=self.request.user)
        grades = filter_by_ids(
            grades, self.request, {"lab": "lab_id", "course": "lab__course_id", "student": "student_id"}
        )
        return ordered(grades, self.request, allowed=GRADE_ORDERING, default=["lab_id", "student__username", "id"])


class GradeDetailView(APIView):
    @extend_schema(responses={200: GradeSerializer, 404: ErrorSerializer}, summary="A grade")
    def get(self, request: Request, grade_id: int) -> Response:
        user = request_user(request)
        return Response(GradeSerializer(grade_get_for_user(user=user, grade_id=grade_id)).data)


class GradeOverrideSerializer(StrictInputSerializer):
    score = serializers.DecimalField(
        max_digits=8,
        decimal_places=2,
        allow_null=True,
        min_value=Decimal("0"),
        help_text="The score that counts instead of the computed one; null removes the override.",
    )
    reason = serializers.CharField(max_length=2000, help_text="Why; shown in the course's audit log.")


class GradeOverrideView(APIView):
    @extend_schema(
        request=GradeOverrideSerializer,
        responses={200: GradeSerializer, 400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer},
        summary="Override a grade, or remove the override (course staff)",
    )
    def post(self, request: Request, grade_id: int) -> Response:
        serializer = GradeOverrideSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = request_user(request)
        grade = grade_get_for_user(user=user, grade_id=grade_id)
        if grade.lab.course_id not in staff_course_ids(user=user):
            raise PermissionDenied(_("Only the course's staff may override grades."))
        grade = grade_override(
            actor=user,
            lab=grade.lab,
            student=grade.student,
            score=serializer.validated_data["score"],
            reason=serializer.validated_data["reason"],
        )
        return Response(GradeSerializer(grade).data)
