"""The request's user: the session's comes with its tenant (``TenantModelBackend``), and a view behind a login sees
the portal's User (``AuthenticatedRequest``, ``request_user``) where django-stubs types it as maybe anonymous."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from portal.models import User

if TYPE_CHECKING:
    from rest_framework.request import Request


class AuthenticatedRequest(HttpRequest):
    user: User


def request_user(request: HttpRequest | Request) -> User:
    """The signed-in user of a request that a login check (the admin site's, a mixin's, DRF's) already let through."""
    user = request.user
    if not isinstance(user, User):
        raise PermissionDenied
    return user


class TenantModelBackend(ModelBackend):
    """Every page needs the person's tenant (its time zone): the session's user brings it in the same query."""

    def get_user(self, user_id):
        user = User._default_manager.select_related("tenant").filter(pk=user_id).first()
        return user if user is not None and self.user_can_authenticate(user) else None
