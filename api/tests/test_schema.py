"""The OpenAPI schema and its docs page; that it documents what the API answers (refusals, bounds); and schemathesis:
no request the schema allows or forbids, no id too large, JSON too deep or body too long makes the API fail with a
server error or answer outside the error format."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import schemathesis
from asgiref.sync import async_to_sync
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient
from schemathesis import GenerationMode, checks

from portal.apps import MAX_ID
from portal.tests.test_request_bounds import call as asgi_post

pytestmark = pytest.mark.django_db

# Bounded so the whole fuzz stays well under two minutes on a shared 2-core machine.
EXAMPLES_PER_OPERATION = 8
# Revoking the token would sign the fuzzer out halfway; it has its own test.
NOT_FUZZED = {("DELETE", "/api/v1/me/token/")}
# Numbers no database id can hold (SQLite raised OverflowError on them).
OVERSIZED_IDS = (2**63, 10**20)
DEEP_JSON = "[" * 100_000 + "]" * 100_000
# What a client generated from the schema relies on: the status, media type, headers and body are documented.
DOCUMENTED = [
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]


def test_schema_is_served_and_lists_every_endpoint():
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    paths = set(schema["paths"])
    assert {
        "/api/v1/courses/",
        "/api/v1/labs/{lab_id}/",
        "/api/v1/attempts/",
        "/api/v1/attempts/{attempt_id}/stop/",
        "/api/v1/attempts/{attempt_id}/extend/",
        "/api/v1/attempts/{attempt_id}/check/",
        "/api/v1/grading-runs/",
        "/api/v1/grades/",
        "/api/v1/courses/{course_id}/report/",
        "/api/v1/courses/{course_id}/audit/",
        "/api/v1/auth/token/",
    } <= paths
    assert set(schema["components"]["securitySchemes"]) >= {"cookieAuth", "tokenAuth"}
    assert "Error" in schema["components"]["schemas"]
    # Server-owned fields are never in a request body.
    start = schema["components"]["schemas"]["AttemptStartRequest"]
    assert set(start["properties"]) == {"lab"}


def test_docs_page_loads_swagger_ui_from_our_own_static_files_without_inline_script():
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    sources = re.findall(r'<script src="([^"]+)"', html)
    assert sources and all(src.startswith("/") for src in sources), sources
    assert not re.search(r"<script>\s*\S", html), "inline script would be blocked by the CSP"
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    init_script = Client().get("/api/docs/?script=")
    assert init_script.status_code == 200 and "SwaggerUIBundle" in init_script.content.decode()


@pytest.fixture
def wsgi_app() -> Iterator:
    """The real WSGI application, kept from closing the test's database connection after each request (as
    Django's own test client does), so requests see the test's rows."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _error_format_ok(response) -> bool:
    if response.status_code < 400:
        return True
    body = response.json()
    return set(body) == {"error"} and {"code", "message"} <= set(body["error"])


def fuzz(strategy, *, token: str, problems: list[str], allow_unsatisfiable: bool = False) -> None:
    """Send the strategy's cases as the token's owner; note server errors and answers outside the format."""

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def call(case) -> None:
        response = case.call(headers={"Authorization": f"Token {token}"})
        label = f"{case.method} {case.formatted_path} -> {response.status_code}"
        if response.status_code >= 500:
            problems.append(f"{label}: {response.text[:300]}")
        elif response.headers.get("Content-Type", "").startswith("application/json") and not (
            _error_format_ok(response)
        ):
            problems.append(f"{label}: not in the error format: {response.text[:300]}")

    try:
        call()
    except Unsatisfiable:
        # Only for the negative mode: an operation whose every input is valid (no parameters, no body) has no
        # invalid request to make.
        if not allow_unsatisfiable:
            raise


@pytest.mark.timeout(240)
def test_fuzzed_requests_never_cause_server_errors(world, student_a, ta_a, wsgi_app):
    schema = schemathesis.openapi.from_wsgi("/api/schema/", wsgi_app)
    ids = {
        "course_id": world.course_a.id,
        "lab_id": world.lab_a.id,
        "attempt_id": world.attempt_a.id,
        "run_id": world.run_a.id,
        "grade_id": world.grade_a.id,
    }
    users = [Token.objects.create(user=student_a).key, Token.objects.create(user=ta_a).key]
    problems: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:
        if (operation.method.upper(), operation.path) in NOT_FUZZED:
            continue
        known = {name: value for name, value in ids.items() if "{" + name + "}" in operation.path}
        fuzz(operation.as_strategy(GenerationMode.POSITIVE), token=users[0], problems=problems)
        fuzz(
            operation.as_strategy(GenerationMode.NEGATIVE), token=users[1], problems=problems, allow_unsatisfiable=True
        )
        names = re.findall(r"{(\w+)}", operation.path)
        for number in OVERSIZED_IDS if names else ():
            fuzz(
                operation.as_strategy(GenerationMode.POSITIVE, path_parameters=dict.fromkeys(names, number)),
                token=users[1],
                problems=problems,
            )
        if known:
            # Real objects of tenant A, so the handlers behind the 404s run too, as a student and as staff.
            for token in users:
                fuzz(
                    operation.as_strategy(GenerationMode.POSITIVE, path_parameters=known),
                    token=token,
                    problems=problems,
                )
    assert problems == [], "\n".join(problems[:20])


