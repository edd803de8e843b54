"""Services for API tokens (DRF's ``authtoken``): created and revoked here, audited; a password change or reset
and a deactivation revoke them, whichever code saves the user (``revoke_on_credentials_change``)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from rest_framework.authtoken.models import Token

from portal.models import User
from portal.services import audit_record


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
    """``pre_save`` of users: a new password or a deactivation revokes the API token, whatever saved it."""
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
