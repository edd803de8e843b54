"""The isolation matrix: every URL pattern of the site and the API, and every WebSocket route, asked by every
persona, with the answer each must get; refusals change nothing and no page leaks the other tenant's rows."""

# The patterns are enumerated from the URLconf (``get_resolver().url_patterns``, walked recursively) and from
# ``labs.routing`` and ``grading.routing``; a pattern without an entry in ``MATRIX`` or ``WS_MATRIX`` fails
# ``test_every_route_has_an_entry``, so no endpoint can be added without saying who may use it. Admin URLs are
# covered as a group by a representative set.
#
# Every object asked for belongs to tenant A. Tenant B's personas must get 404 (never 403: no existence oracle).
# A refusal must leave the database (row counts and tenant A's objects) and the cluster (kubesim's request
# counters) as they were. Every page a persona can read is searched for the other tenant's names, so no list,
# filter, export or error page leaks a row across tenants.

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, path
from rest_framework.authtoken.models import Token

from api.tests.world import World, build_world, fresh_cache_settings
from grading.models import CheckResult, Grade, GradingRun
from labs.models import Attempt, Check, Lab
from portal.models import AuditEvent, Course, Membership, Tenant, User

ANON, SA, SB, TA, IB = "anonymous", "student_a", "student_b", "ta_a", "instructor_b"
PERSONAS = (ANON, SA, SB, TA, IB)
OTHER_TENANT = (SB, IB)
LOGIN = "login"  # a 302 to the sign-in page
ADMIN_LOGIN = "admin-login"  # a 302 to the admin's sign-in page (people who are not staff)
LOGIN_PATHS = {LOGIN: "/accounts/login/", ADMIN_LOGIN: "/admin/login/"}


def answers(anonymous: Any, student_a: Any, student_b: Any, ta_a: Any, instructor_b: Any) -> dict[str, Any]:
    """Expected answer per persona: a status code, a tuple of acceptable codes, or ``LOGIN``."""
    return dict(zip(PERSONAS, (anonymous, student_a, student_b, ta_a, instructor_b), strict=True))


@dataclass(frozen=True)
class Probe:
    expect: dict[str, Any]
    method: str = "GET"
    # URL kwargs come from the world by parameter name (``attempt_id`` -> world.attempt_a.id, ...); override here.
    kwargs: dict[str, Callable[[World], Any]] = field(default_factory=dict)
    data: dict[str, Any] | None = None
    query: str = ""
    api: bool = False
    # Does the probe address an object of tenant A? Then tenant B's personas must get 404.
    tenant_a_object: bool = True
    # Sent as the page's own script sends it (fetch with Accept: application/json), which gets status codes;
    # a plain form post is answered with a redirect and a message instead.
    accept_json: bool = False
    # False for probes whose answer reports on the system (readiness) rather than refuse someone.
    refusals_are_side_effect_free: bool = True


def api_get(expect: dict[str, Any], **kwargs: Any) -> Probe:
    return Probe(expect=expect, api=True, **kwargs)


def api_post(expect: dict[str, Any], data: dict[str, Any] | None = None, **kwargs: Any) -> Probe:
    return Probe(expect=expect, method="POST", api=True, data=data or {}, **kwargs)


def page(expect: dict[str, Any], **kwargs: Any) -> Probe:
    return Probe(expect=expect, **kwargs)


def form_post(expect: dict[str, Any], data: dict[str, Any] | None = None, **kwargs: Any) -> Probe:
    return Probe(expect=expect, method="POST", data=data or {}, **kwargs)


def button(expect: dict[str, Any], **kwargs: Any) -> Probe:
    """A lab page button, posted by the page's script."""
    return Probe(expect=expect, method="POST", data={}, accept_json=True, **kwargs)


DEFAULT_KWARGS: dict[str, Callable[[World], Any]] = {
    "course_id": lambda w: w.course_a.id,
    "lab_id": lambda w: w.lab_a.id,
    "attempt_id": lambda w: w.attempt_a.id,
    "run_id": lambda w: w.run_a.id,
    "grade_id": lambda w: w.grade_a.id,
    "student_id": lambda w: w.attempt_a.student_id,
    "uidb64": lambda w: "Mg",
    "token": lambda w: "set-password",
}

