"""An institution's cap on the labs one student may have going at once (``Tenant.max_vms_per_student``)."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from conftest import make_lab
from labs.models import Attempt, AttemptState
from labs.services import attempt_start
from labs.tests.conftest import start_together
from portal.errors import Conflict
from portal.models import AuditEvent, Tenant


def cap(tenant: Tenant, labs: int) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(max_vms_per_student=labs)


def going(student, lab, state: str = AttemptState.RUNNING) -> Attempt:
    return Attempt.objects.create(lab=lab, student=student, tenant=lab.course.tenant, state=state)


@pytest.mark.django_db
def test_a_student_at_the_cap_must_stop_a_lab_before_starting_another(student_a, lab_a, course_a, monkeypatch):
    monkeypatch.setattr("labs.tasks.provision_attempt.delay", lambda attempt_id: None)
    second, third = make_lab(course_a, title="Second"), make_lab(course_a, title="Third")
    cap(course_a.tenant, 2)
    going(student_a, lab_a)
    going(student_a, second, state=AttemptState.STOPPING)  # its VM is still there: it counts

    with pytest.raises(Conflict) as info:
        attempt_start(actor=student_a, lab=third)
    assert info.value.code == "too_many_running" and info.value.status_code == 409
    assert info.value.retry_after is None  # waiting would not help
    # One of them is on its way out already: the student is told to wait for it rather than to stop one.
    assert info.value.message == (
        "You already have 2 labs going, as many as your institution allows one person at "
        "once, and one of them is stopping: try again once it has ended."
    )
    assert not Attempt.objects.filter(lab=third).exists()
    assert not AuditEvent.objects.filter(action="attempt.start").exists()  # rolled back with the attempt

    Attempt.objects.filter(lab=second).update(state=AttemptState.RUNNING)
    with pytest.raises(Conflict) as info:
        attempt_start(actor=student_a, lab=third)
    assert info.value.message == (
        "You already have 2 labs going, as many as your institution allows one person at "
        "once. Stop one of them to start this one."
    )

    Attempt.objects.filter(lab=second).update(state=AttemptState.STOPPED)
    assert attempt_start(actor=student_a, lab=third).state == AttemptState.REQUESTED


@pytest.mark.django_db
def test_the_cap_counts_one_student_not_the_class_and_zero_means_none(student_a, lab_a, course_a, monkeypatch):
    from conftest import make_person
    from portal.models import Role

    monkeypatch.setattr("labs.tasks.provision_attempt.delay", lambda attempt_id: None)
    second = make_lab(course_a, title="Second")
    classmate = make_person(username="classmate", tenant=course_a.tenant, course=course_a, role=Role.STUDENT)
    going(classmate, lab_a)
    going(classmate, second)
    cap(course_a.tenant, 1)
    assert attempt_start(actor=student_a, lab=lab_a).state == AttemptState.REQUESTED  # the classmate's are theirs

    with pytest.raises(Conflict) as info:
        attempt_start(actor=student_a, lab=second)
    assert info.value.message == (
        "You already have 1 lab going, as many as your institution allows one person at "
        "once. Stop it to start this one."
    )
    cap(course_a.tenant, 0)
    assert attempt_start(actor=student_a, lab=second).state == AttemptState.REQUESTED


@pytest.mark.django_db(transaction=True)
def test_two_starts_of_one_student_at_the_same_moment_get_one_lab_under_a_cap_of_one(student_a, course_a, monkeypatch):
    monkeypatch.setattr("labs.tasks.provision_attempt.delay", lambda attempt_id: None)
    labs = [make_lab(course_a, title=f"Lab {index}") for index in range(4)]
    cap(course_a.tenant, 1)
    outcomes = start_together([(student_a, lab) for lab in labs], timeout=60)
    started = [o for o in outcomes if isinstance(o, Attempt)]
    refused = [o for o in outcomes if isinstance(o, Conflict) and o.code == "too_many_running"]
    assert len(started) == 1 and len(refused) == len(labs) - 1, outcomes
    assert Attempt.objects.filter(student=student_a).count() == 1


@pytest.mark.django_db
def test_the_lab_page_says_why_and_superusers_set_the_cap(student_a, lab_a, course_a, superuser):
    second = make_lab(course_a, title="Second")
    client = Client()
    client.force_login(student_a)
    page_url = reverse("labs:lab_detail", args=[second.pk])
    going(student_a, lab_a)
    assert 'id="start-button"' in client.get(page_url).content.decode()  # no cap: Start is offered
    cap(course_a.tenant, 1)
    page = client.get(page_url).content.decode()
    assert 'id="start-button"' not in page  # at the cap: the page says why instead
    assert "You already have 1 lab going, as many as your institution allows one person at once." in page
    # Stopping the other lab elsewhere brings Start back: the page looks again by itself, with its one script.
    assert 'data-recheck-in="60"' in page
    scripts = [url.rsplit("/", 1)[-1] for url in re.findall(r'<script src="([^"]+)"', page)]
    assert scripts == ["start_recheck.js"]
    refused = client.post(reverse("labs:attempt_start", args=[second.pk]), HTTP_ACCEPT="application/json")
    assert refused.status_code == 409 and "Retry-After" not in refused
    assert refused.json()["code"] == "too_many_running"

    admin = Client()
    admin.force_login(superuser)
    url = reverse("admin:portal_tenant_change", args=[course_a.tenant_id])
    assert 'name="max_vms_per_student"' in admin.get(url).content.decode()
    data = {
        "name": course_a.tenant.name,
        "max_concurrent_vms": 10,
        "max_vcpus": 20,
        "max_memory_mib": 1024,
        "time_zone": "",
        "max_vms_per_student": 3,
    }
    assert admin.post(url, data).status_code == 302
    assert Tenant.objects.get(pk=course_a.tenant_id).max_vms_per_student == 3


def test_the_tenant_form_says_what_a_zero_means_for_each_limit(superuser, tenant_a):
    admin = Client()
    admin.force_login(superuser)
    page = admin.get(reverse("admin:portal_tenant_change", args=[tenant_a.pk])).content.decode()
    assert "0: no lab can start." in page  # the tenant's VMs
    assert "0: no limit of its own." in page  # one student's
