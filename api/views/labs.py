"""Labs of the user's courses. Staff also see how each check is graded; students see only titles and points."""

from __future__ import annotations

from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema, extend_schema_view
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.grading_serializers import LabReportSerializer
from api.serializers import ErrorSerializer, LabSerializer, StaffLabDetailSerializer, StudentLabDetailSerializer
from api.views.common import ID, filter_by_ids, ordered, ordering_param
from grading.selectors import lab_report
from labs.access import lab_get_for_user, labs_visible_to
from portal.errors import PermissionDenied
from portal.http import request_user
from portal.models import STAFF_ROLES
from portal.selectors import course_role

LAB_ORDERING = {"id": "id", "title": "title", "due_at": "due_at", "opens_at": "opens_at", "course": "course_id"}


@extend_schema_view(
    get=extend_schema(
        parameters=[
            OpenApiParameter("course", ID, description="Only labs of this course"),
            ordering_param(LAB_ORDERING),
        ],
        summary="Labs of your courses",
    )
)
class LabListView(ListAPIView):
    serializer_class = LabSerializer

    def get_queryset(self):
        labs = filter_by_ids(labs_visible_to(user=self.request.user), self.request, {"course": "course_id"})
        return ordered(labs, self.request, allowed=LAB_ORDERING, default=["course_id", "due_at", "title", "id"])


class LabDetailView(APIView):
    @extend_schema(
        responses={
            200: PolymorphicProxySerializer(
                component_name="LabDetail",
                serializers=[StudentLabDetailSerializer, StaffLabDetailSerializer],
                resource_type_field_name=None,
            ),
            404: ErrorSerializer,
        },
        summary="A lab, with its checks (staff see how each check is graded)",
    )
    def get(self, request: Request, lab_id: int) -> Response:
        user = request_user(request)
        lab = lab_get_for_user(user=user, lab_id=lab_id)
        staff = course_role(user=user, course=lab.course) in STAFF_ROLES
        serializer_class = StaffLabDetailSerializer if staff else StudentLabDetailSerializer
        return Response(serializer_class(lab).data)


class LabReportView(APIView):
    @extend_schema(
        responses={200: LabReportSerializer, 403: ErrorSerializer, 404: ErrorSerializer},
        summary="Score summary of a lab (course staff)",
    )
    def get(self, request: Request, lab_id: int) -> Response:
        user = request_user(request)
        lab = lab_get_for_user(user=user, lab_id=lab_id)
        if course_role(user=user, course=lab.course) not in STAFF_ROLES:
            raise PermissionDenied(_("Only the course's staff may see this."))
        return Response(LabReportSerializer(lab_report(lab=lab)).data)
