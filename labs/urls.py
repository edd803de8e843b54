"""Student pages: a lab, its attempts and their actions; console recordings for course staff."""

from django.urls import path

from labs import views

app_name = "labs"

urlpatterns = [
    path("labs/<id:lab_id>/", views.LabDetailView.as_view(), name="lab_detail"),
    path("labs/<id:lab_id>/start/", views.AttemptStartView.as_view(), name="attempt_start"),
    path("attempts/<id:attempt_id>/", views.AttemptDetailView.as_view(), name="attempt_detail"),
    path("attempts/<id:attempt_id>/stop/", views.AttemptStopView.as_view(), name="attempt_stop"),
    path("attempts/<id:attempt_id>/extend/", views.AttemptExtendView.as_view(), name="attempt_extend"),
    path("attempts/<id:attempt_id>/check/", views.AttemptCheckView.as_view(), name="attempt_check"),
    path("attempts/<id:attempt_id>/recording/", views.RecordingReplayView.as_view(), name="attempt_recording"),
    path(
        "attempts/<id:attempt_id>/recording.cast",
        views.RecordingFileView.as_view(),
        name="attempt_recording_file",
    ),
]
