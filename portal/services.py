"""Writes of the core domain: courses, accounts, memberships, time zones, API tokens (DRF's ``authtoken``) and the
audit log (the CSV enrollment import is ``portal.enrollment_import``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django.utils.translation import gettext as _
from rest_framework.authtoken.models import Token

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
    """Save the new ``course`` (its tenant set); an instructor who creates it becomes its instructor."""
    course.save()
    if not actor.is_superuser:
        Membership.objects.create(user=actor, course=course, role=Role.INSTRUCTOR)
    audit_record(actor=actor, action="course.create", target=course, tenant=course.tenant, course=course)
    return course


def grant_admin_access(user: User) -> None:
    # is_staff only opens the admin's door: what instructors see there is decided by their memberships.
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])


@transaction.atomic
def membership_create(*, actor: User, membership: Membership) -> Membership:
    user, course, role = membership.user, membership.course, membership.role
    if user.tenant_id != course.tenant_id:
        raise ApplicationError(_("%(user)s belongs to another institution than the course.") % {"user": user})
    if Membership.objects.filter(user=user, course=course).exists():
        raise Conflict(_("%(user)s is already a member of this course.") % {"user": user})
    membership.save()
    if role == Role.INSTRUCTOR:
        grant_admin_access(user)
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
        grant_admin_access(membership.user)
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
    user.set_password(password)  # None: an unusable password
    user.save()
    audit_record(actor=actor, action="user.create", target=user, tenant=tenant, data={"username": user.username})
    return user


@dataclass(frozen=True)
class PasswordSetupToken:
    """What ``password_reset_confirm`` needs; valid until used, or for ``settings.PASSWORD_RESET_TIMEOUT`` seconds."""

    uidb64: str
    token: str

    @classmethod
    def for_user(cls, user: User) -> PasswordSetupToken:
        return cls(uidb64=urlsafe_base64_encode(force_bytes(user.pk)), token=default_token_generator.make_token(user))


def user_password_setup_token(*, actor: User, user: User) -> PasswordSetupToken:
    """A one-time token with which ``user`` chooses their own password (no password is ever shown or mailed)."""
    audit_record(actor=actor, action="user.password_link", target=user, tenant=user.tenant)
    return PasswordSetupToken.for_user(user)


@transaction.atomic
def api_token_create(*, actor: User, user: User) -> Token:
    """``user``'s API token, created on first use."""
    token, created = Token.objects.get_or_create(user=user)
    if created:
        # The user is the target: a token's str() is its key, which the audit log must never hold.
        audit_record(actor=actor, action="api_token.create", target=user, tenant=user.tenant)
    return token


@transaction.atomic
def api_token_revoke(*, actor: User | None, user: User, reason: str) -> bool:
    """Delete ``user``'s API token, if there is one; ``reason`` is recorded (owner, password_changed, ...)."""
    deleted, _per_model = Token.objects.filter(user=user).delete()
    if deleted:
        audit_record(actor=actor, action="api_token.revoke", target=user, tenant=user.tenant, data={"reason": reason})
    return bool(deleted)


def revoke_on_credentials_change(
    sender: type[User], instance: User, raw: bool = False, update_fields: Any = None, **kwargs: Any
) -> None:
    """``pre_save`` of users: a new password or a deactivation revokes the API token, whatever saves the user."""
    if raw or instance.pk is None:
        return
    if update_fields is not None and not {"password", "is_active"} & set(update_fields):
        return  # last_login and the like
    before = sender.objects.filter(pk=instance.pk).values("password", "is_active").first()
    if before is None:
        return
    if before["password"] != instance.password:
        api_token_revoke(actor=None, user=instance, reason="password_changed")
    elif before["is_active"] and not instance.is_active:
        api_token_revoke(actor=None, user=instance, reason="deactivated")
