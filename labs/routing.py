"""WebSocket routes of the portal: the lab page's socket (Start), attempt events and the console bridge."""

from django.urls import path

from labs.consumers import AttemptConsoleConsumer, AttemptEventsConsumer, LabEventsConsumer

websocket_urlpatterns = [
    path("ws/labs/<id:lab_id>/events/", LabEventsConsumer.as_asgi()),
    path("ws/attempts/<id:attempt_id>/events/", AttemptEventsConsumer.as_asgi()),
    path("ws/attempts/<id:attempt_id>/console/", AttemptConsoleConsumer.as_asgi()),
]
