"""Writes of the core domain: courses, accounts, memberships, enrollment import from CSV, and the audit log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO, Any

from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models.functions import Lower
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from portal.enrollment import EnrollmentFileInvalid, EnrollmentRow, RowError, enrollment_rows_read
from portal.errors import ApplicationError, Conflict
from portal.models import AuditEvent, Course, Membership, Role, Tenant, User
from portal.timezones import validate_time_zone


def audit_record(
    *,
    actor: User | None,
    action: str,
    target: models.Model | None = None,
    tenant: Tenant | None = None,
    course: Course | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Record a state change made by a person. Call inside the transaction that makes the change."""
    return AuditEvent.objects.create(
        tenant=tenant,
        course=course,
        actor=actor if actor is not None and actor.is_authenticated else None,
        action=action,
        target_type=target._meta.label if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:300] if target is not None else "",
        data=data or {},
    )


@transaction.atomic
def course_create(*, actor: User, course: Course) -> Course:
    """Save the new ``course`` (its tenant set). An instructor who creates it becomes its instructor, so they can
    run it."""
    course.save()
    if not actor.is_superuser:
        Membership.objects.create(user=actor, course=course, role=Role.INSTRUCTOR)
    audit_record(actor=actor, action="course.create", target=course, tenant=course.tenant, course=course)
    return course


def _grant_admin_access(user: User) -> None:
    # Instructors run their courses in the admin; is_staff only opens its door, and what they see there is
    # decided by their memberships (portal.admin_scoping), so granting it gives no other rights.
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])


@transaction.atomic
def membership_create(*, actor: User, membership: Membership) -> Membership:
    """Save the new ``membership`` of a person in a course of their own institution."""
    user, course, role = membership.user, membership.course, membership.role
    if user.tenant_id != course.tenant_id:
        raise ApplicationError(_("%(user)s belongs to another institution than the course.") % {"user": user})
    if Membership.objects.filter(user=user, course=course).exists():
        raise Conflict(_("%(user)s is already a member of this course.") % {"user": user})
    membership.save()
    if role == Role.INSTRUCTOR:
        _grant_admin_access(user)
    audit_record(
        actor=actor,
        action="membership.create",
        target=membership,
        tenant=course.tenant,
        course=course,
        data={"user": user.username, "role": role},
    )
    return membership


@transaction.atomic
def user_time_zone_set(*, actor: User, user: User, time_zone: str) -> User:
    """The clock ``user``'s pages use: an IANA zone name, or "" for their institution's."""
    try:
        validate_time_zone(time_zone)
    except ValidationError as exc:
        raise ApplicationError(" ".join(exc.messages)) from exc
    # The stored zone: a model form has already put the new one on ``user``.
    previous = User.objects.values_list("time_zone", flat=True).get(pk=user.pk)
    user.time_zone = time_zone
    user.save(update_fields=["time_zone"])  # nothing else of the row, which another request may be changing
    audit_record(
        actor=actor, action="user.time_zone", target=user, tenant=user.tenant, data={"from": previous, "to": time_zone}
    )
    return user


@transaction.atomic
def membership_set_role(*, actor: User, membership: Membership, role: str) -> Membership:
    previous = membership.role
    if previous == role:
        return membership
    membership.role = role
    membership.save(update_fields=["role"])
    if role == Role.INSTRUCTOR:
        _grant_admin_access(membership.user)
    audit_record(
        actor=actor,
        action="membership.role",
        target=membership,
        tenant=membership.course.tenant,
        course=membership.course,
        data={"user": membership.user.username, "from": previous, "to": role},
    )
    return membership


@transaction.atomic
def user_create(
    *,
    actor: User | None,
    tenant: Tenant | None,
    username: str,
    email: str,
    full_name: str,
    password: str | None,
    is_staff: bool = False,
) -> User:
    """A new account in ``tenant``; ``password`` None leaves it unusable until a set-password link is used."""
    user = User(
        username=User.normalize_username(username),
        email=User.objects.normalize_email(email),
        full_name=full_name,
        tenant=tenant,
        is_staff=is_staff,
    )
    if password is None:
        user.set_unusable_password()
    else:
        user.set_password(password)
    user.save()
    audit_record(actor=actor, action="user.create", target=user, tenant=tenant, data={"username": user.username})
    return user


@dataclass(frozen=True)
class PasswordSetupToken:
    """What the URL ``password_reset_confirm`` (django.contrib.auth.urls) needs: ``uidb64`` and ``token``.

    Valid until the password is set, or for ``settings.PASSWORD_RESET_TIMEOUT`` seconds.
    """

    uidb64: str
    token: str


def user_password_setup_token(*, actor: User, user: User) -> PasswordSetupToken:
    """A one-time token with which ``user`` chooses their own password (no password is ever shown or mailed)."""
    audit_record(actor=actor, action="user.password_link", target=user, tenant=user.tenant)
    return PasswordSetupToken(
        uidb64=urlsafe_base64_encode(force_bytes(user.pk)), token=default_token_generator.make_token(user)
    )


