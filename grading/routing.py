"""grading's WebSocket routes: the staff's live class view of a lab."""

from django.urls import path

from grading.class_view_consumer import LabClassConsumer

# Channels routes Django's path() to ASGI applications; the stubs type the target as a view.
websocket_urlpatterns = [
    path("ws/labs/<id:lab_id>/class/", LabClassConsumer.as_asgi()),  # type: ignore[arg-type]
]
