"""The session's user, with its tenant: Django's model backend, whose ``get_user`` joins the tenant row."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend


class TenantModelBackend(ModelBackend):
    """Every page needs the signed-in person's tenant (its time zone, ``portal.timezones``), and many the tenant
    itself: the session's user brings it in the same query instead of one more."""

    def get_user(self, user_id):
        model = get_user_model()
        try:
            user = model._default_manager.select_related("tenant").get(pk=user_id)
        except model.DoesNotExist:
            return None
        return user if self.user_can_authenticate(user) else None
