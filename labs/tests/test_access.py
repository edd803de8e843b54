"""Who sees which labs and attempts, for every persona, decided by ``labs.access`` alone (pages, API, consumers and
grading ask it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conftest import make_lab, make_person
from grading.tests.builders import make_attempt
from labs import access
from labs.models import AttemptState
from portal.errors import NotFound
from portal.models import Role

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(course_a, lab_a, lab_b, student_a, ta_a, instructor_a, student_b, superuser):
    other_course_student = make_person(
        username="student_a2", tenant=course_a.tenant, course=course_a, role=Role.STUDENT
    )
    return {
        "mine": make_attempt(lab=lab_a, student=student_a),
        "classmate": make_attempt(lab=lab_a, student=other_course_student, state=AttemptState.STOPPED),
        "other_tenant": make_attempt(lab=lab_b, student=student_b),
    }


PERSONAS = {
    # persona: (attempts seen, labs seen as "a", "b")
    "student_a": ({"mine"}, {"a"}),
    "ta_a": ({"mine", "classmate"}, {"a"}),
    "instructor_a": ({"mine", "classmate"}, {"a"}),
    "student_b": ({"other_tenant"}, {"b"}),
    "superuser": ({"mine", "classmate", "other_tenant"}, {"a", "b"}),
}


@pytest.mark.parametrize("persona", PERSONAS)
def test_each_persona_sees_exactly_its_attempts_and_labs(persona, world, request, lab_a, lab_b):
    user = request.getfixturevalue(persona)
    attempts, labs = PERSONAS[persona]
    names = {attempt.id: name for name, attempt in world.items()}
    assert {names[pk] for pk in access.attempts_visible_to(user=user).values_list("id", flat=True)} == attempts
    for name, attempt in world.items():
        if name in attempts:
            assert access.attempt_get_for_user(user=user, attempt_id=attempt.id) == attempt
        else:
            with pytest.raises(NotFound):
                access.attempt_get_for_user(user=user, attempt_id=attempt.id)
    seen = {lab.id for lab in access.labs_visible_to(user=user)}
    assert seen == {{"a": lab_a.id, "b": lab_b.id}[name] for name in labs}


def test_a_student_of_the_lab_may_start_it_staff_and_other_tenants_may_not(lab_a, student_a, ta_a, student_b):
    assert access.lab_get_for_student(user=student_a, lab_id=lab_a.id) == lab_a
    for user in (ta_a, student_b):
        with pytest.raises(NotFound):
            access.lab_get_for_student(user=user, lab_id=lab_a.id)


def test_staff_lookups_see_their_courses_only(world, lab_a, course_a, ta_a, student_a, instructor_b):
    other_lab = make_lab(course_a, title="Networking")
    assert set(access.labs_for_staff(user=ta_a)) == {lab_a, other_lab}
    assert access.attempt_get_for_staff(user=ta_a, attempt_id=world["classmate"].id) == world["classmate"]
    for user, attempt in ((student_a, world["mine"]), (instructor_b, world["mine"]), (ta_a, world["other_tenant"])):
        with pytest.raises(NotFound):
            access.attempt_get_for_staff(user=user, attempt_id=attempt.id)


def test_an_api_token_sees_what_its_user_sees(world, student_a):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=student_a).key}")
    response = client.get("/api/v1/attempts/")
    assert response.status_code == 200
    assert [row["id"] for row in response.json()["results"]] == [world["mine"].id]


# Functions that decide which labs or attempts a person may see are defined in labs/access.py only.
ACCESS_FUNCTION_PREFIXES = (
    "attempts_for_",
    "attempts_visible_",
    "attempt_get_for_",
    "attempt_own",
    "labs_for_",
    "labs_visible_",
    "lab_get_for_",
)


def test_access_rules_are_defined_in_labs_access_only():
    base = Path(settings.BASE_DIR)
    defined = []
    for app in ("portal", "labs", "grading", "api"):
        for path in sorted((base / app).rglob("*.py")):
            if "tests" in path.parts or "migrations" in path.parts or path == base / "labs" / "access.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef) and node.name.startswith(ACCESS_FUNCTION_PREFIXES):
                    defined.append(f"{path.relative_to(base)}: {node.name}")
    assert defined == []
