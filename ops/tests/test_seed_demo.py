"""seed_demo: creates the demo world once, changes nothing when run again, prints working logins, and its
lab's checks pass in a guest shell (the real agent's check runner, HOME = the student's home) after the
instructions are followed, and fail before."""

from __future__ import annotations

import re
import subprocess
from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import CommandError, call_command

from grading.evaluation import evaluate_check
from guest.agent import run_check
from labs.models import Check, Lab
from ops import demo
from portal.models import AuditEvent, Course, Membership, Role, Tenant, User


def seed(**options) -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out, **options)
    return out.getvalue()


def login_lines(output: str) -> list[str]:
    return output.split("Logins (username / password):\n", 1)[1].splitlines()


def world_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in (Tenant, Course, Lab, Check, User, Membership)}


@pytest.mark.django_db
def test_seed_creates_the_demo_and_prints_working_logins(monkeypatch):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    output = seed(url="http://127.0.0.1:8123")
    assert "http://127.0.0.1:8123/admin/" in output
    assert world_counts() == {"Tenant": 1, "Course": 1, "Lab": 1, "Check": 3, "User": 6, "Membership": 5}

    tenant = Tenant.objects.get(name="Demo University")
    lab = Lab.objects.get(title="Linux basics", course__tenant=tenant)
    assert (lab.image, lab.size, lab.time_limit_minutes) == ("quay.io/containerdisks/debian:12", "small", 60)
    assert lab.instructions.startswith("# Linux basics")
    roles = sorted(Membership.objects.filter(course=lab.course).values_list("role", flat=True))
    assert roles == sorted([Role.INSTRUCTOR, Role.TA, Role.STUDENT, Role.STUDENT, Role.STUDENT])

    lines = login_lines(output)
    assert len(lines) == 5
    for line in lines:
        username, password = line.split()[:2]
        user = authenticate(username=username, password=password)
        assert user is not None and user.tenant == tenant, line
    assert User.objects.get(username="instructor").is_staff
    assert not User.objects.get(username="ta").is_staff


@pytest.mark.django_db
def test_running_again_changes_nothing_and_prints_the_same_logins(monkeypatch):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    first = seed()
    hashes = dict(User.objects.values_list("username", "password"))
    counts, events = world_counts(), AuditEvent.objects.count()
    # An instructor's edit to the demo lab survives a re-run.
    Check.objects.filter(order=1).update(hint="Edited by the instructor")

    second = seed()
    assert "nothing changed" in second
    assert login_lines(second) == login_lines(first)
    assert world_counts() == counts
    assert AuditEvent.objects.count() == events
    assert dict(User.objects.values_list("username", "password")) == hashes
    assert Check.objects.get(order=1).hint == "Edited by the instructor"


@pytest.mark.django_db
def test_a_changed_password_is_reported_not_reset(monkeypatch):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    seed()
    student = User.objects.get(username="student1")
    student.set_password("my-own-secret-pass")
    student.save()
    output = seed()
    assert "no longer works" in next(line for line in login_lines(output) if line.split()[0] == "student1")
    assert authenticate(username="student1", password="my-own-secret-pass") is not None


@pytest.mark.django_db
def test_production_needs_demo_password(settings, monkeypatch):
    settings.PRODUCTION = True
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    with pytest.raises(CommandError, match="DEMO_PASSWORD"):
        seed()
    assert not Tenant.objects.filter(name="Demo University").exists()
    monkeypatch.setenv("DEMO_PASSWORD", "a-chosen-demo-password")
    output = seed()
    assert all(line.split()[1] == "a-chosen-demo-password" for line in login_lines(output))
    assert authenticate(username="ta", password="a-chosen-demo-password") is not None


@pytest.mark.django_db
def test_a_username_taken_elsewhere_is_not_taken_over(tenant_b, monkeypatch):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    User.objects.create_user(username="student2", tenant=tenant_b, password="theirs-theirs")
    with pytest.raises(CommandError, match="student2"):
        seed()
    # All or nothing: the failed run left no half-made demo behind.
    assert not Tenant.objects.filter(name="Demo University").exists()
    assert User.objects.get(username="student2").tenant == tenant_b


@pytest.mark.django_db
def test_the_demo_superuser_gets_a_random_password_shown_once(monkeypatch):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    first = seed()
    username, password = re.search(r"shown this once: (\S+) / (\S+)", first).groups()
    admin = authenticate(username=username, password=password)
    assert admin is not None and admin.is_superuser and admin.is_staff and admin.tenant is None
    assert password != f"{username}-demo" and len(password) >= 16
    second = seed()
    assert password not in second and f"Superuser: {username}" in second
    assert authenticate(username=username, password=password) is not None  # not reset by the second run
    # Another run's database gets another password.
    User.objects.filter(username=username).delete()
    assert password not in seed()


@pytest.mark.django_db
def test_an_admin_username_that_is_not_a_superuser_is_not_taken_over(monkeypatch):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    User.objects.create_user(username="admin", password="theirs-theirs")
    with pytest.raises(CommandError, match="admin"):
        seed()
    assert not User.objects.get(username="admin").is_superuser


def run_demo_checks(home: str) -> list[bool]:
    verdicts = []
    for definition in demo.CHECKS:
        check = Check(**definition)
        result = run_check(
            check_id=str(check.order),
            command=check.command,
            timeout_s=check.timeout_s,
            home=home,
            groups=set(),
        )
        verdicts.append(evaluate_check(check=check, result=result).passed)
    return verdicts


def test_demo_checks_fail_before_and_pass_after_following_the_instructions(tmp_path):
    home = tmp_path / "student"
    home.mkdir()
    assert run_demo_checks(str(home)) == [False, False, False]

    # Follow the lab's own instructions: every ```sh block, in order, in the student's home.
    blocks = re.findall(r"```sh\n(.*?)```", demo.LAB_INSTRUCTIONS, flags=re.DOTALL)
    assert len(blocks) == 3
    for block in blocks:
        subprocess.run(
            ["bash", "-e", "-c", block],
            cwd=home,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
            check=True,
            capture_output=True,
            timeout=30,
        )
    assert run_demo_checks(str(home)) == [True, True, True]

    # A near miss still fails: the directory readable by others.
    (home / "project").chmod(0o755)
    assert run_demo_checks(str(home)) == [True, False, True]
