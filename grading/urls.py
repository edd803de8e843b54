"""URLs of the grading pages, mounted under ``/grades/`` (namespace ``grading``)."""

from django.urls import path

from grading import views

app_name = "grading"

urlpatterns = [
    path("", views.StaffIndexView.as_view(), name="index"),
    path("mine/", views.MyGradesView.as_view(), name="my_grades"),
    path("mine/labs/<id:lab_id>/", views.MyLabRunsView.as_view(), name="my_lab"),
    path("courses/<id:course_id>/", views.GradebookView.as_view(), name="gradebook"),
    path("courses/<id:course_id>/export.csv", views.GradebookExportView.as_view(), name="gradebook_export"),
    path("labs/<id:lab_id>/", views.LabReportView.as_view(), name="lab_report"),
    path("labs/<id:lab_id>/regrade/", views.LabRegradeView.as_view(), name="lab_regrade"),
    # One student's grade for one lab, with their attempts and the override form; ``grade_override`` is the same
    # page at its older address.
    path("labs/<id:lab_id>/students/<id:student_id>/", views.StudentLabGradeView.as_view(), name="student_lab"),
    path(
        "labs/<id:lab_id>/students/<id:student_id>/override/",
        views.StudentLabGradeView.as_view(),
        name="grade_override",
    ),
    path("attempts/<id:attempt_id>/", views.AttemptDetailView.as_view(), name="attempt_detail"),
    path("attempts/<id:attempt_id>/regrade/", views.AttemptRegradeView.as_view(), name="attempt_regrade"),
]

# Labs' pages that show grading: routed in the ``labs`` namespace at labs' addresses (see ``ops.urls``).
lab_page_urlpatterns = [
    path("labs/<id:lab_id>/", views.LabPageView.as_view(), name="lab_detail"),
    path("attempts/<id:attempt_id>/check/", views.AttemptCheckView.as_view(), name="attempt_check"),
]
