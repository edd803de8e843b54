"""The page of one student's grade for one lab (their attempts and the override form), the gradebook cells that
lead to it, and the lab report's links to it."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from html.parser import HTMLParser

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from conftest import make_lab, make_person
from grading.models import Grade, GradingRun, RunState
from grading.selectors import student_lab_attempts
from grading.services import grade_override
from grading.tests.builders import ALL_PASS, FIRST_ONLY, make_attempt, record_run
from labs.models import AttemptState
from portal.models import AuditEvent, Role

pytestmark = pytest.mark.django_db


class Elements(HTMLParser):
    """Every element's tag and attributes in document order, with the ``data-student`` of the row it sits in
    (attribute values come back unescaped, as a browser reads them)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None], str | None]] = []
        self._row: str | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "tr":
            self._row = attributes.get("data-student")
        self.found.append((tag, attributes, self._row))

    def links_in_row(self, student_id: int) -> list[dict[str, str | None]]:
        return [attrs for tag, attrs, row in self.found if tag == "a" and row == str(student_id)]

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for found, attrs, _row in self.found if found == tag]


def student_lab_url(lab, student) -> str:
    return reverse("grading:student_lab", args=[lab.pk, student.pk])


def error_run(attempt) -> GradingRun:
    return GradingRun.objects.create(attempt=attempt, state=RunState.ERROR, error_code="agent_timeout")


@pytest.fixture
def lab_2(course_a):
    return make_lab(course_a, title="Networking")


@pytest.fixture
def classmate(tenant_a, course_a):
    return make_person(username="classmate_a", tenant=tenant_a, course=course_a, role=Role.STUDENT)


@pytest.fixture
def ta_b(tenant_b, course_b):
    return make_person(username="ta_b", tenant=tenant_b, course=course_b, role=Role.TA)


class TestThePage:
    def test_lists_only_that_students_attempts_at_that_lab_newest_first(
        self, client, ta_a, lab_a, lab_2, student_a, classmate
    ):
        now = timezone.now()
        first = make_attempt(
            lab=lab_a, student=student_a, state=AttemptState.STOPPED, requested_at=now - timedelta(days=2)
        )
        record_run(attempt=first, outputs=FIRST_ONLY)
        record_run(attempt=first, outputs=ALL_PASS)
        error_run(first)
        second = make_attempt(
            lab=lab_a, student=student_a, state=AttemptState.STOPPED, requested_at=now - timedelta(days=1)
        )
        other_lab = make_attempt(lab=lab_2, student=student_a, state=AttemptState.STOPPED)
        other_student = make_attempt(lab=lab_a, student=classmate, state=AttemptState.STOPPED)
        client.force_login(ta_a)

        response = client.get(student_lab_url(lab_a, student_a))

        assert response.status_code == 200
        attempts = response.context["attempts"]
        assert attempts == [second, first]
        assert [(a.runs_done, a.runs_error) for a in attempts] == [(0, 0), (2, 1)]
        page = Elements(response.content.decode())
        listed = [int(attrs["data-attempt"]) for attrs in page.all("tr") if attrs.get("data-attempt")]
        assert listed == [second.pk, first.pk]
        hrefs = {attrs["href"] for attrs in page.all("a")}
        assert reverse("grading:attempt_detail", args=[first.pk]) in hrefs
        assert reverse("grading:attempt_detail", args=[second.pk]) in hrefs
        assert reverse("grading:attempt_detail", args=[other_lab.pk]) not in hrefs
        assert reverse("grading:attempt_detail", args=[other_student.pk]) not in hrefs
        text = response.content.decode()
        assert "2 scored, 1 failed" in text and "0 scored, 0 failed" in text
        assert "No attempts yet." not in text
        # Titled and headed as the student's grade for the lab, with the way back through the breadcrumbs.
        assert "<title>Grade of Student A for Linux basics" in text
        crumbs = [attrs["href"] for attrs in page.all("a")]
        assert reverse("grading:gradebook", args=[lab_a.course_id]) in crumbs
        assert reverse("grading:lab_report", args=[lab_a.pk]) in crumbs

    def test_a_student_without_attempts(self, client, ta_a, lab_a, student_a, classmate):
        make_attempt(lab=lab_a, student=classmate)
        client.force_login(ta_a)
        response = client.get(student_lab_url(lab_a, student_a))
        assert response.status_code == 200
        assert response.context["attempts"] == []
        assert "No attempts yet." in response.content.decode()

    def test_the_override_address_serves_the_same_page(self, client, ta_a, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a)
        client.force_login(ta_a)
        response = client.get(reverse("grading:grade_override", args=[lab_a.pk, student_a.pk]))
        assert response.status_code == 200
        assert response.context["attempts"] == [attempt]

    def test_query_count_does_not_grow_with_attempts(self, client, ta_a, lab_a, student_a):
        url = student_lab_url(lab_a, student_a)
        record_run(attempt=make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED), outputs=FIRST_ONLY)
        client.force_login(ta_a)
        with CaptureQueriesContext(connection) as one:
            assert len(client.get(url).context["attempts"]) == 1
        for _ in range(4):
            attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
            record_run(attempt=attempt, outputs=ALL_PASS)
            error_run(attempt)
        with CaptureQueriesContext(connection) as several:
            assert len(client.get(url).context["attempts"]) == 5
        assert len(several.captured_queries) == len(one.captured_queries)


