"""A page someone may not open, one that is not there, or a form sent from a stale page says why and what to do, in
the portal's own page (not a bare 403 or 404); the API and the pages' scripts get the same in JSON."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from labs.models import Attempt

pytestmark = pytest.mark.django_db


def test_an_instructor_refused_the_tenants_is_told_who_sets_quotas(client, instructor_a):
    client.force_login(instructor_a)
    response = client.get("/admin/portal/tenant/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "You may not open this page" in html
    assert "are set by the portal" in html and 'href="/admin/"' in html


def test_a_missing_page_is_the_portals_own_page_in_the_readers_language(client, student_a):
    client.force_login(student_a)
    for path in ("/labs/999999/", "/no-such-page/"):
        response = client.get(path, HTTP_ACCEPT_LANGUAGE="ja")
        assert response.status_code == 404, path
        html = response.content.decode()
        assert "ページが見つかりません" in html and 'href="/"' in html, path
        assert "ログアウト" in html  # the header, as the signed-in student sees it


def test_a_missing_api_path_answers_in_the_apis_error_format(client, student_a):
    client.force_login(student_a)
    for path in ("/api/v1/labs/abc/", "/api/v1/no-such-thing/"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json() == {"error": {"code": "not_found", "message": "Not found."}}, path


def test_a_form_from_a_stale_page_says_to_reload_it(student_a):
    """Signed in in another tab: the sign-in form of this one carries a token that no longer matches."""
    client = Client(enforce_csrf_checks=True)
    client.get(reverse("login"))
    response = client.post(reverse("login"), {"username": "x", "password": "y", "csrfmiddlewaretoken": "stale" * 8})
    assert response.status_code == 403
    html = response.content.decode()
    assert "This page is out of date" in html and "CSRF" not in html


def test_a_script_on_a_stale_page_is_told_in_json(student_a, lab_a):
    client = Client(enforce_csrf_checks=True)
    client.force_login(student_a)
    client.get(reverse("labs:lab_detail", args=[lab_a.id]))
    response = client.post(
        reverse("labs:attempt_start", args=[lab_a.id]), HTTP_ACCEPT="application/json", HTTP_X_CSRFTOKEN="stale" * 8
    )
    assert response.status_code == 403
    assert response.json()["code"] == "csrf_failed" and "Reload the page" in response.json()["error"]
    assert not Attempt.objects.exists()


def test_a_signed_out_scripts_press_is_told_to_sign_in_again(lab_a):
    """Start, Check, Stop and Extend are posted by the page's script, which would follow a redirect to the sign-in
    page and see a 200; a plain form's press is still sent there."""
    urls = [reverse("labs:attempt_start", args=[lab_a.id])]
    urls += [reverse(f"labs:attempt_{action}", args=[1]) for action in ("check", "stop", "extend")]
    for url in urls:
        response = Client().post(url, HTTP_ACCEPT="application/json")
        assert response.status_code == 401, url
        assert response.json()["code"] == "signed_out" and "sign in again" in response.json()["error"], url
        plain = Client().post(url)
        assert plain.status_code == 302 and plain["Location"].startswith(reverse("login")), url
