"""Signing in to the API (session or token), the login guard on the sign-in page and the token endpoint, and the
error format for protocol-level refusals."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_token_obtain_use_and_revoke(student_a):
    client = APIClient()
    response = client.post("/api/v1/auth/token/", {"username": "student_a", "password": PASSWORD}, format="json")
    assert response.status_code == 200, response.content
    token = response.json()["token"]
    assert Token.objects.get(user=student_a).key == token
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/me/").json()["username"] == "student_a"
    assert client.delete("/api/v1/me/token/").status_code == 204
    assert client.get("/api/v1/me/").status_code == 401


def test_wrong_password_is_refused_without_saying_which_part_was_wrong(student_a):
    client = APIClient()
    for username in ("student_a", "nobody-by-this-name"):
        response = client.post("/api/v1/auth/token/", {"username": username, "password": "wrong"}, format="json")
        assert response.status_code == 400
        assert response.json() == {"error": {"code": "authentication_failed",
                                             "message": "Wrong username or password."}}
    assert not Token.objects.exists()


def test_token_endpoint_locks_a_username_after_repeated_failures(student_a, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_username": (3, 900)}
    client = APIClient()
    for _ in range(3):
        client.post("/api/v1/auth/token/", {"username": "student_a", "password": "guess"}, format="json")
    # Even the right password is refused now: the limit stops guessing, not just wrong guesses.
    response = client.post("/api/v1/auth/token/", {"username": "Student_A", "password": PASSWORD}, format="json")
    assert response.status_code == 429
    assert 0 < int(response["Retry-After"]) <= 900
    assert response.json()["error"]["code"] == "rate_limited"
    assert not Token.objects.exists()


def test_sign_in_page_is_throttled_per_username(student_a, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_username": (3, 900)}
    client = Client()
    for _ in range(3):
        response = client.post("/accounts/login/", {"username": "student_a", "password": "guess"})
        assert response.status_code == 200  # the form again, with its error
    refused = client.post("/accounts/login/", {"username": "student_a", "password": PASSWORD})
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 900
    assert "Too many failed sign-in attempts" in refused.content.decode()
    assert "_auth_user_id" not in client.session
    # Other people can still sign in from elsewhere.
    other = Client(REMOTE_ADDR="198.51.100.7")
    assert other.post("/accounts/login/", {"username": "student_a", "password": PASSWORD}).status_code == 429


def test_sign_in_page_is_throttled_per_address(student_a, ta_a, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_address": (2, 900)}
    client = Client(REMOTE_ADDR="203.0.113.9")
    client.post("/accounts/login/", {"username": "someone", "password": "guess"})
    client.post("/accounts/login/", {"username": "someone-else", "password": "guess"})
    assert client.post("/accounts/login/", {"username": "ta_a", "password": PASSWORD}).status_code == 429
    elsewhere = Client(REMOTE_ADDR="203.0.113.10")
    assert elsewhere.post("/accounts/login/", {"username": "ta_a", "password": PASSWORD}).status_code == 302


def test_admin_sign_in_page_counts_and_refuses_alike(instructor_b, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_username": (2, 900)}
    client = Client()
    client.post("/admin/login/", {"username": "instructor_b", "password": "guess"})
    client.post("/accounts/login/", {"username": "instructor_b", "password": "guess"})
    refused = client.post("/admin/login/", {"username": "instructor_b", "password": PASSWORD})
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0


def test_a_successful_sign_in_clears_that_usernames_failures(student_a, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_username": (3, 900)}
    client = Client()
    for _ in range(2):
        client.post("/accounts/login/", {"username": "student_a", "password": "guess"})
    assert client.post("/accounts/login/", {"username": "student_a", "password": PASSWORD}).status_code == 302
    client.logout()
    for _ in range(2):
        client.post("/accounts/login/", {"username": "student_a", "password": "guess"})
    assert client.post("/accounts/login/", {"username": "student_a", "password": PASSWORD}).status_code == 302


def test_session_authentication_needs_the_csrf_token_for_writes(lab_a, student_a):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(student_a)
    assert client.get("/api/v1/me/").status_code == 200
    response = client.post("/api/v1/attempts/", {"lab": lab_a.id}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]["message"]


def test_protocol_refusals_use_the_error_format(student_a):
    client = APIClient()
    client.force_authenticate(student_a)
    response = client.delete("/api/v1/courses/")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    response = client.post("/api/v1/attempts/", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"
