"""WebSocket routes of the portal: attempt events and the console bridge."""

websocket_urlpatterns: list = []