# Shorthands for the common shapes.
PUBLIC_PAGE = answers(200, 200, 200, 200, 200)
SIGNED_IN_PAGE = answers(LOGIN, 200, 200, 200, 200)
STUDENT_A_OWN = answers(LOGIN, 200, 404, 200, 404)  # the student's own object, or staff of its course
STAFF_ONLY_PAGE = answers(LOGIN, 404, 404, 200, 404)
API_LIST = answers(401, 200, 200, 200, 200)
API_OWN = answers(401, 200, 404, 200, 404)
API_STAFF = answers(401, 403, 404, 200, 404)

MATRIX: dict[str, list[Probe]] = {
    # ---- site: dashboard, health, metrics -------------------------------------------------------------------
    "": [page(SIGNED_IN_PAGE, tenant_a_object=False)],
    "favicon.ico": [page(answers(302, 302, 302, 302, 302), tenant_a_object=False)],  # to the static icon
    "healthz": [page(PUBLIC_PAGE, tenant_a_object=False)],
    "readyz": [
        page(
            answers((200, 503), (200, 503), (200, 503), (200, 503), (200, 503)),
            tenant_a_object=False,
            refusals_are_side_effect_free=False,
        )
    ],
    # A bearer token or a superuser's session; nobody in the personas has either.
    "metrics": [page(answers(401, 401, 401, 401, 401), tenant_a_object=False)],
    # ---- accounts -------------------------------------------------------------------------------------------
    "accounts/login/": [page(PUBLIC_PAGE, tenant_a_object=False)],
    "accounts/logout/": [form_post(answers(302, 302, 302, 302, 302), tenant_a_object=False)],
    "accounts/password_change/": [page(SIGNED_IN_PAGE, tenant_a_object=False)],
    "accounts/password_change/done/": [page(SIGNED_IN_PAGE, tenant_a_object=False)],
    "accounts/password_reset/": [page(PUBLIC_PAGE, tenant_a_object=False)],
    "accounts/password_reset/done/": [page(PUBLIC_PAGE, tenant_a_object=False)],
    "accounts/reset/<uidb64>/<token>/": [page(PUBLIC_PAGE, tenant_a_object=False)],
    "accounts/reset/done/": [page(PUBLIC_PAGE, tenant_a_object=False)],
    # The signed-in person's own clock: nobody else's to read or set.
    "accounts/time-zone/": [
        page(SIGNED_IN_PAGE, tenant_a_object=False),
        form_post(answers(LOGIN, 302, 302, 302, 302), data={"time_zone": "Europe/Berlin"}, tenant_a_object=False),
    ],
    "i18n/setlang/": [form_post(answers(302, 302, 302, 302, 302), data={"language": "ja"}, tenant_a_object=False)],
    # ---- labs: student pages and buttons --------------------------------------------------------------------
    "labs/<id:lab_id>/": [page(answers(LOGIN, 200, 404, 200, 404))],
    # Signed out, a script is told so (401). student_a has a running attempt already (409); the page's start is for
    # the course's students only.
    "labs/<id:lab_id>/start/": [button(answers(401, 409, 404, 404, 404))],
    "attempts/<id:attempt_id>/": [page(STUDENT_A_OWN)],
    # Stopping is for the student and the course's instructors, not TAs.
    "attempts/<id:attempt_id>/stop/": [button(answers(401, 200, 404, 403, 404))],
    # The running attempt has no time limit set, so there is nothing to extend.
    "attempts/<id:attempt_id>/extend/": [button(answers(401, 409, 404, 403, 404))],
    # The world's attempt was checked a moment ago and GRADING_MIN_INTERVAL_SECONDS is an hour.
    "attempts/<id:attempt_id>/check/": [button(answers(401, 429, 404, 429, 404))],
    "attempts/<id:attempt_id>/recording/": [page(STAFF_ONLY_PAGE)],
    "attempts/<id:attempt_id>/recording.cast": [page(STAFF_ONLY_PAGE)],
    # ---- grading pages ----------------------------------------------------------------------------------------
    # Students teach nothing: the grades link takes them on to their own grades.
    "grades/": [page(answers(LOGIN, 302, 302, 200, 200), tenant_a_object=False)],
    "grades/mine/": [page(SIGNED_IN_PAGE, tenant_a_object=False)],
    "grades/mine/labs/<id:lab_id>/": [page(answers(LOGIN, 200, 404, 404, 404))],
    "grades/courses/<id:course_id>/": [page(STAFF_ONLY_PAGE)],
    "grades/courses/<id:course_id>/export.csv": [page(STAFF_ONLY_PAGE)],
    "grades/labs/<id:lab_id>/": [page(STAFF_ONLY_PAGE)],
    "grades/labs/<id:lab_id>/regrade/": [form_post(answers(LOGIN, 404, 404, 302, 404))],
    # One page at two addresses: the student's grade and attempts for the lab, with the override form.
    "grades/labs/<id:lab_id>/students/<id:student_id>/": [
        page(STAFF_ONLY_PAGE),
        form_post(answers(LOGIN, 404, 404, 302, 404), data={"score": "2", "reason": "Partial credit"}),
    ],
    "grades/labs/<id:lab_id>/students/<id:student_id>/override/": [
        page(STAFF_ONLY_PAGE),
        form_post(answers(LOGIN, 404, 404, 302, 404), data={"score": "2", "reason": "Partial credit"}),
    ],
    "grades/attempts/<id:attempt_id>/": [page(STAFF_ONLY_PAGE)],
    "grades/attempts/<id:attempt_id>/regrade/": [form_post(answers(LOGIN, 404, 404, 302, 404))],
    # ---- course audit page (instructors of the course) ------------------------------------------------------
    "courses/<id:course_id>/audit/": [page(answers(LOGIN, 403, 404, 403, 404))],
    # ---- API --------------------------------------------------------------------------------------------------
    "api/schema/": [page(PUBLIC_PAGE, tenant_a_object=False)],
    "api/docs/": [page(PUBLIC_PAGE, tenant_a_object=False)],
    "api/v1/me/": [
        api_get(API_LIST, tenant_a_object=False),
        Probe(
            expect=answers(401, 200, 200, 200, 200),
            method="PATCH",
            api=True,
            data={"time_zone": "Europe/Berlin"},
            tenant_a_object=False,
        ),
    ],
    "api/v1/auth/token/": [
        api_post(
            answers(400, 400, 400, 400, 400), data={"username": "student_a", "password": "wrong"}, tenant_a_object=False
        ),
    ],
    "api/v1/me/token/": [
        Probe(expect=answers(401, 204, 204, 204, 204), method="DELETE", api=True, tenant_a_object=False)
    ],
    "api/v1/courses/": [
        api_get(API_LIST, tenant_a_object=False),
        api_get(API_LIST, query="?ordering=-title&page_size=1", tenant_a_object=False),
    ],
    "api/v1/courses/<id:course_id>/": [api_get(API_OWN)],
    "api/v1/courses/<id:course_id>/report/": [api_get(API_STAFF)],
    "api/v1/courses/<id:course_id>/report.csv": [api_get(API_STAFF)],
    "api/v1/courses/<id:course_id>/audit/": [api_get(answers(401, 403, 404, 403, 404))],
    "api/v1/labs/": [
        api_get(API_LIST, tenant_a_object=False),
        api_get(API_LIST, query="?course={course_b}", tenant_a_object=False),
    ],
    "api/v1/labs/<id:lab_id>/": [api_get(API_OWN)],
    "api/v1/labs/<id:lab_id>/report/": [api_get(API_STAFF)],
    "api/v1/attempts/": [
        api_get(API_LIST, tenant_a_object=False),
        api_get(API_LIST, query="?course={course_a}&ordering=-requested_at", tenant_a_object=False),
        api_post(answers(401, 409, 404, 403, 404), data={"lab": "{lab_a}"}),
    ],
    "api/v1/attempts/<id:attempt_id>/": [api_get(API_OWN)],
    "api/v1/attempts/<id:attempt_id>/stop/": [api_post(answers(401, 200, 404, 403, 404))],
    "api/v1/attempts/<id:attempt_id>/extend/": [api_post(answers(401, 409, 404, 403, 404))],
    "api/v1/attempts/<id:attempt_id>/check/": [api_post(answers(401, 429, 404, 429, 404))],
    "api/v1/grading-runs/": [
        api_get(API_LIST, tenant_a_object=False),
        api_get(API_LIST, query="?lab={lab_a}", tenant_a_object=False),
    ],
    "api/v1/grading-runs/<id:run_id>/": [api_get(API_OWN)],
    "api/v1/grades/": [
        api_get(API_LIST, tenant_a_object=False),
        api_get(API_LIST, query="?course={course_a}&ordering=-score", tenant_a_object=False),
    ],
    "api/v1/grades/<id:grade_id>/": [api_get(API_OWN)],
    "api/v1/grades/<id:grade_id>/override/": [
        api_post(answers(401, 403, 404, 200, 404), data={"score": "2.00", "reason": "Partial credit"}),
    ],
}