class TestOverrideFromThePage:
    def test_the_form_posts_back_to_the_page_and_a_saved_override_returns_to_the_gradebook(
        self, client, ta_a, lab_a, student_a
    ):
        record_run(attempt=make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED), outputs=FIRST_ONLY)
        client.force_login(ta_a)
        url = student_lab_url(lab_a, student_a)
        [form] = [
            attrs
            for attrs in Elements(client.get(url).content.decode()).all("form")
            if attrs.get("method") == "post" and "card" in (attrs.get("class") or "")
        ]
        assert "action" not in form  # so the browser posts to the address the page was loaded from

        response = client.post(url, {"score": "2.5", "reason": "Partial credit for check 2"})

        assert response.status_code == 302
        assert response["Location"] == reverse("grading:gradebook", args=[lab_a.course_id])
        grade = Grade.objects.get(lab=lab_a, student=student_a)
        assert (grade.final_score, grade.overridden_by) == (Decimal("2.50"), ta_a)
        assert AuditEvent.objects.get(action="grading.override_set").actor == ta_a

    def test_an_invalid_override_shows_the_page_again_with_its_attempts(self, client, ta_a, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a)
        client.force_login(ta_a)
        response = client.post(student_lab_url(lab_a, student_a), {"score": "9", "reason": "bonus"})
        assert response.status_code == 400
        assert response.context["attempts"] == [attempt]
        assert not Grade.objects.filter(lab=lab_a, student=student_a, override_score__isnull=False).exists()


class TestAccess:
    @pytest.mark.parametrize("who", ["ta_b", "instructor_b", "student_a", "student_b"])
    def test_only_the_courses_staff_reach_the_page(self, request, client, lab_a, student_a, who):
        record_run(attempt=make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED), outputs=FIRST_ONLY)
        client.force_login(request.getfixturevalue(who))
        url = student_lab_url(lab_a, student_a)
        assert client.get(url).status_code == 404
        assert client.post(url, {"score": "3", "reason": "sneaky"}).status_code == 404
        assert Grade.objects.get(lab=lab_a, student=student_a).override_score is None
        assert not AuditEvent.objects.exists()

    def test_another_tenants_ta_is_refused_for_their_own_students_at_this_lab_too(self, client, ta_b, lab_a, student_b):
        client.force_login(ta_b)
        assert client.get(student_lab_url(lab_a, student_b)).status_code == 404

    def test_a_student_outside_the_course_is_not_found(self, client, ta_a, lab_a, student_b):
        make_attempt(lab=lab_a, student=student_b)  # even with an attempt row pointing at the lab
        client.force_login(ta_a)
        assert client.get(student_lab_url(lab_a, student_b)).status_code == 404

    def test_the_selector_finds_nothing_for_a_student_of_another_tenant(self, lab_a, student_a, student_b):
        make_attempt(lab=lab_a, student=student_a)
        stray = make_attempt(lab=lab_a, student=student_b)  # tenant A's attempt row naming tenant B's student
        assert stray.tenant_id != student_b.tenant_id
        assert student_lab_attempts(lab=lab_a, student=student_b) == []

    def test_anonymous_visitors_are_sent_to_sign_in(self, client, lab_a, student_a):
        response = client.get(student_lab_url(lab_a, student_a))
        assert response.status_code == 302 and reverse("login") in response["Location"]


