"""Enrollment import: an instructor's CSV of people into a course, all or nothing, with an audit record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import IO

from django.db import IntegrityError, transaction
from django.db.models.functions import Lower
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from portal.enrollment import EnrollmentFileInvalid, EnrollmentRow, RowError, enrollment_rows_read
from portal.errors import ApplicationError, Conflict
from portal.models import Course, Membership, Role, User
from portal.services import PasswordSetupToken, audit_record, grant_admin_access


@dataclass
class ImportedPerson:
    line: int
    user: User
    role: Role
    account_created: bool
    membership_created: bool
    # Only for accounts created by this import: the way their owner sets a password and logs in.
    password_setup: PasswordSetupToken | None = None


@dataclass
class ImportResult:
    people: list[ImportedPerson] = field(default_factory=list)

    @property
    def accounts_created(self) -> int:
        return sum(person.account_created for person in self.people)

    @property
    def memberships_created(self) -> int:
        return sum(person.membership_created for person in self.people)

    @property
    def unchanged(self) -> int:
        return sum(not person.membership_created for person in self.people)


def _enrollment_errors_against_database(
    *, course: Course, rows: list[EnrollmentRow]
) -> tuple[list[RowError], dict[str, User], dict[int, str]]:
    """Problems only the database can reveal, and the existing accounts and roles the import will reuse."""
    by_lower: dict[str, list[User]] = {}
    for found in User.objects.annotate(username_lower=Lower("username")).filter(
        username_lower__in={row.username.lower() for row in rows}
    ):
        by_lower.setdefault(found.username.lower(), []).append(found)
    existing = {user.username: user for users in by_lower.values() for user in users}
    roles = dict(Membership.objects.filter(course=course, user__in=existing.values()).values_list("user_id", "role"))

    errors: list[RowError] = []
    for row in rows:
        user = existing.get(row.username)
        values = {"username": row.username}
        if user is None:
            near = by_lower.get(row.username.lower())
            if not near:
                continue
            message = _("an account named “%(existing)s” already exists; use exactly that username, or another one")
            values["existing"] = near[0].username
        elif user.tenant_id != course.tenant_id:
            # Usernames are unique across the platform; say no more than that about someone else's account.
            message = _("the username “%(username)s” is already taken; choose another")
        elif user.email and user.email.casefold() != row.email.casefold():
            message = _(
                "“%(username)s” is an existing account with another email address (%(email)s); check that this "
                "row means that person"
            )
            values["email"] = user.email
        elif not user.is_active:
            message = _("the account “%(username)s” is deactivated; reactivate it first")
        elif user.id in roles and roles[user.id] != row.role:
            message = _(
                "“%(username)s” is already in this course as %(current)s; change the role on the membership "
                "instead of importing"
            )
            values["current"] = str(Role(roles[user.id]).label)
        else:
            continue
        errors.append(RowError(row.line, message % values))
    return errors, existing, roles


def _enrollment_rejected(errors: list[RowError]) -> ApplicationError:
    lines = {error.line for error in errors}
    return ApplicationError(
        ngettext(
            "Nothing was imported: %(count)d line of the file has a problem.",
            "Nothing was imported: %(count)d lines of the file have problems.",
            len(lines),
        )
        % {"count": len(lines)},
        code="enrollment_invalid",
        extra={"errors": [asdict(error) for error in errors]},
    )


def enrollment_import(*, actor: User, course: Course, csv_file: IO[bytes] | bytes) -> ImportResult:
    """Create the accounts (unusable password, set-password token) and memberships a CSV lists, all or none: any
    problem raises ``ApplicationError`` listing each in ``extra["errors"]``. Rows already enrolled change nothing."""
    try:
        rows, errors = enrollment_rows_read(csv_file)
    except EnrollmentFileInvalid as exc:
        raise _enrollment_rejected(exc.errors) from exc
    db_errors, existing, roles = _enrollment_errors_against_database(course=course, rows=rows)
    if errors or db_errors:
        raise _enrollment_rejected(sorted([*errors, *db_errors], key=lambda error: error.line or 0))

    try:
        with transaction.atomic():
            result = ImportResult()
            for row in rows:
                user = existing.get(row.username)
                if account_created := user is None:
                    user = User(
                        username=row.username,
                        email=row.email,
                        full_name=row.full_name,
                        tenant=course.tenant,
                        is_staff=row.role == Role.INSTRUCTOR,
                    )
                    user.set_unusable_password()
                    user.save()
                if membership_created := user.id not in roles:
                    Membership.objects.create(user=user, course=course, role=row.role)
                    if row.role == Role.INSTRUCTOR:
                        grant_admin_access(user)
                result.people.append(
                    ImportedPerson(
                        line=row.line,
                        user=user,
                        role=row.role,
                        account_created=account_created,
                        membership_created=membership_created,
                        password_setup=PasswordSetupToken.for_user(user) if account_created else None,
                    )
                )
            audit_record(
                actor=actor,
                action="enrollment.import",
                target=course,
                tenant=course.tenant,
                course=course,
                data={
                    "accounts_created": [p.user.username for p in result.people if p.account_created],
                    "memberships_created": [[p.user.username, p.role] for p in result.people if p.membership_created],
                    "unchanged": [p.user.username for p in result.people if not p.membership_created],
                },
            )
    except IntegrityError as exc:
        # Someone created one of these accounts or memberships between our checks and our writes.
        raise Conflict(
            _("The course or its accounts changed while importing; nothing was imported. Upload the file again.")
        ) from exc
    return result
