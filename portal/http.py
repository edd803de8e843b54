"""The request a view behind a login sees: django-stubs types ``request.user`` as maybe anonymous, this as the
portal's User (annotate a view's ``request`` with it, or a class-based view's ``request`` attribute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