class TestGradebookLinks:
    def test_each_cell_links_to_its_students_grade_for_its_lab(
        self, client, ta_a, instructor_a, course_a, lab_a, lab_2, student_a, classmate
    ):
        record_run(attempt=make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED), outputs=FIRST_ONLY)
        grade_override(actor=instructor_a, lab=lab_2, student=classmate, score=Decimal("2.5"), reason="by hand")
        client.force_login(ta_a)

        response = client.get(reverse("grading:gradebook", args=[course_a.pk]))

        page = Elements(response.content.decode())
        labs = [lab.pk for lab in response.context["book"].labs]
        for student in (student_a, classmate):
            hrefs = [attrs["href"] for attrs in page.links_in_row(student.pk)]
            assert hrefs == [reverse("grading:student_lab", args=[lab_id, student.pk]) for lab_id in labs]
        a_in_lab_a = page.links_in_row(student_a.pk)[labs.index(lab_a.pk)]
        assert a_in_lab_a["aria-label"] == "Grade of Student A for Linux basics: 1"
        # A cell with no grade links too, and says so.
        a_in_lab_2 = page.links_in_row(student_a.pk)[labs.index(lab_2.pk)]
        assert a_in_lab_2["aria-label"] == "Grade of Student A for Networking: Not graded"
        classmate_in_lab_2 = page.links_in_row(classmate.pk)[labs.index(lab_2.pk)]
        assert classmate_in_lab_2["aria-label"] == "Grade of Classmate A for Networking: 2.50 override"
        # The badge is inside the link, with the score.
        html = response.content.decode()
        href = reverse("grading:student_lab", args=[lab_2.pk, classmate.pk])
        cell = html[html.index(f'href="{href}"') :]
        assert cell.index("badge-override") < cell.index("</a>")

        followed = client.get(a_in_lab_a["href"])
        assert followed.status_code == 200
        assert (followed.context["student"], followed.context["lab"]) == (student_a, lab_a)

    def test_names_and_titles_are_escaped_in_the_links(self, client, ta_a, course_a, lab_a, student_a):
        student_a.full_name = '<b>O"Neil</b> & co'
        student_a.save(update_fields=["full_name"])
        lab_a.title = 'Shells "<i>"'
        lab_a.save(update_fields=["title"])
        client.force_login(ta_a)
        html = client.get(reverse("grading:gradebook", args=[course_a.pk])).content.decode()
        assert "<b>" not in html and "<i>" not in html
        [link] = Elements(html).links_in_row(student_a.pk)
        assert link["aria-label"] == 'Grade of <b>O"Neil</b> & co for Shells "<i>": Not graded'
        assert link["href"] == reverse("grading:student_lab", args=[lab_a.pk, student_a.pk])

    def test_the_links_are_named_in_the_readers_language(self, client, ta_a, course_a, lab_a, student_a):
        client.force_login(ta_a)
        html = client.get(reverse("grading:gradebook", args=[course_a.pk]), HTTP_ACCEPT_LANGUAGE="ja")
        [link] = Elements(html.content.decode()).links_in_row(student_a.pk)
        assert link["aria-label"] == "Linux basics における Student A の成績: 未採点"

    def test_six_queries_for_any_number_of_students(
        self, client, ta_a, tenant_a, course_a, lab_a, lab_2, django_assert_num_queries
    ):
        client.force_login(ta_a)
        url = reverse("grading:gradebook", args=[course_a.pk])
        for count in (1, 8):
            while len(course_a.memberships.filter(role=Role.STUDENT)) < count:
                n = course_a.memberships.count()
                student = make_person(username=f"learner{n}", tenant=tenant_a, course=course_a, role=Role.STUDENT)
                record_run(attempt=make_attempt(lab=lab_a, student=student), outputs=FIRST_ONLY)
            with django_assert_num_queries(6):
                response = client.get(url)
            assert len(Elements(response.content.decode()).all("a")) >= count * 2


