"""WebSocket routes of the portal: attempt events and the console bridge."""

from django.urls import path

from labs.consumers import AttemptConsoleConsumer, AttemptEventsConsumer

websocket_urlpatterns = [
    path("ws/attempts/<id:attempt_id>/events/", AttemptEventsConsumer.as_asgi()),
    path("ws/attempts/<id:attempt_id>/console/", AttemptConsoleConsumer.as_asgi()),
]
