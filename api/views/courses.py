"""Courses the user belongs to, and the staff views of a course: the gradebook report (JSON and CSV) and the
instructors' audit log."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.grading_serializers import CourseReportSerializer
from api.selectors import staff_course_get_for_user
from api.serializers import AuditEventSerializer, CourseSerializer, ErrorSerializer
from api.views.common import ID, filter_by_ids, ordered, ordering_param
from grading.selectors import course_gradebook, gradebook_csv_rows
from portal.http import request_user
from portal.models import Membership, Role, User
from portal.selectors import audit_events_for_course, course_get_for_user, courses_for_user

COURSE_ORDERING = {"id": "id", "code": "code", "title": "title", "term": "term"}


def roles_by_course(*, user: User) -> dict[int, str]:
    """The user's role per course id, in one query. Superusers act as instructors everywhere (as
    ``portal.selectors.course_role`` says), so for them every course of the query maps to instructor."""
    if user.is_superuser:
        return dict.fromkeys(courses_for_user(user=user).values_list("id", flat=True), Role.INSTRUCTOR)
    if user.tenant_id is None:
        return {}
    return dict(Membership.objects.filter(user=user, course__tenant_id=user.tenant_id).values_list("course_id", "role"))


@extend_schema_view(
    get=extend_schema(
        parameters=[ordering_param(COURSE_ORDERING)],
        summary="Courses you belong to",
    )
)
class CourseListView(ListAPIView):
    serializer_class = CourseSerializer

    def get_queryset(self):
        return ordered(
            courses_for_user(user=self.request.user),
            self.request,
            allowed=COURSE_ORDERING,
            default=["code", "term", "id"],
        )

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "roles": roles_by_course(user=self.request.user)}


class CourseDetailView(APIView):
    @extend_schema(responses={200: CourseSerializer, 404: ErrorSerializer}, summary="One of your courses")
    def get(self, request: Request, course_id: int) -> Response:
        user = request_user(request)
        course = course_get_for_user(user=user, course_id=course_id)
        context = {"roles": roles_by_course(user=user)}
        return Response(CourseSerializer(course, context=context).data)


class CourseReportView(APIView):
    @extend_schema(
        responses={200: CourseReportSerializer, 403: ErrorSerializer, 404: ErrorSerializer},
        summary="Gradebook of a course (staff)",
    )
    def get(self, request: Request, course_id: int) -> Response:
        user = request_user(request)
        course = staff_course_get_for_user(user=user, course_id=course_id)
        book = course_gradebook(course=course)
        rows = [
            {
                "student": row.student,
                "cells": [{"lab": lab.id, **asdict(cell)} for lab, cell in zip(book.labs, row.cells, strict=True)],
                "total": row.total,
            }
            for row in book.rows
        ]
        payload = {"course": book.course, "labs": book.labs, "rows": rows, "max_total": book.max_total}
        return Response(CourseReportSerializer(payload, context={"roles": roles_by_course(user=user)}).data)


class CourseReportCsvView(APIView):
    @extend_schema(
        responses={
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="One row per student"),
            403: ErrorSerializer,
            404: ErrorSerializer,
        },
        summary="Gradebook of a course as CSV (staff)",
    )
    def get(self, request: Request, course_id: int) -> HttpResponse:
        user = request_user(request)
        course = staff_course_get_for_user(user=user, course_id=course_id)
        buffer = io.StringIO()
        csv.writer(buffer).writerows(gradebook_csv_rows(course=course))
        response = HttpResponse(buffer.getvalue(), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="gradebook-course-{course.id}.csv"'
        return response


@extend_schema_view(
    get=extend_schema(
        parameters=[
            OpenApiParameter("action", str, description="Only events with this action, e.g. attempt.started"),
            OpenApiParameter("actor", ID, description="Only events by this user id"),
        ],
        responses={200: AuditEventSerializer(many=True), 403: ErrorSerializer, 404: ErrorSerializer},
        summary="Audit log of a course (instructors)",
    )
)
class CourseAuditView(ListAPIView):
    """Who started, stopped, extended, checked or overrode what in the course, newest first (instructors)."""

    serializer_class = AuditEventSerializer

    def get_queryset(self):
        events = audit_events_for_course(user=self.request.user, course_id=self.kwargs["course_id"])
        action = self.request.query_params.get("action")
        if action:
            events = events.filter(action=action[:80])
        return filter_by_ids(events, self.request, {"actor": "actor_id"})
