"""Stop when left: a lab may stop an attempt once no page of its student has had it open for a while
(``Lab.idle_stop_minutes``); the student's events socket stamps the attempt as seen while it is open."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from labs import tasks
from labs.consumers import events
from labs.models import Attempt, AttemptState, Lab
from labs.services import attempt_start, stopping, tracking
from labs.services.stopping import attempt_seen
from labs.tests.conftest import sync_until, vm_names, wait_until
from labs.tests.test_consumers import HOST, ORIGIN, session_cookie
from ops.asgi import application

pytestmark = pytest.mark.django_db


def running(student, lab, *, ready_minutes_ago: float, seen_minutes_ago: float | None = None) -> Attempt:
    """A running attempt row (no cluster): its agent answered, and a page last had it open, that long ago."""
    now = timezone.now()
    return Attempt.objects.create(
        lab=lab,
        student=student,
        tenant=lab.course.tenant,
        state=AttemptState.RUNNING,
        agent_ready_at=now - timedelta(minutes=ready_minutes_ago),
        expires_at=now + timedelta(hours=1),
        last_seen_at=None if seen_minutes_ago is None else now - timedelta(minutes=seen_minutes_ago),
    )


def leaves_after(lab: Lab, minutes: int) -> Lab:
    Lab.objects.filter(pk=lab.pk).update(idle_stop_minutes=minutes)
    lab.refresh_from_db()
    return lab


def test_the_limit_is_at_least_five_minutes_or_never(lab_a):
    for allowed in (0, 5, 90):
        lab_a.idle_stop_minutes = allowed
        lab_a.full_clean()
    for refused in (1, 4):
        lab_a.idle_stop_minutes = refused
        with pytest.raises(ValidationError) as info:
            lab_a.full_clean()
        assert "At least 5 minutes" in info.value.message_dict["idle_stop_minutes"][0]


def test_an_attempt_nobody_had_open_for_the_labs_limit_is_stopped_and_the_rest_are_not(
    student_a, lab_a, course_a, django_capture_on_commit_callbacks, monkeypatch
):
    from conftest import make_lab, make_person
    from portal.models import Role

    queued: list[int] = []
    monkeypatch.setattr(tasks.teardown_attempt, "delay", queued.append)
    leaves_after(lab_a, 20)
    left = running(student_a, lab_a, ready_minutes_ago=40, seen_minutes_ago=21)

    def other(username: str, **kwargs) -> Attempt:
        person = make_person(username=username, tenant=course_a.tenant, course=course_a, role=Role.STUDENT)
        return running(person, kwargs.pop("lab", lab_a), **kwargs)

    seen_lately = other("seen-lately", ready_minutes_ago=40, seen_minutes_ago=19)
    # A page saw it starting, 30 minutes ago, but it has been ready to work in for 10: counted from then.
    ready_lately = other("ready-lately", ready_minutes_ago=10, seen_minutes_ago=30)
    # Started through the API and never opened: counted from when its agent answered.
    never_opened = other("never-opened", ready_minutes_ago=25)
    keeps = make_lab(course_a, title="Keeps running")  # idle_stop_minutes 0: never
    kept = other("other-lab", lab=keeps, ready_minutes_ago=300, seen_minutes_ago=299)

    with django_capture_on_commit_callbacks(execute=True):
        assert stopping.attempts_stop_left() == 2
    states = dict(Attempt.objects.values_list("id", "state"))
    assert states[left.id] == states[never_opened.id] == AttemptState.STOPPING
    assert states[seen_lately.id] == states[ready_lately.id] == states[kept.id] == AttemptState.RUNNING
    left.refresh_from_db()
    assert left.stop_reason == "left" and left.stopping_at is not None
    assert sorted(queued) == sorted([left.id, never_opened.id])  # their teardown grades once more, deletes the VM

    with django_capture_on_commit_callbacks(execute=True):
        assert stopping.attempts_stop_left() == 0  # nothing twice


def test_a_stamp_that_lands_after_the_candidates_were_read_keeps_the_attempt(student_a, lab_a, monkeypatch):
    from labs.services import stopping

    leaves_after(lab_a, 20)
    attempt = running(student_a, lab_a, ready_minutes_ago=40, seen_minutes_ago=25)
    real = stopping.attempt_stop_left

    def page_reopened_first(**kwargs):
        attempt_seen(attempt_id=attempt.id)  # the student's page came back between the read and the lock
        return real(**kwargs)

    monkeypatch.setattr(stopping, "attempt_stop_left", page_reopened_first)
    assert stopping.attempts_stop_left() == 0
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING


def test_the_sync_pass_stops_left_attempts(student_a, lab_a, monkeypatch):
    monkeypatch.setattr(tasks.teardown_attempt, "delay", lambda attempt_id: None)
    monkeypatch.setattr(tracking, "namespaces_due", lambda now=None: [])
    leaves_after(lab_a, 5)
    running(student_a, lab_a, ready_minutes_ago=30, seen_minutes_ago=6)
    assert tasks.sync_attempts()["left"] == 1


def test_seen_stamps_only_attempts_still_active(student_a, lab_a):
    attempt = running(student_a, lab_a, ready_minutes_ago=10)
    assert attempt_seen(attempt_id=attempt.id)
    attempt.refresh_from_db()
    assert timezone.now() - attempt.last_seen_at < timedelta(seconds=5)
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.STOPPED, last_seen_at=None)
    assert not attempt_seen(attempt_id=attempt.id)
    attempt.refresh_from_db()
    assert attempt.last_seen_at is None


def test_a_stopped_as_left_attempt_is_graded_once_more_and_its_vm_deleted(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    leaves_after(lab_a, 5)
    with django_capture_on_commit_callbacks(execute=True):
        attempt = attempt_start(actor=student_a, lab=lab_a)
    sync_until(attempt, AttemptState.RUNNING)
    Attempt.objects.filter(pk=attempt.pk).update(agent_ready_at=timezone.now() - timedelta(minutes=6))
    with django_capture_on_commit_callbacks(execute=True):
        assert stopping.attempts_stop_left() == 1
    sync_until(attempt, AttemptState.STOPPED)  # stopped, not expired: its time was not up
    assert attempt.stop_reason == "left"
    wait_until(lambda: vm_names(attempt.namespace) == [], what="the VM to be gone")
    assert attempt.runs.filter(trigger="stop").count() == 1

    # The lab page says what happened, in the attempt's history.
    page = Client()
    page.force_login(student_a)
    html = page.get(reverse("labs:lab_detail", args=[lab_a.pk])).content.decode()
    assert "no page had it open" in html


def test_the_lab_page_and_the_api_tell_students_the_rule(student_a, lab_a):
    client = Client()
    client.force_login(student_a)
    url = reverse("labs:lab_detail", args=[lab_a.pk])
    assert 'id="idle-stop"' not in client.get(url).content.decode()
    assert client.get(reverse("api:lab-detail", args=[lab_a.pk])).json()["idle_stop_minutes"] == 0
    leaves_after(lab_a, 20)
    html = client.get(url).content.decode()
    assert "The lab stops 20 minutes after you close its last page" in html
    assert client.get(reverse("api:lab-detail", args=[lab_a.pk])).json()["idle_stop_minutes"] == 20


def test_instructors_set_the_limit_in_admin(instructor_a, lab_a):
    client = Client()
    client.force_login(instructor_a)
    url = reverse("admin:labs_lab_change", args=[lab_a.pk])
    form = client.get(url)
    assert form.status_code == 200 and 'name="idle_stop_minutes"' in form.content.decode()
    data = {
        "course": lab_a.course_id,
        "title": lab_a.title,
        "instructions": lab_a.instructions,
        "image": lab_a.image,
        "size": lab_a.size,
        "time_limit_minutes": lab_a.time_limit_minutes,
        "late_penalty_percent_per_day": "0",
        "attempt_limit": 0,
        "grade_policy": lab_a.grade_policy,
        "extra_cloud_init": "",
        "checks-TOTAL_FORMS": 0,
        "checks-INITIAL_FORMS": 0,
        "checks-MIN_NUM_FORMS": 0,
        "checks-MAX_NUM_FORMS": 1000,
    }
    refused = client.post(url, {**data, "idle_stop_minutes": 3})
    assert refused.status_code == 200 and "At least 5 minutes" in refused.content.decode()
    lab_a.refresh_from_db()
    assert lab_a.idle_stop_minutes == 0
    assert client.post(url, {**data, "idle_stop_minutes": 20}).status_code == 302
    lab_a.refresh_from_db()
    assert lab_a.idle_stop_minutes == 20


# ---- the events socket's stamps ------------------------------------------------------------------------------


async def open_events(user, attempt_id: int) -> WebsocketCommunicator:
    cookie = await sync_to_async(session_cookie)(user)
    communicator = WebsocketCommunicator(
        application, f"/ws/attempts/{attempt_id}/events/", headers=[ORIGIN, HOST, (b"cookie", cookie)]
    )
    connected, _code = await communicator.connect(timeout=10)
    assert connected
    await communicator.receive_json_from(timeout=10)  # the snapshot
    return communicator


async def last_seen(attempt_id: int):
    return await sync_to_async(lambda: Attempt.objects.get(pk=attempt_id).last_seen_at)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_the_students_open_page_stamps_the_attempt_and_a_tas_does_not(student_a, ta_a, lab_a, settings, monkeypatch):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    monkeypatch.setattr(events, "PRESENCE_STAMP_SECONDS", 0.2)
    leaves_after(lab_a, 20)
    attempt = running(student_a, lab_a, ready_minutes_ago=10)

    async def scenario() -> None:
        # Course staff watching do not keep the student's VM alive.
        ta = await open_events(ta_a, attempt.id)
        await asyncio.sleep(0.5)
        assert await last_seen(attempt.id) is None
        await ta.disconnect()
        assert await last_seen(attempt.id) is None

        page = await open_events(student_a, attempt.id)
        opened = await last_seen(attempt.id)
        assert opened is not None  # stamped by the handshake
        # And again while the page stays open (every 0.2 s; a loaded host may take longer, never for good).
        deadline = asyncio.get_running_loop().time() + 10
        while (while_open := await last_seen(attempt.id)) == opened:
            assert asyncio.get_running_loop().time() < deadline, "not stamped again while the page stays open"
            await asyncio.sleep(0.05)
        assert while_open > opened
        await page.disconnect()
        closed = await last_seen(attempt.id)
        assert closed > while_open  # and as it closes
        await asyncio.sleep(0.5)
        assert await last_seen(attempt.id) == closed  # nothing once closed

    asyncio.run(scenario())


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_lab_that_never_stops_attempts_costs_its_sockets_no_stamps(student_a, lab_a, settings, monkeypatch):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    monkeypatch.setattr(events, "PRESENCE_STAMP_SECONDS", 0.1)
    attempt = running(student_a, lab_a, ready_minutes_ago=10)

    async def scenario() -> None:
        page = await open_events(student_a, attempt.id)
        await asyncio.sleep(0.4)
        await page.disconnect()
        assert await last_seen(attempt.id) is None

    asyncio.run(scenario())


def test_the_handshake_reads_the_labs_rule_with_the_attempt(student_a, lab_a, django_assert_num_queries):
    attempt = running(student_a, lab_a, ready_minutes_ago=10)
    # The attempt (with its lab's rule), then its latest grading run: nothing more for a lab that never stops.
    with django_assert_num_queries(2):
        _messages, stamps_presence = events.attempt_events_handshake(
            user=student_a, attempt_id=attempt.id, language="en"
        )
    assert not stamps_presence
    leaves_after(lab_a, 20)
    with django_assert_num_queries(3):  # and the stamp where it does
        _messages, stamps_presence = events.attempt_events_handshake(
            user=student_a, attempt_id=attempt.id, language="en"
        )
    assert stamps_presence


# -- the warning on other pages -----------------------------------------------------------------------------------


def test_when_a_left_attempt_stops_is_known_only_while_no_page_has_it_open(student_a, lab_a):
    from labs.services.stopping import PRESENCE_LOST_AFTER_SECONDS, attempt_stops_as_left_at

    now = timezone.now()
    left = running(student_a, leaves_after(lab_a, 10), ready_minutes_ago=30, seen_minutes_ago=4)
    assert attempt_stops_as_left_at(left, idle_stop_minutes=10, now=now) == left.last_seen_at + timedelta(minutes=10)
    assert attempt_stops_as_left_at(left, idle_stop_minutes=0, now=now) is None  # the lab never stops for that
    open_now = left.last_seen_at + timedelta(seconds=PRESENCE_LOST_AFTER_SECONDS - 1)
    assert attempt_stops_as_left_at(left, idle_stop_minutes=10, now=open_now) is None  # its page stamps it still
    left.last_seen_at, left.agent_ready_at = None, now - timedelta(minutes=3)  # no page ever: from when ready
    assert attempt_stops_as_left_at(left, idle_stop_minutes=10, now=now) == now + timedelta(minutes=7)
    left.state = AttemptState.STOPPING
    assert attempt_stops_as_left_at(left, idle_stop_minutes=10, now=now) is None


def test_the_dashboard_warns_of_a_stop_when_left_in_the_students_clock(student_a, lab_a):
    import re

    from portal.timezones import person_time_zone

    student_a.tenant.time_zone = "Asia/Tokyo"
    student_a.tenant.save(update_fields=["time_zone"])
    lab = leaves_after(lab_a, 10)
    attempt = running(student_a, lab, ready_minutes_ago=30, seen_minutes_ago=4)
    client = Client()
    client.force_login(student_a)
    html = client.get(reverse("dashboard")).content.decode()
    warning = re.search(r'<p class="stop-warning" data-stops-as-left>(.*?)</p>', html, re.S)
    assert warning is not None, html
    stops_at = timezone.localtime(
        attempt.last_seen_at + timedelta(minutes=10), person_time_zone(student_a, student_a.tenant)
    )
    assert stops_at.utcoffset() == timedelta(hours=9)
    assert "No page has this lab open" in warning.group(1)
    assert f'datetime="{stops_at.isoformat()}"' in warning.group(1)
    assert f"{stops_at:%H:%M}" in warning.group(1) or f"{stops_at:%-I:%M}" in warning.group(1)
    japanese = client.get(reverse("dashboard"), HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert "このラボを開いているページがありません" in japanese

    Attempt.objects.filter(pk=attempt.pk).update(last_seen_at=timezone.now())  # its page is open again
    assert "data-stops-as-left" not in client.get(reverse("dashboard")).content.decode()
    leaves_after(lab, 0)
    Attempt.objects.filter(pk=attempt.pk).update(last_seen_at=timezone.now() - timedelta(minutes=30))
    assert "data-stops-as-left" not in client.get(reverse("dashboard")).content.decode()
