"""Demo data ("Demo University", a course, the lab "Linux basics", five people), created idempotently: what exists,
edits included, is left as it is. Passwords are fixed demo ones, or ``DEMO_PASSWORD`` (required in production)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from labs.models import Check, Lab, StdoutMatch
from labs.sizes import LabSize
from portal.errors import ApplicationError
from portal.models import Course, Membership, Role, Tenant, User
from portal.services import audit_record, user_create

TENANT_NAME = "Demo University"
COURSE = {"code": "LNX101", "term": "Demo", "title": "Introduction to Linux"}
LAB_TITLE = "Linux basics"
LAB_IMAGE = "quay.io/containerdisks/debian:12"

# username, full name, role
# Manages tenants and their quotas and sees the ops dashboard; belongs to no tenant. Its password is random (or
# DEMO_PASSWORD) and printed once, when the account is made.
SUPERUSER = ("admin", "Demo operator")

PEOPLE = (
    ("instructor", "Aiko Tanaka", Role.INSTRUCTOR),
    ("ta", "Kenji Sato", Role.TA),
    ("student1", "Yui Suzuki", Role.STUDENT),
    ("student2", "Haruto Takahashi", Role.STUDENT),
    ("student3", "Mei Watanabe", Role.STUDENT),
)

LAB_INSTRUCTIONS = """\
# Linux basics

