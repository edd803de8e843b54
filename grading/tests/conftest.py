"""Fixtures for grading against kubesim, and Celery running tasks in the caller (as a worker would, minus the
broker)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grading.tests.guests import delete_vm, new_attempt_on_cluster
from labs.models import Attempt


@pytest.fixture
def running_attempt(cluster, lab_a, student_a) -> Iterator[Attempt]:
    """student_a's running attempt at lab_a, on kubesim, with the real agent answering through portforward."""
    attempt = new_attempt_on_cluster(lab=lab_a, student=student_a)
    yield attempt
    delete_vm(attempt)


@pytest.fixture
def eager_celery() -> Iterator[None]:
    """Tasks sent with apply_async run in the caller, so on-commit task sends execute the real task body."""
    from portal.celery import app

    previous = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = previous


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    """Personas are created by the dozen here; a deliberately slow hasher would dominate the run time."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
