"""Student pages: an attempt and its actions; console recordings for course staff. The lab page and the Check
action, which show grading, are grading's (``grading.urls.lab_page_urlpatterns``), in this namespace."""

from django.urls import path

from labs import views

app_name = "labs"

urlpatterns = [
    path("labs/<id:lab_id>/start/", views.AttemptStartView.as_view(), name="attempt_start"),
    path("attempts/<id:attempt_id>/", views.AttemptDetailView.as_view(), name="attempt_detail"),
    path("attempts/<id:attempt_id>/stop/", views.AttemptStopView.as_view(), name="attempt_stop"),
    path("attempts/<id:attempt_id>/extend/", views.AttemptExtendView.as_view(), name="attempt_extend"),
    path("attempts/<id:attempt_id>/recording/", views.RecordingReplayView.as_view(), name="attempt_recording"),
    path(
        "attempts/<id:attempt_id>/recording.cast",
        views.RecordingFileView.as_view(),
        name="attempt_recording_file",
    ),
]
