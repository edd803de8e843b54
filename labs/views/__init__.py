"""Student pages and the attempt's actions, and the console recordings' replay for course staff."""

from labs.views.actions import AttemptExtendView, AttemptStartView, AttemptStopView
from labs.views.pages import AttemptDetailView, LabDetailView
from labs.views.recordings import RecordingFileView, RecordingReplayView

__all__ = [
    "AttemptDetailView",
    "AttemptExtendView",
    "AttemptStartView",
    "AttemptStopView",
    "LabDetailView",
    "RecordingFileView",
    "RecordingReplayView",
]
