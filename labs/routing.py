"""WebSocket routes of the portal: attempt events, the console bridge and the staff's class view."""

from django.urls import path

from labs.consumers import AttemptConsoleConsumer, AttemptEventsConsumer
from labs.consumers.class_view import LabClassConsumer

websocket_urlpatterns = [
    path("ws/attempts/<id:attempt_id>/events/", AttemptEventsConsumer.as_asgi()),
    path("ws/attempts/<id:attempt_id>/console/", AttemptConsoleConsumer.as_asgi()),
    path("ws/labs/<id:lab_id>/class/", LabClassConsumer.as_asgi()),
]
