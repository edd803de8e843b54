"""Signing in to the API (session or token) and the error format for protocol-level refusals (the login throttle
on the sign-in pages and the token endpoint: portal/tests/test_login_throttle.py)."""

from __future__ import annotations

import pytest
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
        assert response.json() == {"error": {"code": "authentication_failed", "message": "Wrong username or password."}}
    assert not Token.objects.exists()


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
