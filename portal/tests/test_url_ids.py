"""Ids in URLs (``portal.apps.IdConverter``): a number too large for any id is a 404 on every route that takes one,
pages, API and WebSockets alike, never a server error (SQLite raised OverflowError for it)."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.converters import IntConverter

from portal.apps import IdConverter

pytestmark = pytest.mark.django_db

TOO_LARGE = (2**63, 2**64, 10**30)


def all_routes(patterns: list, prefix: str = "") -> list[tuple[str, URLPattern]]:
    routes = []
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            routes += all_routes(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            routes.append((prefix + str(pattern.pattern), pattern))
    return routes


def id_routes() -> list[tuple[str, URLPattern]]:
    """Every route with an id in its path, as ``(route, pattern)``."""
    return [
        (route, pattern)
        for route, pattern in all_routes(get_resolver().url_patterns)
        if any(isinstance(c, (IdConverter, IntConverter)) for c in pattern.pattern.converters.values())
    ]


def fill(route: str, pattern: URLPattern, number: int) -> str:
    url = "/" + route
    for name in pattern.pattern.converters:
        url = url.replace(f"<id:{name}>", str(number)).replace(f"<int:{name}>", str(number))
    return url


def test_every_id_in_the_urlconf_is_bounded():
    assert len(id_routes()) >= 25
    # A route written with Django's <int:...> would take any number of digits again.
    assert [route for route, _pattern in all_routes(get_resolver().url_patterns) if "<int:" in route] == []


@pytest.mark.embedded_db
@pytest.mark.parametrize("number", TOO_LARGE)
def test_ids_too_large_for_the_database_are_404_on_every_route(number, instructor_a, student_a):
    problems = []
    for user in (instructor_a, student_a):
        client = Client(raise_request_exception=False)
        client.force_login(user)
        for route, pattern in id_routes():
            url = fill(route, pattern, number)
            for method in ("get", "post"):
                response = getattr(client, method)(url, HTTP_ACCEPT="application/json")
                if response.status_code not in (404, 405):
                    problems.append(f"{method.upper()} {url} as {user}: {response.status_code}")
    assert problems == []


async def test_websocket_ids_too_large_are_refused():
    from ops.asgi import application

    for path in ("/ws/attempts/{}/events/", "/ws/attempts/{}/console/"):
        communicator = WebsocketCommunicator(
            application, path.format(2**64), headers=[(b"origin", b"http://testserver"), (b"host", b"testserver")]
        )
        connected, _code = await communicator.connect(timeout=10)
        assert not connected
        await communicator.disconnect(timeout=10)


def test_the_converter_round_trips_the_largest_id():
    converter = IdConverter()
    assert converter.to_python(str(2**63 - 1)) == 2**63 - 1
    assert converter.to_url(42) == "42"
    with pytest.raises(ValueError):
        converter.to_python(str(2**63))
