"""The lab page's socket (``/ws/labs/<id>/events/``): Start pressed over it, answered on it, then the new attempt's
events on the same socket; refusals and failures answered in words; only the lab's students may open it."""

from __future__ import annotations

import logging
import re
import string

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import OperationalError
from django.test import Client
from django.utils import timezone
from django.utils.crypto import get_random_string
from psycopg_pool import PoolTimeout

from api.tests.world import fresh_cache_settings
from labs.consumers import lab as lab_socket
from labs.models import Attempt, AttemptState
from labs.tests.conftest import sync_until
from labs.tests.test_consumers import HOST, ORIGIN, Viewer, session_cookie
from portal import metrics
from portal.models import AuditEvent
from portal.server_errors import BUSY_RETRY_AFTER_RANGE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

CSRF_TOKEN_INPUT = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def new_csrf_secret() -> str:
    return get_random_string(32, string.ascii_letters + string.digits)


async def open_lab_socket(user, lab_id: int, *, csrf_secret: str | None = None,
                          language: str | None = None) -> Viewer:
    cookie = await sync_to_async(session_cookie)(user)
    if csrf_secret:
        cookie += f"; {settings.CSRF_COOKIE_NAME}={csrf_secret}".encode()
    headers = [ORIGIN, HOST, (b"cookie", cookie)]
    if language:
        headers.append((b"accept-language", language.encode()))
    viewer = Viewer(f"/ws/labs/{lab_id}/events/", headers)
    connected, code = await viewer.connect()
    assert connected, f"refused with {code}"
    return viewer


def of_type(viewer: Viewer, kind: str) -> list[dict]:
    return [message for message in viewer.messages if message["type"] == kind]


async def test_start_over_the_socket_brings_the_panel_then_the_attempts_updates(lifecycle, student_a, lab_a):
    secret = new_csrf_secret()
    viewer = await open_lab_socket(student_a, lab_a.id, csrf_secret=secret)
    await viewer.send_json({"type": "start"})
    await viewer.read_until(lambda v: of_type(v, "start.answer") and of_type(v, "attempt.update"))

    answer = of_type(viewer, "start.answer")[0]
    attempt = await Attempt.objects.aget(student=student_a, lab=lab_a)
    assert answer["attempt"]["id"] == attempt.id
    assert f'data-attempt="{attempt.id}"' in answer["panel"] and 'id="attempt-config"' in answer["panel"]
    assert f'data-history-attempt="{attempt.id}"' in answer["history_row"]
    assert await AuditEvent.objects.filter(action="attempt.start", actor=student_a).acount() == 1
    # The answer comes first, then the attempt's snapshot, read after the socket joined its updates: the attempt
    # changed since the answer (its provisioning ran at once here, tasks being eager), so the page gets it.
    assert of_type(viewer, "attempt.update")[0]["attempt"]["state"] == "starting"
    assert viewer.messages.index(answer) < viewer.messages.index(of_type(viewer, "attempt.update")[0])
    assert of_type(viewer, "attempt.update")[0]["attempt"]["id"] == attempt.id

    # The same socket now hears the attempt's updates as the lifecycle pushes them.
    await sync_to_async(sync_until)(attempt, AttemptState.RUNNING)
    await viewer.read_until(lambda v: any(m["attempt"]["state"] == "running" for m in of_type(v, "attempt.update")))

    # One Start per lab socket: from here it is the attempt's socket, which takes no Start.
    await viewer.send_json({"type": "start"})
    await viewer.read_until(lambda v: of_type(v, "error"))
    assert of_type(viewer, "error")[0]["code"] == "bad_message"
    assert await Attempt.objects.filter(student=student_a).acount() == 1
    await viewer.close()

    # The panel's forms carry a token for the page's own CSRF cookie: its Stop posts with CSRF checks on.
    token = CSRF_TOKEN_INPUT.search(answer["panel"]).group(1)

    def stop(with_token: str) -> int:
        browser = Client(enforce_csrf_checks=True)
        browser.force_login(student_a)
        browser.cookies[settings.CSRF_COOKIE_NAME] = secret
        return browser.post(f"/attempts/{attempt.id}/stop/", {"csrfmiddlewaretoken": with_token},
                            HTTP_ACCEPT="application/json").status_code

    assert await sync_to_async(stop)(token[::-1]) == 403
    assert await sync_to_async(stop)(token) == 200


async def test_json_nested_too_deep_is_a_bad_message_and_the_socket_goes_on(cluster, student_a, lab_a):
    viewer = await open_lab_socket(student_a, lab_a.id)
    await viewer.communicator.send_to(text_data="[" * 100_000)
    await viewer.send_json({"type": "ping"})
    await viewer.read_until(lambda v: of_type(v, "pong"))
    assert of_type(viewer, "error")[0]["code"] == "bad_message"
    await viewer.close()


