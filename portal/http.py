"""The request a view behind a login sees: django-stubs types ``request.user`` as maybe anonymous, this as the
portal's User (annotate a view's ``request`` with it, or a class-based view's ``request`` attribute)."""

from __future__ import annotations

from django.http import HttpRequest

from portal.models import User


class AuthenticatedRequest(HttpRequest):
    user: User
