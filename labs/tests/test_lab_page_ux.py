"""What a student meets first on the lab page, server side: the page without JavaScript, the lab that holds the
per-student cap, instructions that do not repeat the title, and words that are true of the page."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.urls import reverse

from conftest import make_lab
from labs.models import AttemptState
from labs.tests.test_views import logged_in, make_attempt
from portal.models import Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def lab_page(user, lab) -> str:
    return logged_in(user).get(reverse("labs:lab_detail", args=[lab.id])).content.decode()


def test_without_javascript_the_terminal_says_it_needs_it_instead_of_connecting_forever(student_a, lab_a):
    make_attempt(lab=lab_a, student=student_a)
    html = lab_page(student_a, lab_a)
    noscript = re.search(r"<noscript>(.*?)</noscript>", html, re.S)
    assert noscript and "needs JavaScript" in noscript.group(1)
    status = re.search(r'<span id="console-status"[^>]*>(.*?)</span>', html, re.S).group(1)
    assert "Connecting" not in status


def test_at_the_cap_the_lab_page_names_and_links_the_lab_already_running(student_a, lab_a, course_a):
    Tenant.objects.filter(pk=course_a.tenant_id).update(max_vms_per_student=1)
    other = make_lab(course_a, title="Networking first steps")
    make_attempt(lab=other, student=student_a)
    html = lab_page(student_a, lab_a)
    refusal = re.search(r'id="start-refusal"(.*?)</section>', html, re.S).group(1)
    assert f'href="{reverse("labs:lab_detail", args=[other.id])}"' in refusal
    assert "Networking first steps" in refusal


def test_the_cap_link_shows_only_the_students_own_labs(student_a, lab_a, course_a, ta_a):
    Tenant.objects.filter(pk=course_a.tenant_id).update(max_vms_per_student=1)
    other = make_lab(course_a, title="Someone else's lab")
    make_attempt(lab=other, student=ta_a)  # not the student's: no cap reached, nothing named
    html = lab_page(student_a, lab_a)
    assert "Someone else&#x27;s lab" not in html and 'id="start-button"' in html


def test_the_instructions_do_not_repeat_the_title_as_a_second_heading(student_a, lab_a):
    html = lab_page(student_a, lab_a)
    assert len(re.findall(r"<h[12][^>]*>\s*Linux basics\s*</h[12]>", html)) == 1
    assert "Create <code>~/hello.txt</code>" in html  # the rest of the instructions stays


def test_before_start_the_page_states_the_late_policy_and_attempt_limit_the_author_set(student_a, course_a):
    lab = make_lab(
        course_a,
        title="Users and permissions",
        due_at=datetime(2026, 12, 4, 17, 0, tzinfo=UTC),
        late_penalty_percent_per_day=Decimal("12.5"),
        late_cutoff_at=datetime(2026, 12, 20, 23, 59, tzinfo=UTC),
        attempt_limit=3,
    )

    def facts(lab) -> str:
        return re.search(r'<dl class="facts">(.*?)</dl>', lab_page(student_a, lab), re.S).group(1)

    assert "12.50% per started day" in facts(lab)
    assert 'datetime="2026-12-20T23:59:00+00:00"' in facts(lab)
    assert "At most 3" in facts(lab)
    assert "Late" not in facts(make_lab(course_a)) and "At most" not in facts(make_lab(course_a))


def test_before_start_the_page_promises_nothing_it_cannot_keep(student_a, lab_a):
    html = lab_page(student_a, lab_a)
    assert "minute or two" not in html
    assert "console below" not in html


def test_stopped_attempts_leave_start_offered(student_a, lab_a):
    make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
    assert 'id="start-button"' in lab_page(student_a, lab_a)


def test_the_latest_attempt_failed_says_why_above_start_in_the_readers_language(student_a, lab_a):
    reasons = {"en": "The lab's disk image could not be downloaded.", "ja": "ディスクイメージを取得できませんでした。"}
    make_attempt(
        lab=lab_a,
        student=student_a,
        state=AttemptState.FAILED,
        failure_reason=reasons["en"],
        failure_reason_texts=reasons,
    )
    html = lab_page(student_a, lab_a)
    assert 'id="start-button"' in html
    failure = re.search(r'<p class="error" id="last-failure">(.*?)</p>', html, re.S).group(1)
    assert "Attempt 1 failed." in failure and "could not be downloaded" in failure
    japanese = (
        logged_in(student_a)
        .get(reverse("labs:lab_detail", args=[lab_a.id]), HTTP_ACCEPT_LANGUAGE="ja")
        .content.decode()
    )
    assert reasons["ja"] in japanese
    # A later attempt that ended well: the old failure is history, not news.
    make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, number=2)
    assert 'id="last-failure"' not in lab_page(student_a, lab_a)


def test_check_is_offered_only_once_the_attempt_runs_even_before_the_page_script(student_a, lab_a):
    attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STARTING)
    button = re.compile(r'<button type="submit" id="check-button"[^>]*>')
    assert "disabled" in button.search(lab_page(student_a, lab_a)).group(0)
    attempt.state = AttemptState.RUNNING
    attempt.save(update_fields=["state"])
    assert "disabled" not in button.search(lab_page(student_a, lab_a)).group(0)


def test_take_control_words_agree_the_student_watches_while_staff_type(student_a, ta_a, lab_a):
    from labs.views.strings import attempt_page_strings

    attempt = make_attempt(lab=lab_a, student=student_a)
    html = logged_in(ta_a).get(reverse("labs:attempt_detail", args=[attempt.id])).content.decode()
    banner = re.search(r'<p class="notice" id="watch-banner"(.*?)</p>', html, re.S).group(1)
    # (The bridge refuses the student's input meanwhile: labs/tests/test_console_control.py.)
    assert "not type until you hand it back" in re.search(r'data-read-write="([^"]*)"', banner).group(1)
    assert "type again once they hand it back" in attempt_page_strings()["notices"]["control_taken"]
