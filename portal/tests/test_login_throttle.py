"""The login throttle (``portal.ratelimit``) on the sign-in page, the admin's and the API's token endpoint:
failures delay further tries for that account from that address, more with every failure; the right password from
another address still goes through, so nobody can lock someone else out; each address keeps its own limit."""

from __future__ import annotations

import copy
import uuid

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conftest import PASSWORD
from portal import ratelimit as login_throttle

pytestmark = pytest.mark.django_db
ATTACKER, CLASSROOM = "203.0.113.66", "198.51.100.7"


@pytest.fixture(autouse=True)
def throttle_settings(settings, monkeypatch):
    """A cache of this test's own (no counters from another test), a clock the test moves, small figures."""
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["KEY_PREFIX"] = f"test-{uuid.uuid4().hex}"
    settings.CACHES = caches
    settings.LOGIN_FAILURES_BEFORE_DELAY = 3
    settings.LOGIN_DELAY_SECONDS = 10
    settings.LOGIN_DELAY_MAX_SECONDS = 60
    now = [1_000_000.0]
    monkeypatch.setattr(login_throttle, "clock", lambda: now[0])
    return now


def sign_in(address: str, username: str, password: str):
    return Client(REMOTE_ADDR=address).post("/accounts/login/", {"username": username, "password": password})


def test_failures_past_the_free_ones_delay_that_account_from_that_address_more_each_time(
    instructor_a, throttle_settings
):
    now = throttle_settings
    for _ in range(3):
        assert sign_in(ATTACKER, "instructor_a", "guess").status_code == 200  # the form again, with its error
    refused = sign_in(ATTACKER, "instructor_a", PASSWORD)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) == 10
    assert "Too many failed sign-in attempts" in refused.content.decode()
    now[0] += 10
    assert sign_in(ATTACKER, "instructor_a", "guess").status_code == 200  # the fourth failure: 20 s now
    assert int(sign_in(ATTACKER, "instructor_a", "guess")["Retry-After"]) == 20
    now[0] += 20
    sign_in(ATTACKER, "instructor_a", "guess")
    now[0] += 40
    sign_in(ATTACKER, "instructor_a", "guess")
    assert int(sign_in(ATTACKER, "instructor_a", "guess")["Retry-After"]) == 60  # at most the maximum


def test_nobody_can_lock_an_account_out_from_another_address(instructor_a):
    for _ in range(10):
        sign_in(ATTACKER, "instructor_a", "guess")
    assert sign_in(ATTACKER, "instructor_a", PASSWORD).status_code == 429
    # The instructor, in class, before the lesson.
    assert sign_in(CLASSROOM, "instructor_a", PASSWORD).status_code == 302
    api = APIClient(REMOTE_ADDR=CLASSROOM).post(
        "/api/v1/auth/token/", {"username": "instructor_a", "password": PASSWORD}, format="json"
    )
    assert api.status_code == 200


def test_the_token_endpoint_counts_and_refuses_alike(student_a):
    client = APIClient(REMOTE_ADDR=ATTACKER)
    for _ in range(3):
        response = client.post("/api/v1/auth/token/", {"username": "student_a", "password": "guess"}, format="json")
        assert response.status_code == 400
    # The same account by another spelling of its username, the right password: still delayed.
    response = client.post("/api/v1/auth/token/", {"username": "Student_A", "password": PASSWORD}, format="json")
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited"
    assert 0 < int(response["Retry-After"]) <= 10
    assert not Token.objects.exists()


def test_the_admin_sign_in_page_shares_the_count(instructor_b):
    client = Client(REMOTE_ADDR=ATTACKER)
    client.post("/admin/login/", {"username": "instructor_b", "password": "guess"})
    client.post("/accounts/login/", {"username": "instructor_b", "password": "guess"})
    client.post("/admin/login/", {"username": "instructor_b", "password": "guess"})
    refused = client.post("/admin/login/", {"username": "instructor_b", "password": PASSWORD})
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0


def test_each_address_keeps_a_limit_across_accounts(student_a, ta_a, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_address": (2, 900)}
    sign_in(ATTACKER, "someone", "guess")
    sign_in(ATTACKER, "someone-else", "guess")
    assert sign_in(ATTACKER, "ta_a", PASSWORD).status_code == 429
    assert sign_in(CLASSROOM, "ta_a", PASSWORD).status_code == 302


def test_a_successful_sign_in_forgets_that_addresses_failures(student_a):
    for _ in range(2):
        sign_in(CLASSROOM, "student_a", "guess")
    assert sign_in(CLASSROOM, "student_a", PASSWORD).status_code == 302
    for _ in range(2):
        sign_in(CLASSROOM, "student_a", "guess")
    assert sign_in(CLASSROOM, "student_a", PASSWORD).status_code == 302


def test_the_delay_doubles_up_to_its_maximum():
    assert [login_throttle.login_delay(n) for n in range(1, 9)] == [0, 0, 10, 20, 40, 60, 60, 60]
    assert login_throttle.login_delay(10_000) == 60
