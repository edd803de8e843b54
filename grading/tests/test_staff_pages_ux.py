"""What TAs read first on an attempt: its timeline in lifecycle order with seconds, and runs numbered within the
attempt (not across the portal)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from grading.tests.builders import ALL_PASS, FIRST_ONLY, make_attempt, record_run
from labs.models import Attempt, AttemptState

pytestmark = pytest.mark.django_db


def test_timeline_puts_whole_second_cluster_times_after_the_request_of_the_same_second_and_shows_seconds(
    client, ta_a, student_a, lab_a
):
    attempt = make_attempt(lab=lab_a, student=student_a)
    requested = datetime(2026, 12, 4, 5, 11, 28, 412000, tzinfo=UTC)
    # The cluster writes whole seconds: its "pending" reads 05:11:28.000, before the portal's 05:11:28.412.
    Attempt.objects.filter(pk=attempt.pk).update(
        requested_at=requested,
        provisioned_at=requested + timedelta(milliseconds=300),
        pending_at=requested.replace(microsecond=0),
        scheduled_at=requested.replace(microsecond=0),
        vmi_running_at=requested.replace(microsecond=0) + timedelta(seconds=1),
        agent_ready_at=requested + timedelta(seconds=2),
    )
    client.force_login(ta_a)
    html = client.get(reverse("grading:attempt_detail", args=[attempt.pk])).content.decode()
    timeline = re.search(r'<ol class="timeline">(.*?)</ol>', html, re.S).group(1)
    labels = [" ".join(item.split()) for item in re.findall(r"</time>(.*?)</li>", timeline, re.S)]
    assert labels[0].lower().startswith("requested"), labels
    assert labels.index(next(x for x in labels if "pending" in x.lower())) > 1, labels
    assert "05:11:28" in timeline and "05:11:29" in timeline


def test_timeline_times_name_the_readers_zone(client, ta_a, student_a, lab_a):
    ta_a.time_zone = "Asia/Tokyo"
    ta_a.save(update_fields=["time_zone"])
    attempt = make_attempt(lab=lab_a, student=student_a)
    Attempt.objects.filter(pk=attempt.pk).update(requested_at=datetime(2026, 12, 4, 5, 11, 28, tzinfo=UTC))
    client.force_login(ta_a)
    html = client.get(reverse("grading:attempt_detail", args=[attempt.pk])).content.decode()
    assert "14:11:28 JST" in re.search(r'<ol class="timeline">(.*?)</ol>', html, re.S).group(1)


def test_runs_are_numbered_within_their_attempt(client, ta_a, student_a, lab_a):
    first = make_attempt(lab=lab_a, student=student_a)
    for _ in range(2):
        record_run(attempt=first, outputs=FIRST_ONLY)
    Attempt.objects.filter(pk=first.pk).update(state=AttemptState.STOPPED)
    second = make_attempt(lab=lab_a, student=student_a)
    record_run(attempt=second, outputs=ALL_PASS)
    client.force_login(ta_a)
    html = client.get(reverse("grading:attempt_detail", args=[first.pk])).content.decode()
    assert re.findall(r"Run (\d+)", html) == ["2", "1"]  # newest first
    html = client.get(reverse("grading:attempt_detail", args=[second.pk])).content.decode()
    assert re.findall(r"Run (\d+)", html) == ["1"]


def test_the_gradebook_states_how_a_lab_without_a_grade_counts_in_the_total(client, ta_a, student_a, lab_a, course_a):
    client.force_login(ta_a)
    html = client.get(reverse("grading:gradebook", args=[course_a.pk])).content.decode()
    legend = re.search(r'<p class="muted" id="gradebook-legend">(.*?)</p>', html, re.S)
    assert legend and "—" in legend.group(1) and "counted as 0" in legend.group(1)


def test_the_lab_report_draws_the_score_distribution_and_each_checks_pass_rate(
    client, ta_a, student_a, lab_a, course_a
):
    from conftest import make_person
    from portal.models import Role

    others = [
        make_person(username=f"student_{n}", tenant=course_a.tenant, course=course_a, role=Role.STUDENT)
        for n in range(3)
    ]
    for student, outputs in zip([student_a, *others], [ALL_PASS, FIRST_ONLY, FIRST_ONLY, ALL_PASS], strict=True):
        record_run(attempt=make_attempt(lab=lab_a, student=student), outputs=outputs)
    client.force_login(ta_a)
    html = client.get(reverse("grading:lab_report", args=[lab_a.pk])).content.decode()
    charts = re.findall(r'<svg [^>]*role="img"[^>]*>(.*?)</svg>', html, re.S)
    assert len(charts) == 2
    distribution, checks = charts
    assert len(re.findall(r'class="chart-bar"', distribution)) == 10
    # Both checks: everyone passed the first; two of four the second (the step the class struggles with).
    desc = re.search(r"<desc[^>]*>(.*?)</desc>", checks, re.S).group(1)
    assert "100% (4 of 4)" in desc and "50% (2 of 4)" in desc
    # The page's queries do not grow with the class.
    with CaptureQueriesContext(connection) as before:
        client.get(reverse("grading:lab_report", args=[lab_a.pk]))
    for n in range(4):
        student = make_person(username=f"late_{n}", tenant=course_a.tenant, course=course_a, role=Role.STUDENT)
        record_run(attempt=make_attempt(lab=lab_a, student=student), outputs=ALL_PASS)
    with CaptureQueriesContext(connection) as after:
        client.get(reverse("grading:lab_report", args=[lab_a.pk]))
    assert len(after) == len(before)
