"""URLs of the REST API, mounted at ``/api/``: version 1 under ``v1/``, the OpenAPI schema and its docs page."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from api.views import account, attempts, courses, grading, labs

app_name = "api"

v1 = [
    path("me/", account.MeView.as_view(), name="me"),
    path("auth/token/", account.TokenObtainView.as_view(), name="token-obtain"),
    path("me/token/", account.TokenRevokeView.as_view(), name="token-revoke"),
    path("courses/", courses.CourseListView.as_view(), name="course-list"),
    path("courses/<id:course_id>/", courses.CourseDetailView.as_view(), name="course-detail"),
    path("courses/<id:course_id>/report/", courses.CourseReportView.as_view(), name="course-report"),
    path("courses/<id:course_id>/report.csv", courses.CourseReportCsvView.as_view(), name="course-report-csv"),
    path("courses/<id:course_id>/audit/", courses.CourseAuditView.as_view(), name="course-audit"),
    path("labs/", labs.LabListView.as_view(), name="lab-list"),
    path("labs/<id:lab_id>/", labs.LabDetailView.as_view(), name="lab-detail"),
    path("labs/<id:lab_id>/report/", labs.LabReportView.as_view(), name="lab-report"),
    path("attempts/", attempts.AttemptListView.as_view(), name="attempt-list"),
    path("attempts/<id:attempt_id>/", attempts.AttemptDetailView.as_view(), name="attempt-detail"),
    path("attempts/<id:attempt_id>/stop/", attempts.AttemptStopView.as_view(), name="attempt-stop"),
    path("attempts/<id:attempt_id>/extend/", attempts.AttemptExtendView.as_view(), name="attempt-extend"),
    path("attempts/<id:attempt_id>/check/", attempts.AttemptCheckView.as_view(), name="attempt-check"),
    path("grading-runs/", grading.GradingRunListView.as_view(), name="grading-run-list"),
    path("grading-runs/<id:run_id>/", grading.GradingRunDetailView.as_view(), name="grading-run-detail"),
    path("grades/", grading.GradeListView.as_view(), name="grade-list"),
    path("grades/<id:grade_id>/", grading.GradeDetailView.as_view(), name="grade-detail"),
    path("grades/<id:grade_id>/override/", grading.GradeOverrideView.as_view(), name="grade-override"),
]

urlpatterns = [
    path("v1/", include(v1)),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
]
