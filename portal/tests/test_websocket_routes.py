"""WebSocket paths the portal does not serve are refused at the handshake, quietly."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator

from portal.asgi import application


@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/attempts/x/events/", "/ws/attempts/1/events/extra/", "/"])
async def test_a_websocket_path_the_portal_does_not_serve_is_refused_at_the_handshake(path):
    communicator = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://testserver")])
    connected, _code = await communicator.connect(timeout=10)
    assert not connected
    await communicator.disconnect(timeout=5)  # raises what the application died of: URLRouter's "No route found"
