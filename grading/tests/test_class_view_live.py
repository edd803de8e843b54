"""The class view's socket: the table pushed on connect and again after a student's Check or attempt changes,
coalesced, with the same queries for a class of any size, and only to staff of the lab's course."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from conftest import make_person
from grading import class_view_consumer
from grading.class_view_consumer import class_view_html
from grading.models import GradingRun
from grading.services.runs import push_run_on_commit
from grading.tests.builders import ALL_PASS, FIRST_ONLY, NONE_PASS, make_attempt, record_run
from labs.models import AttemptState
from labs.services.events import attempt_push_on_commit
from ops.asgi import application
from portal.models import Role

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def open_class_view(user, lab_id: int) -> tuple[WebsocketCommunicator, bool, int | None]:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    headers.append((b"cookie", await sync_to_async(cookie_for)(user)))
    communicator = WebsocketCommunicator(application, f"/ws/labs/{lab_id}/class/", headers=headers)
    connected, code = await communicator.connect(timeout=30)
    return communicator, connected, code


async def next_table(communicator, *, within: float = 30.0) -> str:
    message = json.loads(await communicator.receive_from(timeout=within))
    assert message["type"] == "class.view"
    return message["html"]


def run_pushed(attempt, outputs) -> None:
    with transaction.atomic():
        record_run(attempt=attempt, outputs=outputs)
        push_run_on_commit(run=GradingRun.objects.filter(attempt=attempt).latest("id"))


async def test_the_table_is_pushed_on_connect_and_after_a_check(ta_a, student_a, lab_a, settings):
    attempt = await sync_to_async(make_attempt)(lab=lab_a, student=student_a)
    communicator, connected, _ = await open_class_view(ta_a, lab_a.id)
    assert connected
    first = await next_table(communicator)
    assert f'data-attempt="{attempt.id}"' in first and "not checked yet" in first
    await sync_to_async(run_pushed)(attempt, FIRST_ONLY)
    second = await next_table(communicator)
    assert "1 / 3" in second and "not checked yet" not in second
    await communicator.disconnect()


async def test_an_attempt_that_ends_is_pushed_too(ta_a, student_a, lab_a):
    attempt = await sync_to_async(make_attempt)(lab=lab_a, student=student_a)
    communicator, connected, _ = await open_class_view(ta_a, lab_a.id)
    assert connected
    await next_table(communicator)

    def stop() -> None:
        with transaction.atomic():
            type(attempt).objects.filter(pk=attempt.pk).update(state=AttemptState.STOPPED)
            attempt.refresh_from_db()
            attempt_push_on_commit(attempt=attempt)

    await sync_to_async(stop)()
    table = await next_table(communicator)
    assert f'data-attempt="{attempt.id}"' not in table  # the class view lists attempts in progress
    await communicator.disconnect()


async def test_a_class_changing_together_costs_one_rendering(ta_a, student_a, lab_a, monkeypatch):
    renders = []
    render = class_view_consumer._render

    async def counted(**kwargs):
        renders.append(time.monotonic())
        return await render(**kwargs)

    monkeypatch.setattr(class_view_consumer, "_render", counted)
    # "Together" is within one refresh period; a longer one than the page's keeps the thirty changes together
    # when a loaded machine delivers them slowly.
    monkeypatch.setattr(class_view_consumer, "CLASS_REFRESH_SECONDS", 3.0)
    communicator, connected, _ = await open_class_view(ta_a, lab_a.id)
    assert connected
    await next_table(communicator)
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    await asyncio.gather(*(layer.group_send(f"class-{lab_a.id}", {"type": "class.changed"}) for _ in range(30)))
    await next_table(communicator)
    await asyncio.sleep(class_view_consumer.CLASS_REFRESH_SECONDS + 0.5)  # a second rendering would come by now
    assert await communicator.receive_nothing(timeout=0.2)
    assert len(renders) == 2  # on connect, then once for the thirty changes
    await communicator.disconnect()


@pytest.mark.parametrize("who", ["student_a", "instructor_b"])
async def test_students_and_other_tenants_are_refused(who, lab_a, student_a, instructor_b):
    user = {"student_a": student_a, "instructor_b": instructor_b}[who]
    communicator, connected, code = await open_class_view(user, lab_a.id)
    assert not connected and code == 4404


def test_each_rendering_costs_the_same_queries_for_a_bigger_class(ta_a, lab_a, course_a):
    def add_students(prefix: str, count: int) -> None:
        for n in range(count):
            student = make_person(username=f"{prefix}{n}", tenant=course_a.tenant, course=course_a, role=Role.STUDENT)
            attempt = make_attempt(lab=lab_a, student=student)
            record_run(attempt=attempt, outputs=NONE_PASS)
            record_run(attempt=attempt, outputs=ALL_PASS)

    add_students("a", 2)
    with CaptureQueriesContext(connection) as small:
        class_view_html(user=ta_a, lab_id=lab_a.id, language="en")
    add_students("b", 6)
    with CaptureQueriesContext(connection) as big:
        html = class_view_html(user=ta_a, lab_id=lab_a.id, language="en")
    assert html.count("<tr data-attempt=") == 8
    assert len(big) == len(small)
