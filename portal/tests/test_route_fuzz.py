"""Every route of the site (pages, admin, API) with what an attacker sends instead of what the page would: ids too
large for the database, bodies past the bound, JSON nested too deep, broken forms and uploads. None may end in a
server error. (The API's own operations are fuzzed against their schema in api/tests/test_schema.py.)"""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portal.tests.test_request_bounds import call as asgi_call

pytestmark = pytest.mark.django_db

PARAMETER = re.compile(r"<(?:(\w+):)?(\w+)>")
DEEP_JSON = "[" * 100_000 + "]" * 100_000
BROKEN_BODIES = [
    (DEEP_JSON, "application/json"),
    ("{not json", "application/json"),
    ("username=%ff%fe&&=&password=" + "x" * 5000, "application/x-www-form-urlencoded"),
    (
        '--x\r\nContent-Disposition: form-data; name="csv_file"; filename="a.csv"\r\n\r\nno end',
        "multipart/form-data; boundary=x",
    ),
    ("garbage", "multipart/form-data"),  # no boundary
]


def all_routes(patterns: list | None = None, prefix: str = "") -> list[tuple[str, URLPattern]]:
    routes = []
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(pattern, URLResolver):
            routes += all_routes(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            routes.append((prefix + str(pattern.pattern), pattern))
    return routes


def url_of(route: str, value: str) -> str:
    """The route as a path, every parameter given ``value``; regex routes (the admin's) keep their literal parts."""
    path = PARAMETER.sub(value, route)
    path = re.sub(r"\(\?P<\w+>[^)]*\)", value, path).replace("^", "").replace("$", "").replace("\\", "")
    return "/" + path


@pytest.fixture
def signed_in(student_a, instructor_a) -> list[Client]:
    clients = []
    for user in (student_a, instructor_a):
        client = Client(raise_request_exception=False)
        client.force_login(user)
        clients.append(client)
    return clients


@pytest.mark.embedded_db
def test_ids_too_large_on_every_route_are_never_a_server_error(signed_in):
    routes = [route for route, pattern in all_routes() if pattern.pattern.converters or "(?P<" in route]
    assert len(routes) >= 30
    problems: list[str] = []

    @settings(max_examples=6, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(number=st.integers(min_value=2**63, max_value=2**256))
    def check(number: int) -> None:
        for client in signed_in:
            for route in routes:
                url = url_of(route, str(number))
                for method in ("get", "post"):
                    response = getattr(client, method)(url, HTTP_ACCEPT="application/json")
                    if response.status_code >= 500:
                        problems.append(f"{method.upper()} {url}: {response.status_code}")

    check()
    assert problems == [], "\n".join(problems[:20])


def test_broken_bodies_on_every_route_are_never_a_server_error(signed_in):
    problems: list[str] = []
    for route, _pattern in all_routes():
        url = url_of(route, "999999999")
        for body, content_type in BROKEN_BODIES:
            for client in signed_in:
                response = client.generic("POST", url, body, content_type=content_type)
                if response.status_code >= 500:
                    problems.append(f"POST {url} ({content_type}): {response.status_code}")
    assert problems == [], "\n".join(problems[:20])


def test_bodies_past_the_bound_are_413_on_every_route(settings):
    settings.REQUEST_BODY_MAX_BYTES = 64 * 1024
    settings.REQUEST_UPLOAD_MAX_BYTES = 128 * 1024
    problems: list[str] = []
    for route, _pattern in all_routes():
        url = url_of(route, "1")
        for content_type in (b"application/json", b"multipart/form-data; boundary=x"):
            for declare_length in (True, False):
                status, _body, _read = async_to_sync(asgi_call)(
                    url, body_chunks=3, declare_length=declare_length, content_type=content_type
                )
                if status != 413:
                    problems.append(f"POST {url} ({content_type.decode()}, length {declare_length}): {status}")
    assert problems == [], "\n".join(problems[:20])