# Admin URLs as a group: a representative set. Instructors are staff users; the admin scopes them to their own
# tenant, so instructor_b finds tenant A's objects missing (the admin's "does not exist" redirect, as for any id).
ADMIN_PREFIX = "admin/"
AL = ADMIN_LOGIN
ADMIN_PROBES: list[tuple[str, Probe]] = [
    ("/admin/", page(answers(AL, AL, AL, AL, 200), tenant_a_object=False)),
    ("/admin/labs/lab/", page(answers(AL, AL, AL, AL, 200), tenant_a_object=False)),
    ("/admin/labs/lab/{lab_a}/change/", page(answers(AL, AL, AL, AL, 302))),
    ("/admin/portal/course/{course_a}/change/", page(answers(AL, AL, AL, AL, 302))),
    ("/admin/labs/attempt/", page(answers(AL, AL, AL, AL, 200), tenant_a_object=False)),
    ("/admin/portal/auditevent/", page(answers(AL, AL, AL, AL, (200, 403)), tenant_a_object=False)),
    ("/admin/portal/tenant/", page(answers(AL, AL, AL, AL, 403), tenant_a_object=False)),
    # Filters, search and autocomplete are list views too: naming tenant A's ids or names finds nothing.
    ("/admin/labs/lab/?course__id__exact={course_a}", page(answers(AL, AL, AL, AL, (200, 302)), tenant_a_object=False)),
    ("/admin/labs/attempt/?q=student_a", page(answers(AL, AL, AL, AL, 200), tenant_a_object=False)),
    ("/admin/portal/membership/?q=LNX101", page(answers(AL, AL, AL, AL, 200), tenant_a_object=False)),
    (
        "/admin/autocomplete/?app_label=portal&model_name=membership&field_name=user&term=student",
        page(answers(AL, AL, AL, AL, (200, 403)), tenant_a_object=False),
    ),
    (
        "/admin/autocomplete/?app_label=portal&model_name=membership&field_name=course&term=",
        page(answers(AL, AL, AL, AL, (200, 403)), tenant_a_object=False),
    ),
]

