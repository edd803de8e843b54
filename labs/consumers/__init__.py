"""WebSocket consumers: live attempt events and the console bridge."""
