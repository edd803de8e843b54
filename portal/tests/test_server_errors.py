"""A request that fails inside the portal: 503 with Retry-After when no database connection came free in time (the
pool's timeout, as under a class pressing Start at once on a small pool), 500 otherwise; JSON for the API and the
pages' scripts, a page for a browser; counted on /metrics and logged with the traceback either way."""

from __future__ import annotations

import logging

import pytest
from django.db import OperationalError
from psycopg_pool import PoolTimeout

from labs.models import Attempt
from portal import metrics
from portal.errors import database_busy
from portal.http import TenantModelBackend
from portal.views import BUSY_RETRY_AFTER_SECONDS

MESSAGE = "couldn't get a connection after 30.00 sec"


def pool_timeout_error() -> OperationalError:
    """What Django raises when psycopg_pool times out: its OperationalError, caused by the pool's PoolTimeout."""
    try:
        try:
            raise PoolTimeout(MESSAGE)
        except PoolTimeout as exc:
            raise OperationalError(MESSAGE) from exc
    except OperationalError as error:
        return error


@pytest.fixture(autouse=True)
def clean_counters():
    metrics.counters.clear(metrics.REQUEST_FAILURES_KEY)
    yield
    metrics.counters.clear(metrics.REQUEST_FAILURES_KEY)


@pytest.fixture
def failing_session_user(monkeypatch, client):
    """Loading the session's user (in middleware, before any view, where the pool ran dry under a burst) raises
    whatever the test sets."""
    client.raise_request_exception = False
    raised: dict[str, BaseException] = {}

    def get_user(self, user_id):
        raise raised["error"]

    monkeypatch.setattr(TenantModelBackend, "get_user", get_user)
    return raised


def failures() -> dict[str, int]:
    return metrics.counters.read(metrics.REQUEST_FAILURES_KEY)


def test_database_busy_follows_the_cause_chain():
    assert database_busy(pool_timeout_error())
    try:
        try:
            raise pool_timeout_error()
        except OperationalError as inner:
            raise RuntimeError("while answering") from inner
    except RuntimeError as outer:
        assert database_busy(outer)
    assert not database_busy(OperationalError("server closed the connection unexpectedly"))
    assert not database_busy(None)


def test_start_from_the_page_script_is_told_to_retry_when_the_pool_is_dry(
    client, student_a, lab_a, failing_session_user, caplog
):
    client.force_login(student_a)
    failing_session_user["error"] = pool_timeout_error()
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = client.post(f"/labs/{lab_a.id}/start/", HTTP_ACCEPT="application/json")
    assert response.status_code == 503
    body = response.json()
    assert body["code"] == "portal_busy"  # static/js/start.js waits this out and tries again by itself
    assert "busy" in body["error"]
    assert int(response["Retry-After"]) in BUSY_RETRY_AFTER_SECONDS
    assert not Attempt.objects.exists()
    assert failures() == {"portal_busy": 1}
    # Still a failure in the log, with what caused it.
    record = next(r for r in caplog.records if r.name == "django.request")
    assert record.exc_info and isinstance(record.exc_info[1], OperationalError)


def test_the_api_answers_busy_in_its_own_error_format(client, student_a, failing_session_user):
    client.force_login(student_a)
    failing_session_user["error"] = pool_timeout_error()
    response = client.get("/api/v1/me/")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "portal_busy"
    assert error["retry_after"] == int(response["Retry-After"])


def test_a_browser_gets_a_page_that_says_to_try_again(client, student_a, lab_a, failing_session_user):
    client.force_login(student_a)
    failing_session_user["error"] = pool_timeout_error()
    response = client.get(f"/labs/{lab_a.id}/", HTTP_ACCEPT_LANGUAGE="ja")
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert '<html lang="ja">' in page
    assert "ポータルが混み合っています" in page
    assert "Retry-After" in response


def test_other_failures_are_a_plain_500_in_each_format(client, student_a, lab_a, failing_session_user):
    client.force_login(student_a)
    failing_session_user["error"] = RuntimeError("a bug")
    script = client.post(f"/labs/{lab_a.id}/start/", HTTP_ACCEPT="application/json")
    assert script.status_code == 500
    assert script.json()["code"] == "server_error"
    assert "Retry-After" not in script
    api = client.get("/api/v1/me/")
    assert api.status_code == 500
    assert api.json()["error"]["code"] == "server_error"
    page = client.get(f"/labs/{lab_a.id}/")
    assert page.status_code == 500
    assert "Server error" in page.content.decode()
    assert "a bug" not in page.content.decode()  # nothing of the failure's own text reaches the person
    assert failures() == {"server_error": 3}


def test_failures_are_exported_by_reason(client, superuser):
    metrics.record_request_failure(reason="portal_busy")
    metrics.record_request_failure(reason="portal_busy")
    client.force_login(superuser)
    text = client.get("/metrics").content.decode()
    assert 'portal_requests_failed_total{reason="portal_busy"} 2.0' in text
    assert 'portal_requests_failed_total{reason="server_error"} 0.0' in text
