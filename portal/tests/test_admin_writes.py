"""The admin's additions go through the services, which save the row the admin's form built: the admin carries
on with a saved object (log entry, redirect) without touching the model's internal state."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.contrib.admin.models import ADDITION, LogEntry
from django.test import Client
from django.urls import reverse

from conftest import PASSWORD
from portal.models import AuditEvent, Course, Membership, Role

PRODUCT_APPS = ("portal", "labs", "grading", "api", "ops", "guest")


def test_product_code_never_sets_a_model_instance_state():
    base = Path(settings.BASE_DIR)
    offenders = [
        f"{path.relative_to(base)}:{number}"
        for app in PRODUCT_APPS
        for path in sorted((base / app).rglob("*.py"))
        if "tests" not in path.parts and "migrations" not in path.parts
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if re.search(r"\._state\b", line)
    ]
    assert offenders == []


def test_an_instructor_adds_a_course_in_admin_through_the_service(instructor_a):
    client = Client()
    client.login(username=instructor_a.username, password=PASSWORD)
    response = client.post(
        reverse("admin:portal_course_add"),
        {
            "code": "SEC301",
            "title": "Security",
            "term": "2027 spring",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
    )
    course = Course.objects.get(code="SEC301")
    assert response.status_code == 302 and response.url in (
        reverse("admin:portal_course_changelist"),
        reverse("admin:portal_course_change", args=[course.pk]),
    )
    assert course.tenant == instructor_a.tenant
    assert Membership.objects.filter(course=course, user=instructor_a, role=Role.INSTRUCTOR).exists()
    assert AuditEvent.objects.filter(action="course.create", target_id=str(course.pk)).exists()
    assert LogEntry.objects.filter(action_flag=ADDITION, object_id=str(course.pk)).exists()
