"""Shared test fixtures: personas in two tenants, and a kubesim cluster started as a real server."""

from __future__ import annotations

import os

import pytest

from labs.models import Check, Lab, StdoutMatch
from portal.models import Course, Membership, Role, Tenant, User

PASSWORD = "correct-horse-battery-staple"


@pytest.fixture(autouse=True)
def default_language():
    """Each test starts in the default language. A request in Japanese leaves its language active in the thread
    (LocaleMiddleware activates it and nothing deactivates it), so without this the next test would run in it."""
    from django.utils import translation

    yield
    translation.deactivate()


@pytest.fixture(autouse=True)
def celery_join_allowed():
    """Each test starts outside any task. In eager mode Celery marks "inside a task" in one process-wide flag that
    each eager task sets and restores on exit; eager tasks that overlap in threads (tests that deliver a task twice
    at once) can restore it in the wrong order and leave it set, and every later ``result.get()`` in the process
    then raises "Never call result.get() within a task!"."""
    from celery._state import _set_task_join_will_block

    _set_task_join_will_block(False)
    yield


@pytest.fixture
def tenant_a(db) -> Tenant:
    return Tenant.objects.create(name="Tenant A University", max_concurrent_vms=10, max_vcpus=20)


@pytest.fixture
def tenant_b(db) -> Tenant:
    return Tenant.objects.create(name="Tenant B College", max_concurrent_vms=10, max_vcpus=20)


@pytest.fixture
def course_a(tenant_a) -> Course:
    return Course.objects.create(tenant=tenant_a, code="LNX101", title="Linux basics", term="2026 fall")


@pytest.fixture
def course_b(tenant_b) -> Course:
    return Course.objects.create(tenant=tenant_b, code="NET201", title="Networks", term="2026 fall")


def make_person(
    *, username: str, tenant: Tenant, course: Course | None, role: str | None, is_staff: bool = False
) -> User:
    user = User.objects.create_user(
        username=username,
        password=PASSWORD,
        email=f"{username}@example.test",
        tenant=tenant,
        full_name=username.replace("_", " ").title(),
        is_staff=is_staff,
    )
    if course is not None and role is not None:
        Membership.objects.create(user=user, course=course, role=role)
    return user


@pytest.fixture
def instructor_a(tenant_a, course_a) -> User:
    return make_person(username="instructor_a", tenant=tenant_a, course=course_a, role=Role.INSTRUCTOR, is_staff=True)


@pytest.fixture
def ta_a(tenant_a, course_a) -> User:
    return make_person(username="ta_a", tenant=tenant_a, course=course_a, role=Role.TA)


@pytest.fixture
def student_a(tenant_a, course_a) -> User:
    return make_person(username="student_a", tenant=tenant_a, course=course_a, role=Role.STUDENT)


@pytest.fixture
def instructor_b(tenant_b, course_b) -> User:
    return make_person(username="instructor_b", tenant=tenant_b, course=course_b, role=Role.INSTRUCTOR, is_staff=True)


@pytest.fixture
def student_b(tenant_b, course_b) -> User:
    return make_person(username="student_b", tenant=tenant_b, course=course_b, role=Role.STUDENT)


@pytest.fixture
def superuser(db) -> User:
    return User.objects.create_superuser(username="root_admin", password=PASSWORD, email="root@example.test")


def make_lab(course: Course, *, title: str = "Linux basics", **fields) -> Lab:
    lab = Lab.objects.create(
        course=course,
        title=title,
        image="quay.io/containerdisks/fedora:41",
        instructions="# Linux basics\n\nCreate `~/hello.txt` containing `hello world`.",
        **fields,
    )
    Check.objects.create(
        lab=lab,
        order=1,
        title="hello.txt exists",
        command="test -f ~/hello.txt",
        points=1,
        hint="Create the file in your home directory.",
    )
    Check.objects.create(
        lab=lab,
        order=2,
        title="hello.txt says hello world",
        command="cat ~/hello.txt",
        stdout_match=StdoutMatch.CONTAINS,
        stdout_pattern="hello world",
        points=2,
        hint="The file must contain the words hello world.",
    )
    return lab


@pytest.fixture
def lab_a(course_a) -> Lab:
    return make_lab(course_a)


@pytest.fixture
def lab_b(course_b) -> Lab:
    return make_lab(course_b, title="Routing")


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database; before it is dropped, the sessions other threads still hold on it are ended.
    asgiref runs an async test's ``sync_to_async`` calls on a thread of its own that lives as long as the process,
    and that thread's connection made the drop fail ("being accessed by other users"), leaving the database behind
    whenever such a test was among the last to run."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(scope="session")
def kubesim_server(tmp_path_factory):
    """One kubesim for the session, started as a subprocess and spoken to over HTTP, as production would."""
    from kubesim.testing import KubesimServer

    with KubesimServer(tmp_path_factory.mktemp("kubesim")) as server:
        yield server


@pytest.fixture
def cluster(kubesim_server, settings):
    """Point the portal's cluster client at the session's kubesim."""
    from labs.kubevirt import client as kube_client

    settings.KUBECONFIG = str(kubesim_server.kubeconfig)
    kube_client.reset()
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)
    yield kubesim_server
    kube_client.reset()