class TestLabReportLinks:
    def test_grade_rows_and_attempt_rows_lead_to_the_students_page(self, client, ta_a, lab_a, student_a, classmate):
        record_run(attempt=make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED), outputs=FIRST_ONLY)
        record_run(attempt=make_attempt(lab=lab_a, student=classmate, state=AttemptState.STOPPED), outputs=ALL_PASS)
        client.force_login(ta_a)
        response = client.get(reverse("grading:lab_report", args=[lab_a.pk]))
        html = response.content.decode()
        page = Elements(html)
        hrefs = [attrs["href"] for attrs in page.all("a")]
        for student in (student_a, classmate):
            # Once in the grades table ("Attempts and override"), once on the name in the attempts table.
            assert hrefs.count(student_lab_url(lab_a, student)) == 2
        assert html.count(">Attempts and override</a>") == 2
        assert reverse("grading:grade_override", args=[lab_a.pk, student_a.pk]) not in hrefs

    def test_the_link_reads_in_japanese(self, client, ta_a, lab_a, student_a):
        record_run(attempt=make_attempt(lab=lab_a, student=student_a), outputs=FIRST_ONLY)
        client.force_login(ta_a)
        html = client.get(reverse("grading:lab_report", args=[lab_a.pk]), HTTP_ACCEPT_LANGUAGE="ja")
        assert ">実施と成績の上書き</a>" in html.content.decode()


class TestAttemptDetailLink:
    def test_the_attempt_leads_to_the_students_page_for_its_lab(self, client, ta_a, lab_a, student_a):
        attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
        record_run(attempt=attempt, outputs=FIRST_ONLY)
        client.force_login(ta_a)
        response = client.get(reverse("grading:attempt_detail", args=[attempt.pk]))
        assert response.status_code == 200
        hrefs = [attrs["href"] for attrs in Elements(response.content.decode()).all("a")]
        assert student_lab_url(lab_a, student_a) in hrefs
        assert reverse("grading:grade_override", args=[lab_a.pk, student_a.pk]) not in hrefs


class TestWatchLinks:
    """While an attempt holds a VM, the grading pages lead to its console, read-only (the lab's attempt page)."""

    def test_a_running_attempt_can_be_watched_a_stopped_one_not(self, client, ta_a, lab_a, student_a, classmate):
        running = make_attempt(lab=lab_a, student=student_a, state=AttemptState.RUNNING)
        stopped = make_attempt(lab=lab_a, student=classmate, state=AttemptState.STOPPED)
        client.force_login(ta_a)
        for url in (
            student_lab_url(lab_a, student_a),
            reverse("grading:lab_report", args=[lab_a.pk]),
            reverse("grading:attempt_detail", args=[running.pk]),
        ):
            hrefs = [attrs["href"] for attrs in Elements(client.get(url).content.decode()).all("a")]
            assert reverse("labs:attempt_detail", args=[running.pk]) in hrefs, url
            assert reverse("labs:attempt_detail", args=[stopped.pk]) not in hrefs, url
        stopped_page = Elements(client.get(reverse("grading:attempt_detail", args=[stopped.pk])).content.decode())
        hrefs = [attrs["href"] for attrs in stopped_page.all("a")]
        assert reverse("labs:attempt_detail", args=[stopped.pk]) not in hrefs

    def test_the_link_opens_the_read_only_console_page_for_the_ta(self, client, ta_a, lab_a, student_a):
        running = make_attempt(lab=lab_a, student=student_a, state=AttemptState.RUNNING)
        client.force_login(ta_a)
        response = client.get(reverse("labs:attempt_detail", args=[running.pk]))
        assert response.status_code == 200
        assert "console read-only. Taking control is recorded" in response.content.decode()
