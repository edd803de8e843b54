"""The broker down while students press Start or Check, a provisioning message lost, and rolled-back
transactions: a clear error or a later success, never an attempt left in ``requested`` or a run left queued, and
nothing enqueued for work that was rolled back."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.test import Client

from grading.models import GradingRun, RunState
from grading.services import grading_run_request
from labs import tasks
from labs.models import Attempt, AttemptState
from labs.services import attempt_start, attempt_stop, sweeping
from labs.tests.reliability import (
    clock_fixture,
    cluster_fixture,
    drive_to,
    flush_redis,
    kubesim_fixture,
    make_course,
    make_lab,
    make_students,
    make_tenant,
    queued_messages,
    vm_names,
)

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

START_URL = "/api/v1/attempts/"


kubesim = kubesim_fixture("broker")
cluster = cluster_fixture(GRADING_MIN_INTERVAL_SECONDS=0)
clock = clock_fixture()


@pytest.fixture
def lab(cluster):
    return make_lab(make_course(make_tenant("Broker University")))


def _fresh_producers() -> None:
    from portal.celery import app

    app._pool = None
    app.amqp._producer_pool = None


@contextlib.contextmanager
def broker_at(url: str) -> Iterator[None]:
    """This process publishes its tasks to ``url`` for the duration (what the web process sees of an outage)."""
    from portal.celery import app

    saved = app.conf.broker_url
    app.conf.broker_url = url
    _fresh_producers()
    try:
        yield
    finally:
        app.conf.broker_url = saved
        _fresh_producers()


@contextlib.contextmanager
def broker_refusing() -> Iterator[None]:
    """Nothing listens on the broker's port: connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with broker_at(f"redis://127.0.0.1:{port}/0"):
        yield


@contextlib.contextmanager
def broker_hanging() -> Iterator[None]:
    """The broker's port accepts TCP connections and never answers (a hung Redis, a half-open network path)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        with broker_at(f"redis://127.0.0.1:{listener.getsockname()[1]}/0"):
            yield


def queued_tasks() -> list[tuple[str, str]]:
    """(task name, argsrepr) of every message waiting in the default queue of this run's Redis."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        raw = client.lrange(settings.REDIS_KEY_PREFIX + "celery", 0, -1)
    finally:
        client.close()
    messages = [json.loads(item) for item in raw]
    return [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in messages]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_start_with_the_broker_refusing_is_a_clear_error_and_a_later_start_succeeds(lab):
    (student,) = make_students(lab.course, 1)
    browser = logged_in(student)
    with broker_refusing():
        started = time.monotonic()
        response = browser.post(START_URL, {"lab": lab.id}, content_type="application/json")
        took = time.monotonic() - started
    assert response.status_code == 503, response.content
    body = response.json()
    assert "try again" in json.dumps(body).lower()
    assert int(response["Retry-After"]) > 0
    # The publishes give up after their few quick retries (a second or two); a publish retried without end never
    # answers. 20 s leaves a loaded host room.
    assert took < 20, took
    # The attempt the press made is over, with the reason in words; it does not count against the attempt limit.
    (attempt,) = Attempt.objects.filter(student=student)
    assert attempt.state == AttemptState.FAILED
    assert "could not be queued" in attempt.failure_reason
    assert not Attempt.objects.filter(state=AttemptState.REQUESTED).exists()

    # The broker is back: the next press is accepted and its provisioning waits in the queue.
    response = browser.post(START_URL, {"lab": lab.id}, content_type="application/json")
    assert response.status_code == 201, response.content
    again = Attempt.objects.get(pk=response.json()["id"])
    assert ("labs.tasks.provision_attempt", f"({again.id},)") in queued_tasks()
    assert tasks.provision_attempt(again.id) == "created"  # what the worker does with that message
    drive_to(again, AttemptState.RUNNING)