# WebSocket routes: "accept", or the close code the consumer refuses with before accepting.
ACCEPT = "accept"
WS_MATRIX: dict[str, dict[str, Any]] = {
    "ws/attempts/<id:attempt_id>/events/": answers(4401, ACCEPT, 4404, ACCEPT, 4404),
    "ws/attempts/<id:attempt_id>/console/": answers(4401, ACCEPT, 4404, ACCEPT, 4404),
    "ws/labs/<id:lab_id>/class/": answers(4401, 4404, 4404, ACCEPT, 4404),
}


# ---------------------------------------------------------------------------------------------------------------
# Enumeration


def walk(patterns: list, prefix: str = "") -> list[tuple[str, URLPattern]]:
    routes = []
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            routes += walk(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            routes.append((prefix + str(pattern.pattern), pattern))
    return routes


def site_routes() -> list[str]:
    return [route for route, _pattern in walk(get_resolver().url_patterns)]


def websocket_routes() -> list[str]:
    from grading.routing import websocket_urlpatterns as grading_routes
    from labs.routing import websocket_urlpatterns as labs_routes

    return [route for route, _pattern in walk([*labs_routes, *grading_routes])]


def test_every_route_has_an_entry():
    routes = site_routes()
    missing = [r for r in routes if not r.startswith(ADMIN_PREFIX) and r not in MATRIX]
    assert missing == [], f"routes without an isolation-matrix entry: {missing}"
    stale = sorted(set(MATRIX) - set(routes))
    assert stale == [], f"matrix entries for routes that no longer exist: {stale}"
    assert any(r.startswith(ADMIN_PREFIX) for r in routes) and ADMIN_PROBES
    ws_routes = websocket_routes()
    assert sorted(ws_routes) == sorted(WS_MATRIX), "WebSocket routes and WS_MATRIX differ"


def test_tenant_b_personas_get_404_for_every_tenant_a_object():
    """The matrix itself: nothing of tenant A answers 403 (or anything but 404) to tenant B."""
    for route, probes in MATRIX.items():
        for probe in probes:
            if probe.tenant_a_object:
                for persona in OTHER_TENANT:
                    assert probe.expect[persona] == 404, f"{probe.method} {route} for {persona}"
    for route, expect in WS_MATRIX.items():
        for persona in OTHER_TENANT:
            assert expect[persona] == 4404, route


# ---------------------------------------------------------------------------------------------------------------
# Running the probes

KEY_TABLES = (Tenant, User, Course, Membership, Lab, Check, Attempt, GradingRun, CheckResult, Grade, AuditEvent, Token)


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in KEY_TABLES}


