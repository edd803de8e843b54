"""Console recordings for course staff: a replay page and the asciicast v2 file it plays."""

from __future__ import annotations

from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from labs.access import attempt_get_for_staff
from labs.console.recording import ASCIICAST_CONTENT_TYPE, recording_path
from portal.http import AuthenticatedRequest
from portal.views import PageView


class RecordingReplayView(PageView):
    def get(self, request: AuthenticatedRequest, attempt_id: int) -> HttpResponse:
        attempt = attempt_get_for_staff(user=request.user, attempt_id=attempt_id)
        path = recording_path(attempt_id=attempt.id)
        context = {
            "attempt": attempt,
            "lab": attempt.lab,
            "has_recording": path.exists(),
            "replay_config": {"cast_url": reverse("labs:attempt_recording_file", args=[attempt.id])},
        }
        return render(request, "labs/recording.html", context)


class RecordingFileView(PageView):
    def get(self, request: AuthenticatedRequest, attempt_id: int) -> FileResponse:
        attempt = attempt_get_for_staff(user=request.user, attempt_id=attempt_id)
        path = recording_path(attempt_id=attempt.id)
        if not path.exists():
            raise Http404("No recording for this attempt.")
        response = FileResponse(path.open("rb"), as_attachment=True, content_type=ASCIICAST_CONTENT_TYPE)
        response["Cache-Control"] = "private, no-store"
        return response
