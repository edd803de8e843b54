"""The lab page's Start obeys the same per-user start limit as the API's; refusals that ask to come back later
(full capacity, many starts at once) are not counted."""

import pytest
from django.core.cache import cache
from django.urls import reverse

from api.tests.world import fresh_cache_settings
from conftest import PASSWORD, make_person
from labs.models import Attempt, AttemptState
from labs.services import attempt_start
from portal.models import Role
from portal.ratelimit import rate_limit_exceeded, rate_limit_hit, rate_limit_refund


@pytest.fixture(autouse=True)
def isolated_cache(settings):
    settings.CACHES = fresh_cache_settings()


@pytest.mark.django_db
def test_start_button_is_refused_past_the_per_user_limit(client, settings, lab_a, student_a):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_start": (2, 600)}
    client.login(username=student_a.username, password=PASSWORD)
    url = reverse("labs:attempt_start", args=[lab_a.id])
    headers = {"HTTP_ACCEPT": "application/json"}

    first = client.post(url, **headers)
    assert first.status_code == 201, first.content
    second = client.post(url, **headers)  # counted, and refused for another reason: one attempt is active
    assert second.status_code == 409
    third = client.post(url, **headers)
    assert third.status_code == 429
    assert int(third["Retry-After"]) > 0
    assert "too many labs" in third.json()["error"]
    assert Attempt.objects.filter(student=student_a).count() == 1


@pytest.mark.django_db
def test_refusals_that_ask_to_come_back_do_not_use_up_the_limit(client, settings, lab_a, student_a):
    """The page retries a full-capacity refusal by itself (static/js/start.js): those tries start nothing, so
    they must not leave the student locked out once capacity frees up."""
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_start": (2, 600)}
    tenant = lab_a.course.tenant
    tenant.max_concurrent_vms = 1  # held by a classmate's lab
    tenant.save(update_fields=["max_concurrent_vms"])
    holder = make_person(username="holder", tenant=tenant, course=lab_a.course, role=Role.STUDENT)
    Attempt.objects.create(lab=lab_a, student=holder, tenant=tenant, state=AttemptState.RUNNING)
    client.login(username=student_a.username, password=PASSWORD)
    url = reverse("labs:attempt_start", args=[lab_a.id])
    headers = {"HTTP_ACCEPT": "application/json"}

    for _try in range(5):
        refused = client.post(url, **headers)
        assert refused.status_code == 503 and refused.json()["code"] == "quota_full"
        assert int(refused["Retry-After"]) > 0

    tenant.max_concurrent_vms = 10
    tenant.save(update_fields=["max_concurrent_vms"])
    settings.ATTEMPT_CONCURRENT_START_LIMIT = 1
    classmate = make_person(username="classmate", tenant=tenant, course=lab_a.course, role=Role.STUDENT)
    other = attempt_start(actor=classmate, lab=lab_a)  # under way: the deployment's start throttle is reached
    for _try in range(3):
        refused = client.post(url, **headers)
        assert refused.status_code == 503 and refused.json()["code"] == "too_many_starts"
    Attempt.objects.filter(id=other.id).update(state="failed")

    assert client.post(url, **headers).status_code == 201  # counted: 1 of 2
    assert client.post(url, **headers).status_code == 409  # refused for good (one attempt is active): 2 of 2
    assert client.post(url, **headers).status_code == 429


def test_a_refund_after_its_window_ended_takes_nothing_from_the_next(settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_start": (1, 600)}
    counted = rate_limit_hit(scope="attempt_start", key="user:refund-test")
    assert rate_limit_exceeded(scope="attempt_start", key="user:refund-test") is not None
    rate_limit_refund(counted)
    assert rate_limit_exceeded(scope="attempt_start", key="user:refund-test") is None
    rate_limit_hit(scope="attempt_start", key="user:refund-test")
    cache.delete(counted)  # the window ended: its counter expired
    rate_limit_refund(counted)
    assert cache.get(counted) is None  # no counter brought back, none below zero


@pytest.mark.django_db
def test_a_start_the_database_was_too_busy_for_does_not_use_up_the_limit(
    client, settings, lab_a, student_a, monkeypatch
):
    """No pooled connection came free in time (answered 503 portal_busy, which the page retries by itself):
    nothing started, so nothing is counted."""
    from portal.tests.test_server_errors import pool_timeout_error

    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_start": (2, 600)}
    client.raise_request_exception = False
    client.login(username=student_a.username, password=PASSWORD)
    url = reverse("labs:attempt_start", args=[lab_a.id])
    headers = {"HTTP_ACCEPT": "application/json"}

    def busy(**kwargs):
        raise pool_timeout_error()

    monkeypatch.setattr("labs.services.start.attempt_start", busy)
    for _try in range(4):
        refused = client.post(url, **headers)
        assert refused.status_code == 503 and refused.json()["code"] == "portal_busy"
    monkeypatch.undo()
    assert client.post(url, **headers).status_code == 201  # counted: 1 of 2
    assert client.post(url, **headers).status_code == 409  # 2 of 2
    assert client.post(url, **headers).status_code == 429