def test_start_with_a_hung_broker_answers_after_one_publish_timeout(lab, monkeypatch):
    (student,) = make_students(lab.course, 1)
    teardowns: list[tuple] = []
    monkeypatch.setattr(tasks.teardown_attempt, "delay", lambda *args: teardowns.append(args))
    with broker_hanging():
        started = time.monotonic()
        response = logged_in(student).post(START_URL, {"lab": lab.id}, content_type="application/json")
        took = time.monotonic() - started
    assert response.status_code == 503, response.content
    assert Attempt.objects.get(student=student).state == AttemptState.FAILED
    # The provisioning's publish gives up at the broker's 5 s socket timeout (without it the request would hang for
    # good); the attempt made nothing on the cluster, so no teardown is published to wait on the same broker again.
    assert teardowns == []
    assert took < 9.5, took


def test_check_with_the_broker_down_is_a_clear_error_and_does_not_block_the_next_check(lab):
    (student,) = make_students(lab.course, 1)
    attempt = attempt_start(actor=student, lab=lab)
    tasks.provision_attempt(attempt.id)
    drive_to(attempt, AttemptState.RUNNING)
    browser = logged_in(student)
    check_url = f"/api/v1/attempts/{attempt.id}/check/"

    with broker_refusing():
        response = browser.post(check_url)
    assert response.status_code == 503, response.content
    assert "try again" in json.dumps(response.json()).lower()
    run = GradingRun.objects.get(attempt=attempt)
    assert run.state == RunState.ERROR and run.error_code == "queue_unavailable"

    response = browser.post(check_url)
    assert response.status_code == 202, response.content
    assert GradingRun.objects.get(attempt=attempt, state=RunState.QUEUED).id == response.json()["id"]


def test_a_lost_provisioning_message_is_queued_again_and_a_start_never_served_fails(lab, clock):
    (first, second) = make_students(lab.course, 2)
    lost = attempt_start(actor=first, lab=lab)
    flush_redis()  # the broker lost its messages (restarted without persistence)
    assert queued_tasks() == []

    # Within the redelivery delay nothing happens; past it, the sweep queues the provisioning again.
    report = sweeping.attempts_sweep()
    assert report.requeued == []
    clock.advance(seconds=sweeping.provision_redelivery_seconds() + 1)
    report = sweeping.attempts_sweep()
    assert report.requeued == [lost.id]
    assert ("labs.tasks.provision_attempt", f"({lost.id},)") in queued_tasks()
    assert tasks.provision_attempt(lost.id) == "created"
    assert vm_names(lost.namespace) == [lost.vm_name]

    # A start whose provisioning never runs (its messages keep getting lost, or the queue stays unreachable) does
    # not stay "requested": past the start timeout it fails, saying why, and frees its quota.
    stuck = attempt_start(actor=second, lab=lab)
    flush_redis()
    clock.advance(seconds=settings.ATTEMPT_START_TIMEOUT_SECONDS + 1)
    with broker_refusing():
        report = sweeping.attempts_sweep()
    stuck.refresh_from_db()
    assert stuck.state == AttemptState.FAILED
    assert "did not start" in stuck.failure_reason


def test_a_rolled_back_transaction_enqueues_nothing(lab):
    (student, other) = make_students(lab.course, 2)
    running = attempt_start(actor=other, lab=lab)
    tasks.provision_attempt(running.id)
    drive_to(running, AttemptState.RUNNING)
    flush_redis()

    class Abandoned(Exception):
        pass

    with pytest.raises(Abandoned), transaction.atomic():
        attempt_start(actor=student, lab=lab)
        raise Abandoned
    with pytest.raises(Abandoned), transaction.atomic():
        grading_run_request(actor=other, attempt=running)
        raise Abandoned
    with pytest.raises(Abandoned), transaction.atomic():
        attempt_stop(actor=other, attempt=running)
        raise Abandoned

    assert queued_messages() == 0
    assert not Attempt.objects.filter(student=student).exists()
    assert not GradingRun.objects.filter(attempt=running).exists()
    running.refresh_from_db()
    assert running.state == AttemptState.RUNNING
    assert vm_names(running.namespace) == [running.vm_name]
