"""The session's user, with its tenant: Django's model backend, whose ``get_user`` joins the tenant row."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ValidationError


class TenantModelBackend(ModelBackend):
    """Every page needs the person's tenant (its time zone): the session's user brings it in the same query."""

    def get_user(self, user_id):
        try:
            user = get_user_model()._default_manager.select_related("tenant").filter(pk=user_id).first()
        except (ValueError, TypeError, ValidationError):  # a session whose user id is not one (another user model)
            return None
        return user if user is not None and self.user_can_authenticate(user) else None
