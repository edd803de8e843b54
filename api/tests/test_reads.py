"""Reads of the API: what each persona sees, in lists, filters, ordering, details and exports; never another
tenant's rows, never a secret field."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.django_db


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


def test_anonymous_gets_401_in_the_error_format_with_a_token_challenge(world, client_for):
    response = client_for(None).get("/api/v1/courses/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Token")
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == "not_authenticated" and body["error"]["message"]


def test_courses_are_the_users_own_with_their_role(world, client_for, student_a, ta_a, instructor_b):
    assert ids(client_for(student_a).get("/api/v1/courses/")) == [world.course_a.id]
    assert ids(client_for(instructor_b).get("/api/v1/courses/")) == [world.course_b.id]
    (course,) = client_for(ta_a).get("/api/v1/courses/").json()["results"]
    assert course["role"] == "ta"


def test_another_tenants_course_is_not_found_not_forbidden(world, client_for, student_a):
    response = client_for(student_a).get(f"/api/v1/courses/{world.course_b.id}/")
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "not_found", "message": "Course not found."}}


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?ordering=-title",
        "?ordering=due_at,-id",
        "?page_size=1",
        "?course={course_b}",
        "?course={course_a}",
    ],
)
def test_lab_list_filters_and_ordering_never_leak_tenant_b(world, client_for, student_a, query):
    url = "/api/v1/labs/" + query.format(course_a=world.course_a.id, course_b=world.course_b.id)
    returned = ids(client_for(student_a).get(url))
    assert world.lab_b.id not in returned
    if "course_b" in query:
        assert returned == []
    else:
        assert returned == [world.lab_a.id]


@pytest.mark.parametrize("ordering", ["tenant", "course__tenant__name", "-student__password", "id;drop", "agent_token"])
def test_ordering_outside_the_allow_list_is_refused(world, client_for, student_a, ordering):
    for url in ("/api/v1/labs/", "/api/v1/attempts/", "/api/v1/grades/", "/api/v1/grading-runs/", "/api/v1/courses/"):
        response = client_for(student_a).get(url, {"ordering": ordering})
        assert response.status_code == 400, url
        assert "ordering" in response.json()["error"]["fields"]


def test_bad_filter_values_are_400_naming_the_parameter(world, client_for, student_a):
    response = client_for(student_a).get("/api/v1/attempts/", {"lab": "abc"})
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"lab": ["Give a whole number."]}
    response = client_for(student_a).get("/api/v1/attempts/", {"state": "exploded"})
    assert response.status_code == 400 and "state" in response.json()["error"]["fields"]


def test_students_see_check_titles_but_not_how_checks_are_graded(world, client_for, student_a, ta_a):
    student_view = client_for(student_a).get(f"/api/v1/labs/{world.lab_a.id}/").json()
    assert [set(check) for check in student_view["checks"]] == [{"id", "order", "title", "points"}] * 2
    assert "image" not in student_view and "extra_cloud_init" not in student_view
    staff_view = client_for(ta_a).get(f"/api/v1/labs/{world.lab_a.id}/").json()
    assert staff_view["checks"][0]["command"] == "test -f ~/hello.txt"


def test_another_tenants_lab_is_404(world, client_for, student_a, instructor_b):
    assert client_for(student_a).get(f"/api/v1/labs/{world.lab_b.id}/").status_code == 404
    assert client_for(instructor_b).get(f"/api/v1/labs/{world.lab_a.id}/").status_code == 404


def test_attempt_lists_by_persona(world, client_for, student_a, student_b, ta_a, instructor_b):
    assert ids(client_for(student_a).get("/api/v1/attempts/")) == [world.attempt_a.id]
    assert ids(client_for(ta_a).get("/api/v1/attempts/")) == [world.attempt_a.id]
    assert ids(client_for(instructor_b).get("/api/v1/attempts/")) == [world.attempt_b.id]
    assert ids(client_for(student_b).get("/api/v1/attempts/", {"student": world.attempt_a.student_id})) == []
    assert ids(client_for(student_b).get("/api/v1/attempts/", {"course": world.course_a.id})) == []
    assert ids(client_for(ta_a).get("/api/v1/attempts/", {"ordering": "-state", "state": "running"})) == [
        world.attempt_a.id
    ]


def test_agent_token_is_never_serialized_and_vm_placement_only_for_staff(world, client_for, student_a, ta_a):
    for user in (student_a, ta_a):
        for url in ("/api/v1/attempts/", f"/api/v1/attempts/{world.attempt_a.id}/"):
            response = client_for(user).get(url)
            assert response.status_code == 200
            assert world.attempt_a.agent_token not in response.content.decode()
            assert "agent_token" not in response.content.decode()
    student_view = client_for(student_a).get(f"/api/v1/attempts/{world.attempt_a.id}/").json()
    assert student_view["vm_name"] is None and student_view["namespace"] is None
    staff_view = client_for(ta_a).get(f"/api/v1/attempts/{world.attempt_a.id}/").json()
    assert staff_view["vm_name"] == world.attempt_a.vm_name
    assert staff_view["namespace"] == world.attempt_a.namespace


def test_another_tenants_attempt_run_and_grade_are_404(world, client_for, student_a, instructor_b):
    for url in (
        f"/api/v1/attempts/{world.attempt_b.id}/",
        f"/api/v1/grading-runs/{world.run_b.id}/",
        f"/api/v1/grades/{world.grade_b.id}/",
    ):
        response = client_for(student_a).get(url)
        assert response.status_code == 404, url
        assert response.json()["error"]["code"] == "not_found"
    assert client_for(instructor_b).get(f"/api/v1/attempts/{world.attempt_a.id}/").status_code == 404


def test_check_output_is_for_staff_only(world, client_for, student_a, ta_a):
    student_run = client_for(student_a).get(f"/api/v1/grading-runs/{world.run_a.id}/").json()
    failed = [r for r in student_run["results"] if not r["passed"]]
    assert failed and failed[0]["feedback"]
    assert all(r["stdout"] is None and r["exit_code"] is None for r in student_run["results"])
    staff_run = client_for(ta_a).get(f"/api/v1/grading-runs/{world.run_a.id}/").json()
    assert "goodbye" in "".join(r["stdout"] for r in staff_run["results"])


def test_runs_and_grades_lists_keep_to_the_tenant(world, client_for, student_a, instructor_b):
    assert ids(client_for(student_a).get("/api/v1/grading-runs/")) == [world.run_a.id]
    assert ids(client_for(student_a).get("/api/v1/grading-runs/", {"lab": world.lab_b.id})) == []
    assert ids(client_for(student_a).get("/api/v1/grades/")) == [world.grade_a.id]
    assert ids(client_for(instructor_b).get("/api/v1/grades/", {"ordering": "-score"})) == [world.grade_b.id]
    assert ids(client_for(instructor_b).get("/api/v1/grades/", {"course": world.course_a.id})) == []


def test_gradebook_report_for_staff(world, client_for, ta_a, student_a, instructor_b):
    response = client_for(ta_a).get(f"/api/v1/courses/{world.course_a.id}/report/")
    assert response.status_code == 200
    report = response.json()
    assert [row["student"]["username"] for row in report["rows"]] == ["student_a"]
    assert report["rows"][0]["cells"][0]["final"] == "1.00"
    assert client_for(student_a).get(f"/api/v1/courses/{world.course_a.id}/report/").status_code == 403
    assert client_for(instructor_b).get(f"/api/v1/courses/{world.course_a.id}/report/").status_code == 404


def test_lab_report_for_staff(world, client_for, ta_a, student_a, instructor_b):
    report = client_for(ta_a).get(f"/api/v1/labs/{world.lab_a.id}/report/").json()
    assert report["enrolled"] == 1 and report["graded"] == 1 and report["max_points"] == "3.00"
    assert sum(bucket["count"] for bucket in report["distribution"]) == 1
    assert client_for(student_a).get(f"/api/v1/labs/{world.lab_a.id}/report/").status_code == 403
    assert client_for(instructor_b).get(f"/api/v1/labs/{world.lab_a.id}/report/").status_code == 404


def test_gradebook_csv_is_staff_only_tenant_bound_and_spreadsheet_safe(
    world, client_for, ta_a, student_a, instructor_b, student_b
):
    student_a.full_name = '=HYPERLINK("http://evil.example")'
    student_a.save(update_fields=["full_name"])
    response = client_for(ta_a).get(f"/api/v1/courses/{world.course_a.id}/report.csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    text = response.content.decode()
    assert "student_a" in text and "student_b" not in text
    assert "'=HYPERLINK" in text
    assert client_for(student_a).get(f"/api/v1/courses/{world.course_a.id}/report.csv").status_code == 403
    refused = client_for(instructor_b).get(f"/api/v1/courses/{world.course_a.id}/report.csv")
    assert refused.status_code == 404 and json.loads(refused.content)["error"]["code"] == "not_found"


def test_audit_log_for_the_courses_instructors_only(world, client_for, instructor_a, ta_a, student_a, instructor_b):
    response = client_for(instructor_a).get(f"/api/v1/courses/{world.course_a.id}/audit/")
    assert ids(response) == [world.audit_a.id]
    event = response.json()["results"][0]
    assert event["action"] == "attempt.start" and event["actor"]["username"] == "student_a"
    assert client_for(ta_a).get(f"/api/v1/courses/{world.course_a.id}/audit/").status_code == 403
    assert client_for(student_a).get(f"/api/v1/courses/{world.course_a.id}/audit/").status_code == 403
    assert client_for(instructor_b).get(f"/api/v1/courses/{world.course_a.id}/audit/").status_code == 404
    filtered = client_for(instructor_a).get(f"/api/v1/courses/{world.course_a.id}/audit/", {"action": "x"})
    assert ids(filtered) == []


def test_pagination_shape(world, client_for, student_a):
    body = client_for(student_a).get("/api/v1/labs/", {"page_size": 1}).json()
    assert set(body) == {"count", "next", "previous", "results"} and body["count"] == 1
    assert client_for(student_a).get("/api/v1/labs/", {"page": 99}).status_code == 404


def test_superusers_see_every_course_as_instructors(world, client_for, superuser):
    courses = client_for(superuser).get("/api/v1/courses/").json()["results"]
    assert {course["id"]: course["role"] for course in courses} == {
        world.course_a.id: "instructor",
        world.course_b.id: "instructor",
    }


@pytest.mark.parametrize(
    "url", ["/api/v1/attempts/", "/api/v1/grading-runs/", "/api/v1/grades/", "/api/v1/labs/", "/api/v1/courses/"]
)
def test_lists_cost_the_same_queries_for_one_row_or_many(world, client_for, ta_a, student_a, url):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conftest import make_lab, make_person
    from grading.tests.builders import ALL_PASS, make_attempt, record_run
    from labs.models import AttemptState
    from portal.models import Membership, Role

    client = client_for(ta_a)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    for number in range(4):
        lab = make_lab(world.course_a, title=f"Extra lab {number}")
        student = make_person(
            username=f"extra_{number}", tenant=world.course_a.tenant, course=world.course_a, role=Role.STUDENT
        )
        record_run(attempt=make_attempt(lab=lab, student=student, state=AttemptState.RUNNING), outputs=ALL_PASS)
    assert Membership.objects.filter(course=world.course_a).count() > 4
    with CaptureQueriesContext(connection) as many:
        response = client.get(url)
    assert response.status_code == 200
    assert len(many) == len(few), [query["sql"] for query in many]
