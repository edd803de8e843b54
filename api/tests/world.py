"""Two tenants with everything the API serves: a running attempt, a recorded grading run, a grade and an audit
event in each, built on the shared personas. Used by the API tests and the isolation matrix."""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass

from django.conf import settings

from grading.models import Grade, GradingRun
from grading.tests.builders import ALL_PASS, FIRST_ONLY, make_attempt, record_run
from labs.models import Attempt, Lab
from portal.models import AuditEvent, Course, User
from portal.services import audit_record

SECRET_TOKEN_A = "agent-token-of-attempt-a-never-shown"


@dataclass
class World:
    course_a: Course
    course_b: Course
    lab_a: Lab
    lab_b: Lab
    attempt_a: Attempt
    attempt_b: Attempt
    run_a: GradingRun
    run_b: GradingRun
    grade_a: Grade
    grade_b: Grade
    audit_a: AuditEvent
    audit_b: AuditEvent


def build_world(
    *, lab_a: Lab, lab_b: Lab, student_a: User, student_b: User, instructor_a: User, instructor_b: User
) -> World:
    attempt_a = make_attempt(lab=lab_a, student=student_a, agent_token=SECRET_TOKEN_A)
    attempt_b = make_attempt(lab=lab_b, student=student_b)
    run_a = record_run(attempt=attempt_a, outputs=FIRST_ONLY)
    run_b = record_run(attempt=attempt_b, outputs=ALL_PASS)
    grade_a = Grade.objects.get(lab=lab_a, student=student_a)
    grade_b = Grade.objects.get(lab=lab_b, student=student_b)
    audit_a = audit_record(
        actor=student_a,
        action="attempt.start",
        target=attempt_a,
        tenant=lab_a.course.tenant,
        course=lab_a.course,
        data={"lab": lab_a.id},
    )
    audit_b = audit_record(
        actor=student_b,
        action="attempt.start",
        target=attempt_b,
        tenant=lab_b.course.tenant,
        course=lab_b.course,
        data={"lab": lab_b.id},
    )
    return World(
        course_a=lab_a.course,
        course_b=lab_b.course,
        lab_a=lab_a,
        lab_b=lab_b,
        attempt_a=attempt_a,
        attempt_b=attempt_b,
        run_a=run_a,
        run_b=run_b,
        grade_a=grade_a,
        grade_b=grade_b,
        audit_a=audit_a,
        audit_b=audit_b,
    )


def fresh_cache_settings() -> dict:
    """CACHES with a key prefix of its own (under the run's), so rate-limit counters never carry over from another
    test and the run's clean-up still finds them."""
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["KEY_PREFIX"] = f"{settings.REDIS_KEY_PREFIX}test-{uuid.uuid4().hex}"
    return caches