@dataclass
class ImportedPerson:
    line: int
    username: str
    full_name: str
    email: str
    role: str
    account_created: bool
    membership_created: bool
    user: User
    # Only for accounts created by this import: the way their owner sets a password and logs in.
    password_setup: PasswordSetupToken | None = None

    @property
    def role_label(self) -> str:
        return str(Role(self.role).label)


@dataclass
class ImportResult:
    course: Course
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
        if user is None:
            near = by_lower.get(row.username.lower())
            if near:
                errors.append(
                    RowError(
                        row.line,
                        _("an account named “%(existing)s” already exists; use exactly that username, or another one")
                        % {"existing": near[0].username},
                    )
                )
            continue
        if user.tenant_id != course.tenant_id:
            # Usernames are unique across the platform; say no more than that about someone else's account.
            errors.append(
                RowError(
                    row.line,
                    _("the username “%(username)s” is already taken; choose another") % {"username": row.username},
                )
            )
        elif user.email and user.email.casefold() != row.email.casefold():
            errors.append(
                RowError(
                    row.line,
                    _(
                        "“%(username)s” is an existing account with another email address (%(email)s); check that this "
                        "row means that person"
                    )
                    % {"username": row.username, "email": user.email},
                )
            )
        elif not user.is_active:
            errors.append(
                RowError(
                    row.line,
                    _("the account “%(username)s” is deactivated; reactivate it first") % {"username": row.username},
                )
            )
        elif user.id in roles and roles[user.id] != row.role:
            errors.append(
                RowError(
                    row.line,
                    _(
                        "“%(username)s” is already in this course as %(current)s; change the role on the membership "
                        "instead of importing"
                    )
                    % {"username": row.username, "current": Role(roles[user.id]).label},
                )
            )
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
        extra={"errors": [error.as_dict() for error in errors]},
    )


def enrollment_import(*, actor: User, course: Course, csv_file: IO[bytes] | bytes) -> ImportResult:
    """Create the accounts and memberships a CSV file lists, all of them or none.

    Any problem, in the file or against the database, raises ``ApplicationError`` (code
    ``enrollment_invalid``) whose ``extra["errors"]`` lists every problem as ``{"line", "message"}`` in the
    active language; nothing is written then. Otherwise new accounts land in the course's tenant with an
    unusable password and a one-time set-password token each (the instructor hands out the links); existing
    accounts of the tenant are enrolled as they are; rows already enrolled with the same role change nothing,
    so importing the same file twice is harmless. New instructors get admin access (``is_staff``).
    """
    try:
        rows, errors = enrollment_rows_read(csv_file)
    except EnrollmentFileInvalid as exc:
        raise _enrollment_rejected(exc.errors) from exc
    db_errors, existing, roles = _enrollment_errors_against_database(course=course, rows=rows)
    if errors or db_errors:
        raise _enrollment_rejected(sorted([*errors, *db_errors], key=lambda error: error.line or 0))

    try:
        with transaction.atomic():
            result = _enrollment_write(actor=actor, course=course, rows=rows, existing=existing, roles=roles)
    except IntegrityError as exc:
        # Someone created one of these accounts or memberships between our checks and our writes.
        raise Conflict(
            _("The course or its accounts changed while importing; nothing was imported. Upload the file again.")
        ) from exc
    return result


def _enrollment_write(
    *, actor: User, course: Course, rows: list[EnrollmentRow], existing: dict[str, User], roles: dict[int, str]
) -> ImportResult:
    result = ImportResult(course=course)
    for row in rows:
        user = existing.get(row.username)
        account_created = user is None
        if user is None:
            user = User(
                username=row.username,
                email=row.email,
                full_name=row.full_name,
                tenant=course.tenant,
                is_staff=row.role == Role.INSTRUCTOR,
            )
            user.set_unusable_password()
            user.save()
        membership_created = user.id not in roles
        if membership_created:
            Membership.objects.create(user=user, course=course, role=row.role)
            if row.role == Role.INSTRUCTOR:
                _grant_admin_access(user)
        result.people.append(
            ImportedPerson(
                line=row.line,
                username=user.username,
                full_name=user.full_name,
                email=user.email,
                role=row.role,
                account_created=account_created,
                membership_created=membership_created,
                user=user,
                password_setup=PasswordSetupToken(
                    uidb64=urlsafe_base64_encode(force_bytes(user.pk)),
                    token=default_token_generator.make_token(user),
                )
                if account_created
                else None,
            )
        )
    audit_record(
        actor=actor,
        action="enrollment.import",
        target=course,
        tenant=course.tenant,
        course=course,
        data={
            "accounts_created": [p.username for p in result.people if p.account_created],
            "memberships_created": [[p.username, p.role] for p in result.people if p.membership_created],
            "unchanged": [p.username for p in result.people if not p.membership_created],
        },
    )
    return result