def tenant_a_state(world: World) -> dict[str, Any]:
    attempt = Attempt.objects.get(id=world.attempt_a.id)
    grade = Grade.objects.get(id=world.grade_a.id)
    return {
        "attempt": (attempt.state, attempt.extensions, attempt.expires_at, attempt.stop_reason),
        "grade": (grade.score, grade.override_score, grade.override_reason),
        "lab": tuple(Lab.objects.filter(id=world.lab_a.id).values_list("title", "time_limit_minutes").get()),
        "members": sorted(Membership.objects.filter(course=world.course_a).values_list("user_id", "role")),
    }


def markers(world: World) -> dict[str, list[str]]:
    """Strings that only a page about that tenant can contain."""
    return {
        "A": [
            world.course_a.code,
            world.course_a.tenant.name,
            world.course_a.tenant.namespace,
            "student_a",
            "instructor_a",
            world.attempt_a.vm_name,
            world.attempt_a.agent_token,
        ],
        "B": [
            world.course_b.code,
            world.course_b.tenant.name,
            world.course_b.tenant.namespace,
            "student_b",
            "instructor_b",
            world.lab_b.title,
            world.attempt_b.vm_name,
            world.attempt_b.agent_token,
        ],
    }


def fill(text: str, world: World) -> str:
    return text.format(
        course_a=world.course_a.id,
        course_b=world.course_b.id,
        lab_a=world.lab_a.id,
        lab_b=world.lab_b.id,
        attempt_a=world.attempt_a.id,
    )


def url_for(route: str, probe: Probe, world: World, pattern: URLPattern | None) -> str:
    path = "/" + route
    if pattern is not None:
        for name in pattern.pattern.converters:
            value = probe.kwargs.get(name, DEFAULT_KWARGS[name])(world)
            path = path.replace(f"<id:{name}>", str(value)).replace(f"<{name}>", str(value))
    return path + fill(probe.query, world)


def client_for(persona: str, users: dict[str, User]) -> Client:
    client = Client()
    if persona != ANON:
        client.force_login(users[persona])
    return client


def send(client: Client, probe: Probe, url: str, world: World):
    headers = {"HTTP_ACCEPT": "application/json"} if probe.accept_json else {}
    if probe.method == "GET":
        return client.get(url, **headers)
    data = {key: fill(value, world) if isinstance(value, str) else value for key, value in (probe.data or {}).items()}
    if probe.api:
        return client.generic(probe.method, url, data=json.dumps(data), content_type="application/json")
    return client.post(url, data, **headers) if probe.method == "POST" else client.generic(probe.method, url)


