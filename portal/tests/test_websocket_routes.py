"""What the WebSocket gate refuses (``portal.websocket_gate``): another origin, no origin, a path the portal does not
serve. Each is refused at the handshake, and the refused connection's application ends with it, without an error:
one that waited on the channel layer outlived its connection by seconds, holding a Redis connection."""

from __future__ import annotations

import time

import pytest
from channels.testing import WebsocketCommunicator

from portal.asgi import application

ORIGIN = (b"origin", b"http://testserver")


async def assert_refused(path: str, headers: list[tuple[bytes, bytes]]) -> None:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _code = await communicator.connect(timeout=10)
    assert not connected
    started = time.monotonic()
    await communicator.disconnect(timeout=10)  # raises what the application died of
    # Ends at once; one waiting on the channel layer's pending read took 5-10 s.
    assert time.monotonic() - started < 2, f"{path}: the refused connection's application outlived it"


@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/attempts/x/events/", "/ws/attempts/1/events/extra/", "/"])
async def test_a_path_the_portal_does_not_serve_is_refused(path):
    await assert_refused(path, [ORIGIN])


async def test_sockets_from_another_origin_are_refused_and_end_with_their_connection():
    # First a socket that reaches its consumer, which joins its group on the channel layer before the session
    # decides (none here: refused); the refusals after it must not wait on the layer either.
    await assert_refused("/ws/attempts/1/events/", [ORIGIN])
    for headers in ([(b"origin", b"http://evil.example")], [(b"origin", b"null")], [],
                    [(b"origin", b"http://testserver.evil.example")],
                    # Malformed: the URL parser raises on these, which must refuse, not crash
                    [(b"origin", b"http://[::1")], [(b"origin", b"http://[zz]")]):
        await assert_refused("/ws/attempts/1/events/", headers)
        await assert_refused("/ws/nope/", headers)
