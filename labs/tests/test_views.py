"""Student pages: login, dashboard, lab page, attempt page, the attempt's buttons, recordings; and who is refused."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from conftest import PASSWORD, make_lab, make_person
from grading.models import Grade, GradingRun, RunState
from labs.console.recording import recording_path
from labs.models import Attempt, AttemptState
from portal.models import AuditEvent, Role

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    # Personas are created with a password; the production hasher costs about a second each on a busy box.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_attempt(*, lab, student, state=AttemptState.RUNNING, number=1, **fields) -> Attempt:
    """An attempt row as the lifecycle leaves it (no cluster involved: these tests are about pages)."""
    now = timezone.now()
    defaults = {
        "namespace": lab.course.tenant.namespace,
        "vm_name": "attempt-x",
        "requested_at": now - timedelta(minutes=3),
        "provisioned_at": now - timedelta(minutes=2),
        "expires_at": now + timedelta(minutes=57),
    }
    if state == AttemptState.RUNNING:
        defaults.update(vmi_running_at=now - timedelta(minutes=1), agent_ready_at=now - timedelta(seconds=50))
    defaults.update(fields)
    attempt = Attempt.objects.create(
        lab=lab, student=student, tenant=lab.course.tenant, state=state, number=number, **defaults
    )
    Attempt.objects.filter(pk=attempt.pk).update(vm_name=f"attempt-{attempt.pk}")
    attempt.refresh_from_db()
    return attempt


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def inline_scripts(html: str) -> list[str]:
    """Script elements that would execute without a src (a CSP without 'unsafe-inline' blocks them)."""
    scripts = re.findall(r"<script(?P<attrs>[^>]*)>", html)
    return [attrs for attrs in scripts if "src=" not in attrs and 'type="application/json"' not in attrs]


def page_config(html: str, element_id: str = "attempt-config") -> dict:
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no #{element_id} data block"
    return json.loads(match.group(1))


# -- login and language ---------------------------------------------------------------------------------------


def test_login_page_logs_a_student_in_and_lands_on_the_dashboard(student_a):
    client = Client(enforce_csrf_checks=True)
    page = client.get(reverse("login"))
    assert page.status_code == 200
    token = page.cookies["csrftoken"].value
    response = client.post(
        reverse("login"), {"username": "student_a", "password": PASSWORD, "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302 and response["Location"] == reverse("dashboard")
    assert client.get(reverse("dashboard")).status_code == 200


def test_login_with_a_wrong_password_says_so(student_a):
    response = Client().post(reverse("login"), {"username": "student_a", "password": "nope"})
    assert response.status_code == 200
    assert "did not match" in response.content.decode()


def test_pages_require_login(lab_a, student_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    for url in (
        reverse("dashboard"),
        reverse("labs:lab_detail", args=[lab_a.id]),
        reverse("labs:attempt_detail", args=[attempt.id]),
        reverse("labs:attempt_recording", args=[attempt.id]),
    ):
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login")), url


def test_language_switcher_posts_to_set_language_and_switches_to_japanese(student_a):
    client = logged_in(student_a)
    html = client.get(reverse("dashboard")).content.decode()
    assert f'action="{reverse("set_language")}"' in html
    assert 'name="language" value="ja"' in html
    client.post(reverse("set_language"), {"language": "ja", "next": reverse("dashboard")})
    assert '<html lang="ja" ' in client.get(reverse("dashboard")).content.decode()


# -- dashboard ------------------------------------------------------------------------------------------------


def test_dashboard_lists_courses_labs_state_due_date_and_grade(student_a, lab_a, course_a):
    lab_a.due_at = timezone.now() + timedelta(days=3)
    lab_a.save()
    other = make_lab(course_a, title="Shell scripting")
    make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, number=1)
    make_attempt(lab=lab_a, student=student_a, state=AttemptState.RUNNING, number=2)
    Grade.objects.create(lab=lab_a, student=student_a, score=Decimal("2"), max_score=Decimal("3"))
    html = logged_in(student_a).get(reverse("dashboard")).content.decode()
    assert "LNX101" in html
    row = re.search(rf'<tr data-lab="{lab_a.id}">(.*?)</tr>', html, re.S).group(1)
    assert "Linux basics" in row and "Running" in row  # the latest attempt's state, not the stopped one
    assert lab_a.due_at.strftime("%Y-%m-%dT%H:%M") in row
    assert "2 / 3" in row
    other_row = re.search(rf'<tr data-lab="{other.id}">(.*?)</tr>', html, re.S).group(1)
    assert "Not started" in other_row and "Not graded" in other_row


def test_dashboard_shows_nothing_of_the_other_tenant(student_a, lab_a, student_b, lab_b):
    make_attempt(lab=lab_a, student=student_a)
    html = logged_in(student_b).get(reverse("dashboard")).content.decode()
    assert "Routing" in html and "NET201" in html
    assert "LNX101" not in html and lab_a.title not in html


def test_dashboard_gives_staff_a_watch_link_for_running_attempts(ta_a, student_a, lab_a, instructor_b):
    attempt = make_attempt(lab=lab_a, student=student_a)
    watch = reverse("labs:attempt_detail", args=[attempt.id])
    assert watch in logged_in(ta_a).get(reverse("dashboard")).content.decode()
    assert watch not in logged_in(instructor_b).get(reverse("dashboard")).content.decode()


def test_dashboard_links_staff_to_each_courses_gradebook_and_students_to_their_grades(
    ta_a, student_a, instructor_b, course_a, course_b, lab_a
):
    gradebook = reverse("grading:gradebook", args=[course_a.id])
    staff_page = logged_in(ta_a).get(reverse("dashboard")).content.decode()
    card = re.search(
        rf'<section class="card course" data-staff-course="{course_a.id}">(.*?)</section>', staff_page, re.S
    ).group(1)
    assert f'href="{gradebook}"' in card
    # A TA takes no course: no empty "My labs" heading above the courses they teach, which title the page.
    assert "<h1>My labs</h1>" not in staff_page and "<title>Courses I teach" in staff_page
    assert reverse("grading:my_grades") not in staff_page

    student_page = logged_in(student_a).get(reverse("dashboard")).content.decode()
    assert "<h1>My labs</h1>" in student_page and f'href="{reverse("grading:my_grades")}"' in student_page
    assert gradebook not in student_page
    assert gradebook not in logged_in(instructor_b).get(reverse("dashboard")).content.decode()


def test_every_page_header_leads_to_the_labs_and_the_grades(student_a, lab_a, client):
    header_links = r'<nav class="site-nav"[^>]*>(.*?)</nav>'
    for page in (reverse("dashboard"), reverse("labs:lab_detail", args=[lab_a.id]), reverse("grading:my_grades")):
        nav = re.search(header_links, logged_in(student_a).get(page).content.decode(), re.S).group(1)
        assert f'href="{reverse("dashboard")}"' in nav and f'href="{reverse("grading:index")}"' in nav, page
    login_page = client.get(reverse("login")).content.decode()
    assert f'href="{reverse("grading:index")}"' not in re.search(header_links, login_page, re.S).group(1)


def test_dashboard_query_count_does_not_grow_with_labs(student_a, course_a, django_assert_max_num_queries):
    for index in range(8):
        lab = make_lab(course_a, title=f"Lab {index}")
        make_attempt(lab=lab, student=student_a, state=AttemptState.STOPPED)
    client = logged_in(student_a)
    with django_assert_max_num_queries(12):
        assert client.get(reverse("dashboard")).status_code == 200


# -- lab page -------------------------------------------------------------------------------------------------


def test_lab_page_renders_sanitised_markdown_and_offers_start(student_a, lab_a):
    lab_a.instructions = (
        "# Set up\n\nRun `ls`.\n\n<script>alert('x')</script>\n\n[bad](javascript:alert(1)) "
        '<img src="x" onerror="alert(1)">\n\n<div id="attempt-config">clobber</div>'
    )
    lab_a.save()
    response = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id]))
    html = response.content.decode()
    assert response.status_code == 200
    assert "<h1>Set up</h1>" in html and "<code>ls</code>" in html
    assert "alert(" not in html and "javascript:" not in html and "onerror" not in html
    assert 'id="attempt-config"' not in html
    assert reverse("labs:attempt_start", args=[lab_a.id]) in html
    assert "csrfmiddlewaretoken" in html
    assert inline_scripts(html) == []


def test_lab_instructions_are_rendered_once_per_text_and_anew_after_an_edit(student_a, lab_a, monkeypatch):
    import uuid

    from labs.views import instructions

    rendered = []
    real = instructions.markdown.markdown
    monkeypatch.setattr(
        instructions.markdown, "markdown", lambda text, **options: rendered.append(text) or real(text, **options)
    )
    marker = uuid.uuid4().hex  # text no earlier test rendered in this process
    lab_a.instructions = f"# First {marker}"
    lab_a.save()
    client, url = logged_in(student_a), reverse("labs:lab_detail", args=[lab_a.id])
    for _ in range(3):
        assert f"<h1>First {marker}</h1>" in client.get(url).content.decode()
    assert len(rendered) == 1
    lab_a.instructions = f"# Second {marker}"
    lab_a.save()
    html = client.get(url).content.decode()
    assert f"<h1>Second {marker}</h1>" in html and "First" not in html and len(rendered) == 2


def test_lab_page_before_start_loads_the_panels_scripts_and_start_answers_with_the_panel(student_a, lab_a):
    client, page = logged_in(student_a), reverse("labs:lab_detail", args=[lab_a.id])
    html = client.get(page).content.decode()
    scripts = [url.rsplit("/", 1)[-1] for url in re.findall(r'<script src="([^"]+)"', html)]
    assert scripts == [
        "forms.js",
        "xterm.js",
        "addon-fit.js",
        "console.js",
        "attempt.js",
        "instructions.js",
        "start.js",
    ]
    assert 'id="attempt-config"' not in html and 'id="start-card"' in html and 'id="attempt-history"' in html

    # Start as start.js posts it: the answer carries what replaces the Start card and the history.
    answer = client.post(reverse("labs:attempt_start", args=[lab_a.id]), HTTP_ACCEPT="application/json").json()
    attempt = Attempt.objects.get(lab=lab_a, student=student_a)
    assert answer["attempt"]["id"] == attempt.id
    assert page_config(answer["panel"])["attempt_id"] == attempt.id
    assert 'id="attempt-panel"' in answer["panel"] and 'id="terminal"' in answer["panel"]
    assert 'name="csrfmiddlewaretoken"' in answer["panel"]  # the panel's Stop / Extend / Check forms post too
    assert answer["history_row"].lstrip().startswith(f'<tr data-history-attempt="{attempt.id}">')
    assert inline_scripts(answer["panel"]) == []
    # The page once reloaded shows the same panel, and no longer offers Start.
    html = client.get(page).content.decode()
    assert page_config(html)["attempt_id"] == attempt.id and "start.js" not in html and 'id="start-card"' not in html


def test_lab_page_without_start_loads_no_scripts(student_a, lab_a):
    lab_a.attempt_limit = 1
    lab_a.save()
    make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, ended_at=timezone.now())
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    assert 'id="start-refusal"' in html and "<script src=" not in html
    assert "data-recheck-in" not in html  # nothing elsewhere brings this Start back


def test_a_lab_that_opens_soon_looks_again_when_it_opens(student_a, lab_a):
    lab_a.opens_at = timezone.now() + timedelta(seconds=20)
    lab_a.save()
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    assert 'id="start-button"' not in html and "This lab opens on" in html
    recheck_in = int(re.search(r'data-recheck-in="(\d+)"', html).group(1))
    assert 15 <= recheck_in <= 20 and "js/start_recheck.js" in html
    lab_a.opens_at = timezone.now() + timedelta(minutes=30)
    lab_a.save()
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    assert 'data-recheck-in="60"' in html  # within the hour: every minute while shown
    lab_a.opens_at = timezone.now() + timedelta(hours=3)
    lab_a.save()
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    recheck_in = int(re.search(r'data-recheck-in="(\d+)"', html).group(1))
    assert 2 * 3600 - 5 <= recheck_in <= 2 * 3600  # not before the last hour (or when shown again)
    lab_a.opens_at = timezone.now() + timedelta(days=3)
    lab_a.save()
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    assert 'data-recheck-in="86400"' in html  # days away: once a day at most

    lab_a.opens_at, lab_a.due_at = None, timezone.now() - timedelta(days=1)
    lab_a.save()
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    assert "This lab is closed." in html and "data-recheck-in" not in html  # closed: it stays closed


def test_a_lab_not_yet_open_says_when_it_opens_in_the_students_clock(student_a, lab_a):
    lab_a.opens_at = datetime(2099, 1, 2, 3, 4, tzinfo=UTC)
    lab_a.save()
    student_a.time_zone = "Asia/Tokyo"
    student_a.save()
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    assert "This lab opens on Jan 2, 2099, 12:04 PM" in html


def test_lab_page_with_a_running_attempt_has_the_panel_and_terminal(student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    assert 'id="terminal"' in html and 'id="fit-button"' in html and 'id="check-button"' in html
    assert "vendor/xterm/xterm.js" in html and "vendor/xterm-addon-fit/addon-fit.js" in html
    assert "js/console.js" in html and "js/attempt.js" in html
    assert "cdn" not in html.lower()
    assert inline_scripts(html) == []
    config = page_config(html)
    assert config["attempt_id"] == attempt.id
    assert config["urls"]["events"] == f"/ws/attempts/{attempt.id}/events/"
    assert config["urls"]["console"] == f"/ws/attempts/{attempt.id}/console/"
    assert config["initial"]["state"] == "running"
    assert config["strings"]["steps"]["provisioned"] == "VM created"
    assert reverse("labs:lab_detail", args=[lab_a.id]) not in config["urls"].values()
    assert 'id="start-button"' not in html


def test_lab_page_lists_attempt_history(student_a, lab_a):
    first = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, number=1, ended_at=timezone.now())
    second = make_attempt(lab=lab_a, student=student_a, state=AttemptState.FAILED, number=2)
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    history = re.search(r'<table class="table" id="history">(.*?)</table>', html, re.S).group(1)
    assert history.index(reverse("labs:attempt_detail", args=[second.id])) < history.index(
        reverse("labs:attempt_detail", args=[first.id])
    )
    assert "Failed" in history and "Stopped" in history


def test_lab_page_explains_why_start_is_not_offered_when_the_limit_is_used(student_a, lab_a):
    lab_a.attempt_limit = 1
    lab_a.save()
    make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
    html = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    assert 'id="start-button"' not in html and "used all 1 attempts" in html


def test_lab_page_of_the_other_tenant_is_not_found(student_b, instructor_b, lab_a):
    for user in (student_b, instructor_b):
        assert logged_in(user).get(reverse("labs:lab_detail", args=[lab_a.id])).status_code == 404


def test_lab_page_for_staff_lists_attempts_to_watch(instructor_a, student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    html = logged_in(instructor_a).get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    assert reverse("labs:attempt_detail", args=[attempt.id]) in html
    assert 'id="start-button"' not in html


# -- attempt page ---------------------------------------------------------------------------------------------


def test_attempt_page_for_the_student_and_for_course_staff(student_a, ta_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    own = logged_in(student_a).get(reverse("labs:attempt_detail", args=[attempt.id])).content.decode()
    assert page_config(own)["is_student"] is True and 'id="stop-button"' in own
    assert reverse("labs:attempt_recording", args=[attempt.id]) not in own
    staff = logged_in(ta_a).get(reverse("labs:attempt_detail", args=[attempt.id])).content.decode()
    config = page_config(staff)
    assert config["is_student"] is False and config["can_take_control"] is True
    assert 'id="terminal"' in staff and 'id="stop-button"' not in staff
    assert reverse("labs:attempt_recording", args=[attempt.id]) in staff
    # The way back: the student's to their labs, staff's to the grade reports of the course and the lab.
    crumbs = lambda html: re.search(r'<nav class="breadcrumbs">(.*?)</nav>', html, re.S).group(1)  # noqa: E731
    assert reverse("dashboard") in crumbs(own) and reverse("labs:lab_detail", args=[lab_a.id]) in crumbs(own)
    assert reverse("grading:lab_report", args=[lab_a.id]) not in crumbs(own)
    assert reverse("grading:gradebook", args=[lab_a.course_id]) in crumbs(staff)
    assert reverse("grading:lab_report", args=[lab_a.id]) in crumbs(staff)


def test_attempt_page_refuses_another_student_and_the_other_tenant(
    student_a, lab_a, course_a, student_b, instructor_b, tenant_a
):
    attempt = make_attempt(lab=lab_a, student=student_a)
    classmate = make_person(username="classmate_a", tenant=tenant_a, course=course_a, role=Role.STUDENT)
    for user in (classmate, student_b, instructor_b):
        assert logged_in(user).get(reverse("labs:attempt_detail", args=[attempt.id])).status_code == 404


def test_ended_attempt_page_has_no_terminal(student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, ended_at=timezone.now())
    html = logged_in(student_a).get(reverse("labs:attempt_detail", args=[attempt.id])).content.decode()
    assert 'id="terminal"' not in html and "js/attempt.js" in html


# -- buttons --------------------------------------------------------------------------------------------------


def test_start_requires_the_csrf_token(student_a, lab_a):
    client = Client(enforce_csrf_checks=True)
    client.force_login(student_a)
    response = client.post(reverse("labs:attempt_start", args=[lab_a.id]))
    assert response.status_code == 403
    assert not Attempt.objects.filter(lab=lab_a).exists()


def test_start_creates_an_attempt_and_returns_to_the_lab_page(student_a, lab_a):
    response = logged_in(student_a).post(reverse("labs:attempt_start", args=[lab_a.id]))
    assert response.status_code == 302 and response["Location"] == reverse("labs:lab_detail", args=[lab_a.id])
    attempt = Attempt.objects.get(lab=lab_a, student=student_a)
    assert attempt.state == AttemptState.REQUESTED


def test_start_as_json_returns_the_status_payload(student_a, lab_a):
    response = logged_in(student_a).post(reverse("labs:attempt_start", args=[lab_a.id]), HTTP_ACCEPT="application/json")
    assert response.status_code == 201
    assert response.json()["attempt"]["state"] == "requested"


def test_the_page_start_of_a_lab_without_a_pool_makes_no_pool_queries(student_a, lab_a, django_assert_max_num_queries):
    """The Start's statements: the lab (with its pool, if any), the namespace's state, the student's attempts, the
    start throttle, then in the transaction the row, its VM name, the audit record, the tenant's lock and the two
    totals. A lab without a warm pool asks nothing of the pools' rows but the tenant's pool totals."""
    client = logged_in(student_a)
    client.get(reverse("labs:lab_detail", args=[lab_a.id]))  # the session's user, as the page has it
    with django_assert_max_num_queries(13) as captured:
        response = client.post(reverse("labs:attempt_start", args=[lab_a.id]), HTTP_ACCEPT="application/json")
    assert response.status_code == 201
    pool_tables = ('FROM "labs_labpool"', 'FROM "labs_poolvm"', 'UPDATE "labs_labpool"', 'UPDATE "labs_poolvm"')
    pool_rows = [q["sql"] for q in captured.captured_queries if any(table in q["sql"] for table in pool_tables)]
    assert len(pool_rows) == 1 and "SUM(" in pool_rows[0]  # the tenant's pool totals (its quota) only


def test_the_page_start_of_a_lab_with_a_pool_counts_the_miss(student_a, lab_a):
    from labs.pool_models import LabPool, PoolMode

    pool = LabPool.objects.create(lab=lab_a, mode=PoolMode.ALWAYS, size=2)
    response = logged_in(student_a).post(reverse("labs:attempt_start", args=[lab_a.id]), HTTP_ACCEPT="application/json")
    assert response.status_code == 201
    pool.refresh_from_db()
    assert pool.misses == 1  # no ready VM to claim: a cold start, counted against the pool


def test_start_twice_is_refused_with_the_services_message(student_a, lab_a):
    make_attempt(lab=lab_a, student=student_a)
    response = logged_in(student_a).post(reverse("labs:attempt_start", args=[lab_a.id]), HTTP_ACCEPT="application/json")
    assert response.status_code == 409 and "in progress" in response.json()["error"]
    assert Attempt.objects.filter(lab=lab_a).count() == 1


def test_start_of_the_other_tenants_lab_is_not_found_and_changes_nothing(student_b, lab_a):
    response = logged_in(student_b).post(reverse("labs:attempt_start", args=[lab_a.id]), HTTP_ACCEPT="application/json")
    assert response.status_code == 404
    assert not Attempt.objects.exists()


def test_stop_and_extend_as_json(student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    client = logged_in(student_a)
    extended = client.post(reverse("labs:attempt_extend", args=[attempt.id]), HTTP_ACCEPT="application/json")
    assert extended.status_code == 200 and extended.json()["attempt"]["extensions"] == 1
    stopped = client.post(reverse("labs:attempt_stop", args=[attempt.id]), HTTP_ACCEPT="application/json")
    assert stopped.status_code == 200 and stopped.json()["attempt"]["state"] == "stopping"
    assert AuditEvent.objects.filter(action="attempt.stop", actor=student_a).exists()


def test_stop_by_form_post_redirects_with_a_message(student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    response = logged_in(student_a).post(reverse("labs:attempt_stop", args=[attempt.id]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("labs:lab_detail", args=[lab_a.id])
    assert "Stopping the lab." in response.content.decode()


def test_ta_may_not_stop_and_other_tenant_gets_not_found(student_a, ta_a, instructor_b, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    refused = logged_in(ta_a).post(reverse("labs:attempt_stop", args=[attempt.id]), HTTP_ACCEPT="application/json")
    assert refused.status_code == 403
    hidden = logged_in(instructor_b).post(
        reverse("labs:attempt_stop", args=[attempt.id]), HTTP_ACCEPT="application/json"
    )
    assert hidden.status_code == 404
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING


def test_check_queues_a_grading_run(student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    response = logged_in(student_a).post(
        reverse("labs:attempt_check", args=[attempt.id]), HTTP_ACCEPT="application/json"
    )
    assert response.status_code == 202
    run = response.json()["run"]
    assert run["attempt_id"] == attempt.id and run["state"] == "queued"
    assert GradingRun.objects.get(attempt=attempt).state == RunState.QUEUED


def test_check_of_a_stopped_attempt_is_refused_with_a_reason(student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
    response = logged_in(student_a).post(
        reverse("labs:attempt_check", args=[attempt.id]), HTTP_ACCEPT="application/json"
    )
    assert response.status_code == 409 and "not running" in response.json()["error"]
    assert not GradingRun.objects.exists()


def test_check_by_the_other_tenant_is_not_found(student_a, student_b, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    response = logged_in(student_b).post(
        reverse("labs:attempt_check", args=[attempt.id]), HTTP_ACCEPT="application/json"
    )
    assert response.status_code == 404
    assert not GradingRun.objects.exists()


def test_buttons_refuse_get(student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    client = logged_in(student_a)
    assert client.get(reverse("labs:attempt_start", args=[lab_a.id])).status_code == 405
    for name in ("attempt_stop", "attempt_extend", "attempt_check"):
        assert client.get(reverse(f"labs:{name}", args=[attempt.id])).status_code == 405


# -- recordings -----------------------------------------------------------------------------------------------


@pytest.fixture
def recordings_dir(settings, tmp_path):
    settings.CONSOLE_RECORDINGS_DIR = tmp_path / "recordings"
    return settings.CONSOLE_RECORDINGS_DIR


def write_recording(attempt: Attempt) -> None:
    path = recording_path(attempt_id=attempt.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"version": 2, "width": 80, "height": 24, "timestamp": 1}\n[0.5, "o", "hello\\r\\n"]\n')


def test_staff_replay_a_recording(recordings_dir, ta_a, student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    write_recording(attempt)
    client = logged_in(ta_a)
    page = client.get(reverse("labs:attempt_recording", args=[attempt.id])).content.decode()
    assert "js/replay.js" in page and inline_scripts(page) == []
    assert page_config(page, "replay-config")["cast_url"] == reverse("labs:attempt_recording_file", args=[attempt.id])
    cast = client.get(reverse("labs:attempt_recording_file", args=[attempt.id]))
    assert cast.status_code == 200 and cast["Content-Type"] == "application/x-asciicast"
    assert b'"hello\\r\\n"' in b"".join(cast.streaming_content)


def test_recording_is_not_for_the_student_nor_the_other_tenant(recordings_dir, student_a, instructor_b, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    write_recording(attempt)
    for user in (student_a, instructor_b):
        client = logged_in(user)
        assert client.get(reverse("labs:attempt_recording", args=[attempt.id])).status_code == 404
        assert client.get(reverse("labs:attempt_recording_file", args=[attempt.id])).status_code == 404


def test_missing_recording_says_so(recordings_dir, instructor_a, student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    client = logged_in(instructor_a)
    assert "Nothing was recorded" in client.get(reverse("labs:attempt_recording", args=[attempt.id])).content.decode()
    assert client.get(reverse("labs:attempt_recording_file", args=[attempt.id])).status_code == 404