def matches(expected: Any, response) -> bool:
    if expected in LOGIN_PATHS:
        return response.status_code == 302 and response["Location"].startswith(LOGIN_PATHS[expected])
    if isinstance(expected, tuple):
        return response.status_code in expected
    return response.status_code == expected


def is_refusal(expected: Any, response) -> bool:
    return expected in LOGIN_PATHS or response.status_code >= 400


def tenant_of(persona: str) -> str | None:
    return {SA: "A", TA: "A", SB: "B", IB: "B"}.get(persona)


def body_text(response) -> str:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode(errors="replace")
    return response.content.decode(errors="replace")


@pytest.fixture
def world(lab_a, lab_b, student_a, student_b, instructor_a, instructor_b, ta_a, settings, tmp_path) -> World:
    settings.CACHES = fresh_cache_settings()
    settings.GRADING_MIN_INTERVAL_SECONDS = 3600
    settings.CONSOLE_RECORDINGS_DIR = tmp_path
    world = build_world(
        lab_a=lab_a,
        lab_b=lab_b,
        student_a=student_a,
        student_b=student_b,
        instructor_a=instructor_a,
        instructor_b=instructor_b,
    )
    # A console recording of tenant A's attempt, for the staff-only replay routes.
    (tmp_path / f"attempt-{world.attempt_a.id}.cast").write_text(
        '{"version": 2, "width": 80, "height": 24}\n[0.1, "o", "$ "]\n'
    )
    return world


@pytest.fixture
def users(student_a, student_b, ta_a, instructor_b) -> dict[str, User]:
    return {SA: student_a, SB: student_b, TA: ta_a, IB: instructor_b}


def run_probe(
    route: str, pattern: URLPattern | None, probe: Probe, world: World, users: dict[str, User], cluster
) -> list[str]:
    """Every persona in turn, each inside a rolled-back savepoint so one persona's change never shapes the next
    one's answer. Returns the mismatches, in words."""
    problems = []
    leaks = markers(world)
    for persona in PERSONAS:
        expected = probe.expect[persona]
        url = url_for(route, probe, world, pattern)
        counters_before = cluster.admin.counters()["by_verb_resource"]
        with transaction.atomic():
            counts_before, state_before = row_counts(), tenant_a_state(world)
            client = client_for(persona, users)
            if persona != ANON and probe.method == "DELETE":
                Token.objects.get_or_create(user=users[persona])
                counts_before = row_counts()
            response = send(client, probe, url, world)
            text = body_text(response)
            label = f"{probe.method} {url} as {persona}: got {response.status_code}, expected {expected}"
            if not matches(expected, response):
                problems.append(f"{label} {text[:200]!r}")
            elif is_refusal(expected, response) and probe.refusals_are_side_effect_free:
                if row_counts() != counts_before or tenant_a_state(world) != state_before:
                    problems.append(f"{label}: the refusal changed the database")
            own = tenant_of(persona)
            other = {"A": "B", "B": "A"}.get(own)
            for marker in leaks[other] if other else leaks["A"] + leaks["B"]:
                # A search box showing back the term it was given is no leak; the rows it finds would be.
                if marker and marker in text and marker not in url:
                    problems.append(f"{label}: the answer contains {marker!r} of another tenant")
            transaction.set_rollback(True)
        refused = is_refusal(expected, response) and probe.refusals_are_side_effect_free
        if refused and cluster.admin.counters()["by_verb_resource"] != counters_before:
            problems.append(f"{label}: the refusal called the cluster")
    return problems


def entries() -> list[tuple[str, int]]:
    return [(route, index) for route, probes in MATRIX.items() for index in range(len(probes))]


@pytest.mark.django_db
@pytest.mark.parametrize(("route", "index"), entries(), ids=[f"{r or '/'}#{i}" for r, i in entries()])
def test_route_answers_each_persona_as_the_matrix_says(route, index, world, users, cluster):
    patterns = dict(walk(get_resolver().url_patterns))
    assert route in patterns, f"{route} is in the matrix but not in the URLconf"
    problems = run_probe(route, patterns[route], MATRIX[route][index], world, users, cluster)
    assert problems == [], "\n".join(problems)


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "probe"), ADMIN_PROBES, ids=[path for path, _ in ADMIN_PROBES])
def test_admin_answers_each_persona_as_the_matrix_says(path, probe, world, users, cluster):
    problems = run_probe(fill(path, world).lstrip("/"), None, probe, world, users, cluster)
    assert problems == [], "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------
