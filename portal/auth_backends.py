"""The session's user, with its tenant: Django's model backend, whose ``get_user`` joins the tenant row."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from portal.compiled import CompiledQuery


def _user_with_tenant(*, user_id: int) -> QuerySet:
    return get_user_model()._default_manager.filter(pk=user_id).select_related("tenant")[:1]


# Every request and every socket's handshake reads it: built once (``portal.compiled``).
_session_user = CompiledQuery(_user_with_tenant, user_id=int)


class TenantModelBackend(ModelBackend):
    """Every page needs the signed-in person's tenant (its time zone, ``portal.timezones``), and many the tenant
    itself: the session's user brings it in the same query instead of one more."""

    def get_user(self, user_id):
        try:
            user_id = get_user_model()._meta.pk.to_python(user_id)
        except ValidationError:  # a session whose user id is not one (tampered with, or from another user model)
            return None
        if not isinstance(user_id, int) or isinstance(user_id, bool):
            return None
        user = _session_user.first(user_id=user_id)
        return user if user is not None and self.user_can_authenticate(user) else None