async def test_an_attempt_unchanged_since_its_answer_is_not_sent_again_and_its_updates_follow(
        lifecycle, student_a, lab_a, monkeypatch):
    from labs.services import attempts
    from labs.services.events import attempt_push_on_commit

    monkeypatch.setattr(attempts, "_enqueue_provision", lambda attempt_id: {})  # no worker picks it up yet
    viewer = await open_lab_socket(student_a, lab_a.id, csrf_secret=new_csrf_secret())
    await viewer.send_json({"type": "start"})
    await viewer.read_until(lambda v: of_type(v, "start.answer"))
    await viewer.drain(1.0)
    # The answer showed the attempt as it still is: no second copy of it.
    assert of_type(viewer, "attempt.update") == []
    # Yet the socket joined the attempt's group: the worker's first update reaches it.
    attempt = await Attempt.objects.aget(student=student_a, lab=lab_a)

    def claimed() -> None:
        Attempt.objects.filter(id=attempt.id).update(state=AttemptState.PROVISIONING, updated_at=timezone.now())
        attempt_push_on_commit(attempt=Attempt.objects.get(id=attempt.id))

    await sync_to_async(claimed)()
    await viewer.read_until(lambda v: of_type(v, "attempt.update"))
    assert [m["attempt"]["state"] for m in of_type(viewer, "attempt.update")] == ["provisioning"]
    await viewer.close()


async def test_refusals_are_answered_on_the_socket_which_stays_open(lifecycle, student_a, lab_a, settings):
    settings.CACHES = fresh_cache_settings()  # the start limit's counters start from nothing
    lab_a.opens_at = timezone.now() + timezone.timedelta(days=2)
    await lab_a.asave(update_fields=["opens_at"])
    viewer = await open_lab_socket(student_a, lab_a.id)
    await viewer.send_json({"type": "start"})
    await viewer.read_until(lambda v: of_type(v, "start.refused"))
    refused = of_type(viewer, "start.refused")[0]
    assert refused["code"] == "lab_closed" and "opens on" in refused["error"]
    assert refused["retry_after"] is None

    # The per-person start limit counts Starts pressed here (the refusal above too, as for the page's HTTP Start and
    # the API's).
    lab_a.opens_at = None
    await lab_a.asave(update_fields=["opens_at"])
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_start": (2, 600)}
    await viewer.send_json({"type": "start"})
    await viewer.read_until(lambda v: of_type(v, "start.answer"))
    attempt = await Attempt.objects.aget(student=student_a, lab=lab_a)
    await viewer.close()

    second = await open_lab_socket(student_a, lab_a.id)
    await second.send_json({"type": "start"})
    await second.read_until(lambda v: of_type(v, "start.refused"))
    limited = of_type(second, "start.refused")[0]
    assert limited["code"] == "rate_limited" and limited["retry_after"] > 0
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_start": (10, 600)}
    await second.send_json({"type": "start"})
    await second.read_until(lambda v: len(of_type(v, "start.refused")) == 2)
    active = of_type(second, "start.refused")[1]
    assert active["code"] == "attempt_active" and active["attempt_id"] == attempt.id  # the page reloads onto it
    await second.send_json({"type": "ping"})
    await second.read_until(lambda v: of_type(v, "pong"))
    await second.close()


async def test_a_busy_database_is_answered_portal_busy_in_the_pages_language(lifecycle, student_a, lab_a,
                                                                             monkeypatch, caplog):
    metrics.counters.clear(metrics.REQUEST_FAILURES_KEY)

    def dry_pool(**kwargs):
        try:
            raise PoolTimeout("couldn't get a connection after 30.00 sec")
        except PoolTimeout as exc:
            raise OperationalError("couldn't get a connection after 30.00 sec") from exc

    monkeypatch.setattr(lab_socket, "attempt_start_limited", dry_pool)
    viewer = await open_lab_socket(student_a, lab_a.id, language="ja")
    with caplog.at_level(logging.ERROR, logger="labs.consumers.lab"):
        await viewer.send_json({"type": "start"})
        await viewer.read_until(lambda v: of_type(v, "start.refused"))
    refused = of_type(viewer, "start.refused")[0]
    assert refused["code"] == "portal_busy"
    assert "混み合って" in refused["error"]
    low, high = BUSY_RETRY_AFTER_RANGE
    assert low <= refused["retry_after"] <= high
    assert metrics.counters.read(metrics.REQUEST_FAILURES_KEY) == {"portal_busy": 1}
    assert any(record.exc_info for record in caplog.records)  # logged with what caused it

    monkeypatch.setattr(lab_socket, "attempt_start_limited", lambda **kwargs: 1 / 0)
    await viewer.send_json({"type": "start"})
    await viewer.read_until(lambda v: len(of_type(v, "start.refused")) == 2)
    failed = of_type(viewer, "start.refused")[1]
    assert failed["code"] == "server_error" and "division" not in failed["error"]
    assert not await Attempt.objects.filter(student=student_a).aexists()
    await viewer.close()
    metrics.counters.clear(metrics.REQUEST_FAILURES_KEY)


@pytest.mark.parametrize("who", ["anonymous", "ta", "other_tenant_student", "bad_origin", "unknown_lab"])
async def test_only_the_labs_students_may_open_it(who, cluster, student_a, ta_a, student_b, lab_a):
    lab_id = 999999 if who == "unknown_lab" else lab_a.id
    user = {"ta": ta_a, "other_tenant_student": student_b}.get(who, student_a)
    headers = [HOST, (b"origin", b"http://evil.example") if who == "bad_origin" else ORIGIN]
    if who != "anonymous":
        headers.append((b"cookie", await sync_to_async(session_cookie)(user)))
    viewer = Viewer(f"/ws/labs/{lab_id}/events/", headers)
    connected, code = await viewer.connect()
    assert not connected
    if who == "bad_origin":
        assert code not in (4401, 4404)  # refused at the gate, before the consumer
    else:
        assert code == (4401 if who == "anonymous" else 4404)
    assert not await Attempt.objects.aexists()
