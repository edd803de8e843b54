"""labs' WebSocket routes: attempt events and the console bridge."""

from django.urls import path

from labs.consumers.console import AttemptConsoleConsumer
from labs.consumers.events import AttemptEventsConsumer

# Channels routes Django's path() to ASGI applications; the stubs type the target as a view.
websocket_urlpatterns = [
    path("ws/attempts/<id:attempt_id>/events/", AttemptEventsConsumer.as_asgi()),  # type: ignore[arg-type]
    path("ws/attempts/<id:attempt_id>/console/", AttemptConsoleConsumer.as_asgi()),  # type: ignore[arg-type]
]