def test_every_operation_answers_deep_json_and_oversized_bodies_with_a_clear_refusal(world, ta_a, settings):
    schema = schemathesis.openapi.from_dict(
        Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    )
    ids = {
        "course_id": world.course_a.id,
        "lab_id": world.lab_a.id,
        "attempt_id": world.attempt_a.id,
        "run_id": world.run_a.id,
        "grade_id": world.grade_a.id,
    }
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=ta_a).key}")
    settings.REQUEST_BODY_MAX_BYTES = 64 * 1024
    problems = []
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        method, url = operation.method.upper(), operation.path.format(**ids)
        if (method, operation.path) in NOT_FUZZED or method == "GET":
            continue
        response = client.generic(method, url, DEEP_JSON, content_type="application/json")
        if response.status_code >= 500 or not _error_format_ok(response) or response.status_code < 400:
            problems.append(f"deep JSON: {method} {url} -> {response.status_code} {response.content[:200]}")
        for declare_length in (True, False):
            status, body, _read = async_to_sync(asgi_post)(
                url, body_chunks=4, declare_length=declare_length, method=method
            )
            if status != 413:
                problems.append(f"oversized body: {method} {url} -> {status} {body[:200]}")
    assert len(operations) >= 20
    assert problems == [], "\n".join(problems)


@pytest.fixture
def api_schema(wsgi_app):
    return schemathesis.openapi.from_wsgi("/api/schema/", wsgi_app)


@pytest.fixture
def answer(api_schema):
    """``answer(method, path, user=None, **case)``: the API's answer, after checking that the schema documents it."""

    def call(method: str, path: str, user=None, **case):
        headers = {"Authorization": f"Token {Token.objects.get_or_create(user=user)[0].key}"} if user else {}
        case.setdefault("path_parameters", dict.fromkeys(re.findall(r"{(\w+)}", path), 1))
        operation_case = api_schema[path][method].Case(headers=headers, **case)
        response = operation_case.call()
        operation_case.validate_response(response, checks=DOCUMENTED)
        return response

    return call


def test_a_request_without_sign_in_is_a_documented_401_with_the_token_challenge(api_schema, answer):
    operations = [
        (method.upper(), path)
        for path, item in api_schema.raw_schema["paths"].items()
        for method, operation in item.items()
        if operation.get("security")
    ]
    assert ("GET", "/api/v1/me/") in operations and ("POST", "/api/v1/auth/token/") not in operations
    for method, path in operations:
        response = answer(method, path)
        assert response.status_code == 401, (method, path)
        assert response.headers["www-authenticate"] == ["Token"]


def test_lists_take_every_value_their_schema_allows_and_document_what_they_refuse(
    world, instructor_a, api_schema, answer
):
    lists = {}
    for path, item in api_schema.raw_schema["paths"].items():
        query = {p["name"]: p["schema"] for p in item.get("get", {}).get("parameters", []) if p["in"] == "query"}
        if "page" in query:
            lists[path] = query
    assert len(lists) == 6

    def status(path: str, **params) -> int:
        ids = {"course_id": world.course_a.id} if "{course_id}" in path else {}
        return answer("GET", path, instructor_a, path_parameters=ids, query=params).status_code

    for path, query in lists.items():
        assert query["page_size"]["maximum"] == 200
        for name, bounds in query.items():
            if bounds["type"] == "integer":
                assert bounds["minimum"] == 1, (path, name)
                for value in {bounds["minimum"], bounds.get("maximum", 1)}:
                    assert status(path, **{name: value}) == 200, (path, name, value)
            if bounds["type"] == "integer" and name not in ("page", "page_size"):
                assert bounds["maximum"] == MAX_ID and status(path, **{name: 0}) == 400, (path, name)
        if "ordering" in query:
            assert status(path, ordering=",".join(query["ordering"]["items"]["enum"])) == 200, path
            assert status(path, ordering="tenant") == 400, path
        assert status(path, page=10**6) == 404, path


def test_a_second_start_names_the_attempt_in_progress(world, student_a, answer):
    response = answer("POST", "/api/v1/attempts/", student_a, body={"lab": world.lab_a.id})
    assert response.status_code == 409
    assert response.json()["error"]["details"] == {"attempt_id": world.attempt_a.id}


def test_a_lab_reads_as_exactly_one_of_the_student_and_staff_shapes(world, student_a, ta_a, answer):
    for user in (student_a, ta_a):
        response = answer("GET", "/api/v1/labs/{lab_id}/", user, path_parameters={"lab_id": world.lab_a.id})
        assert response.status_code == 200 and ("image" in response.json()) == (user == ta_a)


def test_request_bodies_are_json_and_take_no_key_they_do_not_name(student_a, api_schema, answer):
    schema = api_schema.raw_schema
    bodies = [
        (method.upper(), path, operation["requestBody"]["content"])
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if "requestBody" in operation
    ]
    assert len(bodies) == 4
    for method, path, content in bodies:
        assert list(content) == ["application/json"]
        component = content["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        assert schema["components"]["schemas"][component]["additionalProperties"] is False
        response = answer(method, path, student_a, body={"unknown": 1})
        assert response.status_code == 400 and "unknown" in response.json()["error"]["fields"], (method, path)
