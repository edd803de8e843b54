"""Student pages: an attempt and its actions; console recordings for course staff. The lab page and the Check
action, which show grading, are grading's (``grading.urls.lab_page_urlpatterns``), in this namespace."""

from django.urls import path

from labs.views.actions import AttemptExtendView, AttemptStartView, AttemptStopView
from labs.views.pages import AttemptDetailView
from labs.views.recordings import RecordingFileView, RecordingReplayView

app_name = "labs"

urlpatterns = [
    path("labs/<id:lab_id>/start/", AttemptStartView.as_view(), name="attempt_start"),
    path("attempts/<id:attempt_id>/", AttemptDetailView.as_view(), name="attempt_detail"),
    path("attempts/<id:attempt_id>/stop/", AttemptStopView.as_view(), name="attempt_stop"),
    path("attempts/<id:attempt_id>/extend/", AttemptExtendView.as_view(), name="attempt_extend"),
    path("attempts/<id:attempt_id>/recording/", RecordingReplayView.as_view(), name="attempt_recording"),
    path("attempts/<id:attempt_id>/recording.cast", RecordingFileView.as_view(), name="attempt_recording_file"),
]
