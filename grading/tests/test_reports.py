"""Staff report pages, the override form, regrade actions, the CSV export and students' own grade pages."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest
from django.urls import reverse

from conftest import make_lab, make_person
from grading.models import Grade, GradingRun, RunState, RunTrigger
from grading.selectors.reports import csv_text
from grading.services import grade_override
from grading.tests.builders import ALL_PASS, FIRST_ONLY, NONE_PASS, agent_result, make_attempt, record_run
from labs.models import AttemptState, StdoutMatch
from portal.models import AuditEvent, Course, Role

pytestmark = pytest.mark.django_db


@pytest.fixture
def graded(lab_a, student_a):
    """student_a has one stopped attempt at lab_a with a run scoring 1 of 3."""
    attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
    run = record_run(attempt=attempt, outputs=FIRST_ONLY)
    return attempt, run


@pytest.fixture
def other_course_ta(tenant_a):
    """A TA in the same tenant, teaching a different course."""
    course = Course.objects.create(tenant=tenant_a, code="SEC300", title="Security", term="2026 fall")
    return make_person(username="ta_other_course", tenant=tenant_a, course=course, role=Role.TA)


def staff_urls(*, course, lab, attempt, student) -> list[tuple[str, str]]:
    return [
        ("get", reverse("grading:gradebook", args=[course.pk])),
        ("get", reverse("grading:gradebook_export", args=[course.pk])),
        ("get", reverse("grading:lab_report", args=[lab.pk])),
        ("post", reverse("grading:lab_regrade", args=[lab.pk])),
        ("get", reverse("grading:attempt_detail", args=[attempt.pk])),
        ("post", reverse("grading:attempt_regrade", args=[attempt.pk])),
        ("get", reverse("grading:grade_override", args=[lab.pk, student.pk])),
        ("post", reverse("grading:grade_override", args=[lab.pk, student.pk])),
    ]


class TestAccess:
    @pytest.mark.parametrize("who", ["instructor_b", "other_course_ta", "student_a", "student_b"])
    def test_everyone_but_the_courses_staff_gets_404_everywhere(
        self, request, client, course_a, lab_a, student_a, graded, who
    ):
        attempt, _run = graded
        client.force_login(request.getfixturevalue(who))
        for method, url in staff_urls(course=course_a, lab=lab_a, attempt=attempt, student=student_a):
            data = {"score": "3", "reason": "sneaky"} if method == "post" else None
            response = getattr(client, method)(url, data)
            assert response.status_code == 404, (who, method, url, response.status_code)
        assert not AuditEvent.objects.exists()
        assert GradingRun.objects.filter(trigger=RunTrigger.REGRADE).count() == 0
        assert Grade.objects.get(lab=lab_a, student=student_a).override_score is None

    def test_a_student_of_another_course_is_not_an_override_target(self, client, ta_a, lab_a, student_b):
        client.force_login(ta_a)
        url = reverse("grading:grade_override", args=[lab_a.pk, student_b.pk])
        assert client.get(url).status_code == 404

    def test_anonymous_visitors_are_sent_to_sign_in(self, client, course_a):
        response = client.get(reverse("grading:gradebook", args=[course_a.pk]))
        assert response.status_code == 302
        assert reverse("login") in response["Location"]

    def test_students_pages_show_only_their_own_labs(self, client, student_b, lab_a):
        client.force_login(student_b)
        assert client.get(reverse("grading:my_lab", args=[lab_a.pk])).status_code == 404

    @pytest.mark.parametrize("who", ["ta_a", "instructor_a", "superuser"])
    def test_course_staff_see_every_page(self, request, client, course_a, lab_a, student_a, graded, who):
        attempt, _run = graded
        client.force_login(request.getfixturevalue(who))
        for method, url in staff_urls(course=course_a, lab=lab_a, attempt=attempt, student=student_a):
            if method == "get":
                assert client.get(url).status_code == 200, url


class TestPages:
    def test_gradebook_shows_final_grades_and_flags(
        self, client, ta_a, instructor_a, course_a, lab_a, student_a, graded
    ):
        grade_override(actor=instructor_a, lab=lab_a, student=student_a, score=Decimal("2.5"), reason="by hand")
        client.force_login(ta_a)
        response = client.get(reverse("grading:gradebook", args=[course_a.pk]))
        book = response.context["book"]
        [row] = book.rows
        assert row.student == student_a
        assert row.cells[0].final == Decimal("2.50")
        assert row.cells[0].computed == Decimal("1.00")
        assert row.cells[0].overridden
        assert b"badge-override" in response.content

    def test_attempt_detail_lists_every_run_with_outputs(self, client, ta_a, graded):
        attempt, run = graded
        client.force_login(ta_a)
        response = client.get(reverse("grading:attempt_detail", args=[attempt.pk]))
        assert response.status_code == 200
        assert response.context["detail"].runs == [run]
        assert "goodbye" in response.content.decode()  # the failing check's output, for staff
        assert "The file must contain the words hello world." in response.content.decode()

    def test_lab_report_distribution(self, client, ta_a, lab_a, student_a, tenant_a, course_a):
        others = [make_person(username=f"s{i}", tenant=tenant_a, course=course_a, role=Role.STUDENT) for i in range(3)]
        for student, outputs in zip([student_a, *others], [ALL_PASS, ALL_PASS, FIRST_ONLY, NONE_PASS], strict=True):
            record_run(attempt=make_attempt(lab=lab_a, student=student), outputs=outputs)
        client.force_login(ta_a)
        report = client.get(reverse("grading:lab_report", args=[lab_a.pk])).context["report"]
        counts = {b.low_percent: b.count for b in report.distribution}
        assert counts[90] == 2  # 3/3
        assert counts[30] == 1  # 1/3
        assert counts[0] == 1  # 0/3
        assert report.graded == 4
        assert report.median_percent == pytest.approx(66.7, abs=0.1)

    def test_override_form_requires_a_reason_and_changes_nothing_without_one(
        self, client, ta_a, lab_a, student_a, graded
    ):
        client.force_login(ta_a)
        url = reverse("grading:grade_override", args=[lab_a.pk, student_a.pk])
        response = client.post(url, {"score": "3", "reason": "  "})
        assert response.status_code == 400
        assert Grade.objects.get(lab=lab_a, student=student_a).override_score is None
        assert not AuditEvent.objects.exists()

    def test_override_form_sets_the_grade_and_audits(self, client, ta_a, lab_a, student_a, graded):
        client.force_login(ta_a)
        url = reverse("grading:grade_override", args=[lab_a.pk, student_a.pk])
        response = client.post(url, {"score": "2.75", "reason": "Partial credit for check 2"})
        assert response.status_code == 302
        grade = Grade.objects.get(lab=lab_a, student=student_a)
        assert (grade.final_score, grade.overridden_by) == (Decimal("2.75"), ta_a)
        assert AuditEvent.objects.get(action="grading.override_set").data["reason"] == "Partial credit for check 2"

    def test_override_above_the_labs_points_is_refused(self, client, ta_a, lab_a, student_a, graded):
        client.force_login(ta_a)
        url = reverse("grading:grade_override", args=[lab_a.pk, student_a.pk])
        assert client.post(url, {"score": "4", "reason": "bonus"}).status_code == 400
        assert Grade.objects.get(lab=lab_a, student=student_a).override_score is None

    def test_regrade_action(self, client, instructor_a, lab_a, graded):
        attempt, run = graded
        client.force_login(instructor_a)
        response = client.post(reverse("grading:attempt_regrade", args=[attempt.pk]))
        assert response.status_code == 302
        assert GradingRun.objects.get(regrade_of=run).trigger == RunTrigger.REGRADE
        assert AuditEvent.objects.filter(action="grading.regraded", actor=instructor_a).count() == 1

    def test_the_grades_link_takes_a_student_to_their_grades_and_staff_to_their_courses(
        self, client, student_a, ta_a, course_a
    ):
        client.force_login(student_a)
        response = client.get(reverse("grading:index"))
        assert response.status_code == 302 and response.url == reverse("grading:my_grades")
        client.force_login(ta_a)
        page = client.get(reverse("grading:index"))
        assert page.status_code == 200
        text = page.content.decode()
        assert reverse("grading:gradebook", args=[course_a.pk]) in text and reverse("grading:my_grades") in text

    def test_student_sees_own_grades_and_feedback_but_no_output(self, client, student_a, lab_a, graded):
        client.force_login(student_a)
        mine = client.get(reverse("grading:my_grades"))
        assert mine.status_code == 200
        [course] = mine.context["courses"]
        assert course.labs[0].grade.final_score == Decimal("1.00")
        page = client.get(reverse("grading:my_lab", args=[lab_a.pk]))
        text = page.content.decode()
        assert "The file must contain the words hello world." in text
        assert "goodbye" not in text

    def test_a_pattern_that_runs_out_of_time_is_explained_to_student_and_ta(
        self, client, settings, student_a, ta_a, lab_a
    ):
        """A pattern saved before patterns were vetted: the run still finishes, the check fails, both read why."""
        settings.GRADING_PATTERN_TIMEOUT_MS = 100
        lab_a.checks.filter(order=2).update(stdout_match=StdoutMatch.REGEX, stdout_pattern=r"^(a|a)*$")
        attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
        outputs = {1: agent_result(), 2: agent_result(stdout="a" * 40 + "!")}
        run = record_run(attempt=attempt, outputs=outputs)
        assert run.state == RunState.DONE
        assert run.score == Decimal("1.00")
        expected = "This check could not be judged: its expected-output pattern took longer than 0.1 s"
        client.force_login(student_a)
        assert expected in client.get(reverse("grading:my_lab", args=[lab_a.pk])).content.decode()
        client.force_login(ta_a)
        assert expected in client.get(reverse("grading:attempt_detail", args=[attempt.pk])).content.decode()
        # Graded by a worker speaking English, read in the student's own language.
        client.force_login(student_a)
        page = client.get(reverse("grading:my_lab", args=[lab_a.pk]), HTTP_ACCEPT_LANGUAGE="ja").content.decode()
        assert "このチェックは判定できませんでした" in page and "0.1 秒" in page and expected not in page

    def test_dashboard_and_my_grades_show_the_same_grade_cell(self, client, student_a, lab_a, instructor_a):
        import re

        Grade.objects.create(
            lab=lab_a,
            student=student_a,
            score=Decimal("2"),
            max_score=Decimal("3"),
            late=True,
            override_score=Decimal("2.5"),
            override_reason="partial credit",
            overridden_by=instructor_a,
        )
        client.force_login(student_a)
        cells = []
        for page in (reverse("dashboard"), reverse("grading:my_grades")):
            html = client.get(page).content.decode()
            row = re.search(rf'<tr data-lab="{lab_a.pk}">(.*?)</tr>', html, re.S).group(1)
            cells.append(" ".join(re.search(r'<td class="grade">(.*?)</td>', row, re.S).group(1).split()))
        assert cells[0] == cells[1]
        assert "2.50 / 3" in cells[0]
        assert "badge-late" in cells[0] and "set by staff" in cells[0]


class TestCsvExport:
    def read(self, response) -> tuple[bytes, list[list[str]]]:
        raw = b"".join(response.streaming_content)
        return raw, list(csv.reader(io.StringIO(raw.decode("utf-8-sig"))))

    def test_csv_is_streamed_with_a_bom_and_keeps_japanese_names(
        self, client, ta_a, tenant_a, course_a, lab_a, student_a, graded
    ):
        japanese = make_person(username="yamada", tenant=tenant_a, course=course_a, role=Role.STUDENT)
        japanese.full_name = "山田 太郎"
        japanese.save()
        record_run(attempt=make_attempt(lab=lab_a, student=japanese), outputs=ALL_PASS)
        make_lab(course_a, title="ネットワーク設定")
        client.force_login(ta_a)
        response = client.get(reverse("grading:gradebook_export", args=[course_a.pk]))
        assert response.status_code == 200
        assert response.streaming
        assert response["Content-Type"] == "text/csv; charset=utf-8"
        assert "attachment" in response["Content-Disposition"]
        raw, rows = self.read(response)
        assert raw.startswith(b"\xef\xbb\xbf")
        header, *body = rows
        assert header[:3] == ["Username", "Full name", "Email"]
        assert "ネットワーク設定 (/3.00)" in header
        by_user = {row[0]: row for row in body}
        assert by_user["yamada"][1] == "山田 太郎"
        lab_column = header.index("Linux basics (/3.00)")
        assert by_user["yamada"][lab_column] == "3.00"
        assert by_user["student_a"][lab_column] == "1.00"
        assert by_user["student_a"][-1] == "1.00"  # total
        assert header[-1] == "Total (/6.00)"

    def test_cells_cannot_become_formulas(
        self, client, ta_a, tenant_a, course_a, lab_a, graded, instructor_a, student_a
    ):
        evil = make_person(username="evil", tenant=tenant_a, course=course_a, role=Role.STUDENT)
        evil.full_name = '=HYPERLINK("http://attacker.example","x")'
        evil.email = "+1@example.test"
        evil.save()
        grade_override(actor=instructor_a, lab=lab_a, student=student_a, score=Decimal("3"), reason="ok")
        client.force_login(ta_a)
        _raw, rows = self.read(client.get(reverse("grading:gradebook_export", args=[course_a.pk])))
        by_user = {row[0]: row for row in rows[1:]}
        assert by_user["evil"][1] == "'" + '=HYPERLINK("http://attacker.example","x")'
        assert by_user["evil"][2] == "'+1@example.test"
        flags_column = rows[0].index("Linux basics: flags")
        assert by_user["student_a"][flags_column] == "override"

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            ("=1+1", "'=1+1"),
            ("+x", "'+x"),
            ("-x", "'-x"),
            ("@x", "'@x"),
            ("\tx", "'\tx"),
            ("＝1", "'＝1"),
            ("山田", "山田"),
            ("a=b", "a=b"),
            (None, ""),
        ],
    )
    def test_csv_text(self, value, expected):
        assert csv_text(value) == expected


class TestGradebookQueryCount:
    def populate(self, *, course, tenant, labs, start: int, count: int) -> None:
        for i in range(start, start + count):
            student = make_person(username=f"learner{i}", tenant=tenant, course=course, role=Role.STUDENT)
            for lab in labs:
                record_run(attempt=make_attempt(lab=lab, student=student), outputs=FIRST_ONLY)

    def test_constant_as_students_grow(
        self, client, ta_a, tenant_a, course_a, lab_a, django_assert_max_num_queries, django_capture_on_commit_callbacks
    ):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        labs = [lab_a, make_lab(course_a, title="Second lab")]
        client.force_login(ta_a)
        url = reverse("grading:gradebook", args=[course_a.pk])
        self.populate(course=course_a, tenant=tenant_a, labs=labs, start=0, count=2)
        with CaptureQueriesContext(connection) as small:
            assert client.get(url).status_code == 200
        self.populate(course=course_a, tenant=tenant_a, labs=labs, start=2, count=10)
        with CaptureQueriesContext(connection) as large:
            response = client.get(url)
        assert len(response.context["book"].rows) == 12
        assert len(large.captured_queries) == len(small.captured_queries)
        export = reverse("grading:gradebook_export", args=[course_a.pk])
        with CaptureQueriesContext(connection) as csv_queries:
            b"".join(client.get(export).streaming_content)
        assert len(csv_queries.captured_queries) <= len(large.captured_queries)


@pytest.mark.parametrize(
    ("value", "text"),
    [(Decimal("3.00"), "3"), (Decimal("2.50"), "2.50"), (Decimal("0"), "0"), (Decimal("12.34"), "12.34")],
)
def test_gradebook_scores_read_like_the_other_pages(value, text):
    from grading.views import format_score

    assert format_score(value) == text