# WebSocket routes


async def ws_answer(path: str, cookie: str | None) -> Any:
    from ops.asgi import application

    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=10)
    if connected:
        await communicator.disconnect()
        # Give the consumer's disconnect handler its turn before the test tears the database down.
        await asyncio.sleep(0.05)
        return ACCEPT
    return code


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", sorted(WS_MATRIX))
async def test_websocket_route_answers_each_persona_as_the_matrix_says(route, world, users, cluster):
    problems = []
    path = "/" + route.replace("<id:attempt_id>", str(world.attempt_a.id)).replace("<id:lab_id>", str(world.lab_a.id))
    for persona in PERSONAS:
        counts_before = await database_sync_to_async(row_counts)()
        state_before = await database_sync_to_async(tenant_a_state)(world)
        expected = WS_MATRIX[route][persona]
        cookie = None
        if persona != ANON:
            client = Client()
            await database_sync_to_async(client.force_login)(users[persona])
            cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        counters_before = cluster.admin.counters()["by_verb_resource"]
        got = await ws_answer(path, cookie)
        if got != expected:
            problems.append(f"{path} as {persona}: got {got}, expected {expected}")
        if expected != ACCEPT:
            if cluster.admin.counters()["by_verb_resource"] != counters_before:
                problems.append(f"{path} as {persona}: the refusal called the cluster")
            if await database_sync_to_async(row_counts)() != counts_before:
                problems.append(f"{path} as {persona}: the refusal changed the database")
            if await database_sync_to_async(tenant_a_state)(world) != state_before:
                problems.append(f"{path} as {persona}: the refusal changed tenant A's objects")
    assert problems == [], "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------
# The checks above can fail: a leaky URLconf of deliberately broken views trips each one.


def _leaky_list(request):
    from django.http import HttpResponse

    # Lists every course, whatever the tenant: the marker search must notice.
    return HttpResponse(", ".join(Course.objects.values_list("code", flat=True)))


def _forbidden_not_missing(request, attempt_id: int):
    from django.http import HttpResponse, HttpResponseForbidden

    if request.user.is_authenticated and request.user.tenant_id != Attempt.objects.get(id=attempt_id).tenant_id:
        return HttpResponseForbidden("not yours")  # an existence oracle: 403 where 404 is due
    return HttpResponse("ok")


def _writes_before_refusing(request, attempt_id: int):
    from django.http import Http404

    AuditEvent.objects.create(action="test.leak")
    raise Http404


def _calls_cluster_before_refusing(request, attempt_id: int):
    from django.http import Http404

    from labs.kubevirt.client import core_v1

    core_v1().list_namespace()
    raise Http404


urlpatterns = [
    path("leaky/", _leaky_list),
    path("oracle/<id:attempt_id>/", _forbidden_not_missing),
    path("writes/<id:attempt_id>/", _writes_before_refusing),
    path("calls/<id:attempt_id>/", _calls_cluster_before_refusing),
]


@pytest.mark.django_db
@pytest.mark.urls(__name__)
@pytest.mark.parametrize(
    ("route", "expect", "problem"),
    [
        ("leaky/", answers(200, 200, 200, 200, 200), "contains"),
        ("oracle/<id:attempt_id>/", answers(200, 200, 404, 200, 404), "got 403, expected 404"),
        ("writes/<id:attempt_id>/", answers(404, 404, 404, 404, 404), "changed the database"),
        ("calls/<id:attempt_id>/", answers(404, 404, 404, 404, 404), "called the cluster"),
    ],
)
def test_the_matrix_checks_catch_broken_views(route, expect, problem, world, users, cluster):
    patterns = dict(walk(get_resolver().url_patterns))
    problems = run_probe(route, patterns[route], page(expect), world, users, cluster)
    assert any(problem in line for line in problems), problems
