"""The course audit page: instructors of the course read who did what; nobody else does."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.services import audit_record

pytestmark = pytest.mark.django_db


def page(user, course_id: int, **query):
    client = Client()
    if user is not None:
        client.force_login(user)
    return client.get(f"/courses/{course_id}/audit/", query)


def test_instructor_reads_who_did_what_and_when(world, instructor_a, ta_a):
    audit_record(
        actor=ta_a,
        action="grading.override_set",
        target=world.grade_a,
        tenant=world.course_a.tenant,
        course=world.course_a,
        data={"override": "2.50", "reason": "Partial credit"},
    )
    response = page(instructor_a, world.course_a.id)
    assert response.status_code == 200
    text = response.content.decode()
    assert "started an attempt" in text and "overrode a grade" in text and "Partial credit" in text
    assert "Ta A" in text and "Student A" in text
    # Tenant B's event never shows.
    assert f'data-event="{world.audit_b.id}"' not in text and f'data-event="{world.audit_a.id}"' in text


def test_filter_by_action(world, instructor_a, ta_a):
    audit_record(
        actor=ta_a, action="attempt.stop", target=world.attempt_a, tenant=world.course_a.tenant, course=world.course_a
    )
    text = page(instructor_a, world.course_a.id, action="attempt.stop").content.decode()
    assert "stopped an attempt" in text and f'data-event="{world.audit_a.id}"' not in text


def test_others_are_refused(world, ta_a, student_a, instructor_b):
    assert page(ta_a, world.course_a.id).status_code == 403
    assert page(student_a, world.course_a.id).status_code == 403
    assert page(instructor_b, world.course_a.id).status_code == 404
    anonymous = page(None, world.course_a.id)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")


def test_details_read_as_words_and_times_in_the_readers_zone(world, instructor_a):
    instructor_a.time_zone = "Asia/Tokyo"
    instructor_a.save(update_fields=["time_zone"])
    audit_record(
        actor=instructor_a,
        action="attempt.extend",
        target=world.attempt_a,
        tenant=world.course_a.tenant,
        course=world.course_a,
        data={"to": "2026-12-05T11:32:49.241194+00:00", "created": [["ann", "student"], ["bo", "ta"]], "was": None},
    )
    audit_record(
        actor=instructor_a,
        action="admin.lab.change",
        target=world.lab_a,
        tenant=world.course_a.tenant,
        course=world.course_a,
        data={"reason": "2026-02-30T10:00:00+00:00"},  # shaped like a time, but none
    )
    text = page(instructor_a, world.course_a.id).content.decode()
    assert "to: Dec 5, 2026, 8:32 PM JST" in text and "2026-12-05T11:32" not in text
    assert "created: ann student, bo ta" in text and "was: —" in text and "[" not in text.split("audit-log")[1]
    assert "changed a lab" in text and "reason: 2026-02-30T10:00:00+00:00" in text
