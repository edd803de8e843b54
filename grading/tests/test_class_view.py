"""The class view on a lab's page for its staff: every attempt in progress with time left, the latest Check and
what still fails, who is stuck; the same number of queries for a class of any size; nothing of another tenant."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from conftest import make_person
from grading.models import GradingRun
from grading.tests.builders import ALL_PASS, FIRST_ONLY, NONE_PASS, make_attempt, record_run
from labs.models import Attempt
from portal.models import Role

pytestmark = pytest.mark.django_db


def class_table(client, lab) -> str:
    html = client.get(reverse("labs:lab_detail", args=[lab.id])).content.decode()
    return re.search(r'<div id="class-view".*?</div>', html, re.S).group(0)


def test_the_class_view_shows_state_score_failing_checks_and_who_is_stuck(client, ta_a, student_a, lab_a, course_a):
    stuck = make_person(username="stuck_student", tenant=course_a.tenant, course=course_a, role=Role.STUDENT)
    idle = make_person(username="idle_student", tenant=course_a.tenant, course=course_a, role=Role.STUDENT)
    record_run(attempt=make_attempt(lab=lab_a, student=student_a), outputs=ALL_PASS)
    stuck_attempt = make_attempt(lab=lab_a, student=stuck)
    for _ in range(3):
        record_run(attempt=stuck_attempt, outputs=FIRST_ONLY)
    idle_attempt = make_attempt(lab=lab_a, student=idle)
    Attempt.objects.filter(pk=idle_attempt.pk).update(agent_ready_at=timezone.now() - timedelta(minutes=20))
    client.force_login(ta_a)
    table = class_table(client, lab_a)
    rows = dict(re.findall(r'<tr data-attempt="(\d+)"[^>]*>(.*?)</tr>', table, re.S))
    done, stuck_row, idle_row = (
        rows[str(a.id)] for a in (Attempt.objects.get(student=student_a), stuck_attempt, idle_attempt)
    )
    assert "3 / 3" in done and "stuck" not in done
    assert "1 / 3" in stuck_row and "hello.txt says hello world" in stuck_row and "stuck on" in stuck_row
    assert "no progress for 20 minutes" in idle_row and "not checked yet" in idle_row
    assert reverse("labs:attempt_detail", args=[idle_attempt.id]) in idle_row  # Watch


def test_the_class_view_costs_the_same_queries_for_a_bigger_class(client, ta_a, lab_a, course_a):
    def add_students(prefix: str, count: int) -> None:
        for n in range(count):
            student = make_person(username=f"{prefix}{n}", tenant=course_a.tenant, course=course_a, role=Role.STUDENT)
            attempt = make_attempt(lab=lab_a, student=student)
            record_run(attempt=attempt, outputs=NONE_PASS)
            record_run(attempt=attempt, outputs=FIRST_ONLY)

    add_students("a", 2)
    client.force_login(ta_a)
    url = reverse("labs:lab_detail", args=[lab_a.id]) + "?part=class"
    with CaptureQueriesContext(connection) as small:
        assert client.get(url).status_code == 200
    add_students("b", 6)
    with CaptureQueriesContext(connection) as big:
        html = client.get(url).content.decode()
    assert html.count("<tr data-attempt=") == 8
    assert len(big) == len(small)
    assert GradingRun.objects.count() == 16


def test_the_class_view_is_not_for_students_nor_the_other_tenant(client, student_a, instructor_b, lab_a):
    make_attempt(lab=lab_a, student=student_a)
    client.force_login(student_a)
    assert 'id="class-view"' not in client.get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    client.force_login(instructor_b)
    assert client.get(reverse("labs:lab_detail", args=[lab_a.id]) + "?part=class").status_code == 404