Your virtual machine runs Debian 12. (On a portal started with `bin/run` it is a real QEMU VM where QEMU is
installed, and otherwise a sandboxed shell on the portal's own machine.) Everything happens in your home
directory (`~`) in the console below.
Press **Check** whenever you like: each check says what is still missing.

## 1. A file with content

Create the file `~/hello.txt` containing the words `hello world`:

```sh
echo "hello world" > ~/hello.txt
```

## 2. A private directory

Create the directory `~/project` and make it private, readable and writable by you only (mode `700`):

```sh
mkdir -p ~/project
chmod 700 ~/project
```

## 3. A small program

Write a script `~/bin/greet.sh` that prints `hi`, and make it executable:

```sh
mkdir -p ~/bin
printf '#!/bin/sh\\necho hi\\n' > ~/bin/greet.sh
chmod +x ~/bin/greet.sh
~/bin/greet.sh
```
"""

# Checks run with the student's home as HOME and working directory, in a real guest and in kubesim's alike.
# Patterns are matched with re.search in MULTILINE mode, so "$" also matches before the trailing newline.
CHECKS = (
    {
        "order": 1,
        "title": "~/hello.txt says hello world",
        "command": "cat ~/hello.txt",
        "expected_exit_code": 0,
        "stdout_match": StdoutMatch.CONTAINS,
        "stdout_pattern": "hello world",
        "points": 1,
        "timeout_s": 10,
        "hint": 'Create ~/hello.txt containing the words hello world (echo "hello world" > ~/hello.txt).',
    },
    {
        "order": 2,
        "title": "~/project exists and is private (mode 700)",
        "command": "stat -c %a ~/project",
        "expected_exit_code": 0,
        "stdout_match": StdoutMatch.REGEX,
        "stdout_pattern": r"^700$",
        "points": 1,
        "timeout_s": 10,
        "hint": "Create the directory with mkdir ~/project, then chmod 700 ~/project.",
    },
    {
        "order": 3,
        "title": "~/bin/greet.sh is executable and prints hi",
        "command": "test -x ~/bin/greet.sh && ~/bin/greet.sh",
        "expected_exit_code": 0,
        "stdout_match": StdoutMatch.REGEX,
        "stdout_pattern": r"^hi$",
        "points": 2,
        "timeout_s": 10,
        "hint": "The script must be executable (chmod +x ~/bin/greet.sh) and print exactly hi.",
    },
)


@dataclass(frozen=True)
class DemoLogin:
    username: str
    password: str
    full_name: str
    role: str
    admin: bool
    # False when someone changed the password after seeding: the printed demo password no longer works.
    password_works: bool


@dataclass
class DemoSeed:
    tenant: Tenant
    course: Course
    lab: Lab
    created: list[str] = field(default_factory=list)
    logins: list[DemoLogin] = field(default_factory=list)
    superuser: str = ""
    # The superuser's password when this run made the account, else empty (it was printed then).
    superuser_password: str = ""


def demo_password(username: str) -> str:
    shared = os.environ.get("DEMO_PASSWORD")
    if shared:
        return shared
    if settings.PRODUCTION:
        raise ApplicationError(
            "Refusing to seed fixed demo passwords in production: set DEMO_PASSWORD to the password the demo "
            "accounts should have."
        )
    return f"{username}-demo"


@transaction.atomic
def demo_seed() -> DemoSeed:
    passwords = {username: demo_password(username) for username, _name, _role in PEOPLE}
    tenant, tenant_created = Tenant.objects.get_or_create(name=TENANT_NAME)
    course, course_created = Course.objects.get_or_create(
        tenant=tenant, code=COURSE["code"], term=COURSE["term"], defaults={"title": COURSE["title"]}
    )
    lab, lab_created = Lab.objects.get_or_create(
        course=course,
        title=LAB_TITLE,
        defaults={
            "image": LAB_IMAGE,
            "size": LabSize.SMALL,
            "time_limit_minutes": 60,
            "instructions": LAB_INSTRUCTIONS,
        },
    )
    seed = DemoSeed(tenant=tenant, course=course, lab=lab)
    seed.created += [
        label
        for label, created in (("tenant", tenant_created), ("course", course_created), ("lab", lab_created))
        if created
    ]
    if lab_created:
        for check in CHECKS:
            Check.objects.create(lab=lab, **check)
        seed.created.append(f"{len(CHECKS)} checks")

    accounts_created = memberships_created = 0
    for username, full_name, role in PEOPLE:
        user = User.objects.filter(username=username).first()
        if user is None:
            user = user_create(
                actor=None,
                tenant=tenant,
                username=username,
                email=f"{username}@demo.example",
                full_name=full_name,
                password=passwords[username],
                is_staff=role == Role.INSTRUCTOR,
            )
            accounts_created += 1
        elif user.tenant_id != tenant.id:
            raise ApplicationError(
                f"The username {username!r} already belongs to an account outside {TENANT_NAME}; the demo will "
                "not take it over."
            )
        _membership, membership_created = Membership.objects.get_or_create(
            user=user, course=course, defaults={"role": role}
        )
        memberships_created += membership_created
        seed.logins.append(
            DemoLogin(
                username=username,
                password=passwords[username],
                full_name=user.full_name,
                role=role,
                admin=user.is_staff,
                password_works=user.check_password(passwords[username]),
            )
        )

    _demo_superuser(seed)
    seed.created += [
        f"{count} {label}"
        for label, count in (("accounts", accounts_created), ("memberships", memberships_created))
        if count
    ]
    if seed.created:
        audit_record(
            actor=None, action="demo.seed", target=course, tenant=tenant, course=course, data={"created": seed.created}
        )
    return seed


def _demo_superuser(seed: DemoSeed) -> None:
    username, full_name = SUPERUSER
    seed.superuser = username
    user = User.objects.filter(username=username).first()
    if user is not None:
        if not user.is_superuser:
            raise ApplicationError(
                f"The username {username!r} belongs to an account that is not a superuser; the demo will not take it "
                "over."
            )
        return
    password = os.environ.get("DEMO_PASSWORD") or secrets.token_urlsafe(12)
    user = user_create(
        actor=None,
        tenant=None,
        username=username,
        email=f"{username}@demo.example",
        full_name=full_name,
        password=password,
        is_staff=True,
    )
    user.is_superuser = True
    user.save(update_fields=["is_superuser"])
    seed.superuser_password = password
    seed.created.append("superuser")
