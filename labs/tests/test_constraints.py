"""Database-enforced rules on attempts."""

import pytest
from django.db import IntegrityError, transaction

from labs.models import Attempt, AttemptState


@pytest.mark.django_db
def test_second_active_attempt_for_same_student_and_lab_is_rejected_by_the_database(lab_a, student_a):
    Attempt.objects.create(lab=lab_a, student=student_a, tenant=lab_a.course.tenant, state=AttemptState.RUNNING)
    with pytest.raises(IntegrityError), transaction.atomic():
        Attempt.objects.create(lab=lab_a, student=student_a, tenant=lab_a.course.tenant, number=2)


@pytest.mark.django_db
def test_finished_attempts_do_not_block_a_new_one(lab_a, student_a):
    for state in (AttemptState.STOPPED, AttemptState.FAILED, AttemptState.EXPIRED):
        Attempt.objects.create(lab=lab_a, student=student_a, tenant=lab_a.course.tenant, state=state)
    Attempt.objects.create(lab=lab_a, student=student_a, tenant=lab_a.course.tenant)
    assert Attempt.objects.filter(lab=lab_a, student=student_a).count() == 4
