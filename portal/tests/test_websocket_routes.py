"""What the WebSocket gate refuses (``portal.websockets``): another origin, no origin, a path the portal does not
serve. Each is refused at the handshake, and the refused connection's application ends with it, without an error:
one that waited on the channel layer outlived its connection by seconds, holding a Redis connection."""

from __future__ import annotations

import time

import pytest
from channels.testing import WebsocketCommunicator

from ops.asgi import application

ORIGIN = (b"origin", b"http://testserver")
HOST = (b"host", b"testserver")


async def assert_refused(path: str, headers: list[tuple[bytes, bytes]]) -> None:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _code = await communicator.connect(timeout=10)
    assert not connected
    started = time.monotonic()
    await communicator.disconnect(timeout=10)  # raises what the application died of
    # Ends at once; one waiting on the channel layer's pending read took 5-10 s, so 4 s leaves room for load.
    assert time.monotonic() - started < 4, f"{path}: the refused connection's application outlived it"


@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/attempts/x/events/", "/ws/attempts/1/events/extra/", "/"])
async def test_a_path_the_portal_does_not_serve_is_refused(path):
    await assert_refused(path, [ORIGIN, HOST])


@pytest.mark.django_db(transaction=True)  # the first socket reaches its consumer
async def test_sockets_from_another_origin_are_refused_and_end_with_their_connection():
    # First a socket that reaches its consumer, which joins its group on the channel layer before the session
    # decides (none here: refused); the refusals after it must not wait on the layer either.
    await assert_refused("/ws/attempts/1/events/", [ORIGIN, HOST])
    for headers in (
        [(b"origin", b"http://evil.example")],
        [(b"origin", b"null")],
        [],
        [(b"origin", b"http://testserver.evil.example")],
        # Malformed: the URL parser raises on these, which must refuse, not crash
        [(b"origin", b"http://[::1")],
        [(b"origin", b"http://[zz]")],
    ):
        await assert_refused("/ws/attempts/1/events/", headers)
        await assert_refused("/ws/nope/", headers)


async def handshake(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[bool, int | None]:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    answer = await communicator.connect(timeout=10)
    await communicator.disconnect(timeout=10)
    return answer


@pytest.mark.django_db(transaction=True)
async def test_the_origin_must_match_scheme_host_and_port_exactly(settings):
    settings.ALLOWED_HOSTS = ["testserver", "portal.example"]
    path = "/ws/attempts/1/events/"
    # The same origin reaches the consumer, which refuses an anonymous person with a code of its own.
    reached = await handshake(path, [(b"origin", b"http://testserver"), HOST])
    assert reached[1] not in (None, 1000), reached
    for origin, host in (
        (b"http://testserver:9999", b"testserver"),  # another port on the same host
        (b"https://testserver", b"testserver"),  # another scheme
        (b"http://testserver", b"testserver:8000"),
        (b"http://portal.example", b"testserver"),  # another allowed host, but not the one addressed
        (b"http://testserver", None),  # no Host header to compare with
        (b"http://evil.example", b"evil.example"),  # a host the portal does not serve
    ):
        headers = [(b"origin", origin)] + ([(b"host", host)] if host else [])
        assert await handshake(path, headers) != reached, (origin, host)
    assert await handshake(path, [(b"origin", b"http://testserver:8000"), (b"host", b"testserver:8000")]) == reached


@pytest.mark.django_db(transaction=True)
async def test_tls_behind_the_proxy_and_trusted_origins_count_as_csrf_does(settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example", "https://*.school.example"]
    path = "/ws/attempts/1/events/"
    reached = await handshake(path, [(b"origin", b"http://testserver"), HOST])
    proxied = (b"x-forwarded-proto", b"https")
    assert await handshake(path, [(b"origin", b"https://testserver"), HOST, proxied]) == reached
    assert await handshake(path, [(b"origin", b"http://testserver"), HOST, proxied]) != reached
    assert await handshake(path, [(b"origin", b"https://console.example"), HOST]) == reached
    assert await handshake(path, [(b"origin", b"https://lab.school.example"), HOST]) == reached
    assert await handshake(path, [(b"origin", b"http://lab.school.example"), HOST]) != reached
    assert await handshake(path, [(b"origin", b"https://console.example:444"), HOST]) != reached
