"""Time zones: a page shows the person's own zone, else their tenant's, else ``TIME_ZONE`` (a deadline means the
institution's clock), and tells its scripts which (``<html data-time-zone>``); admin forms read typed times in it.
The JSON API answers in UTC, whoever asks."""

from __future__ import annotations

import zoneinfo
from datetime import UTC
from functools import lru_cache
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

API_NAMESPACE = "api"  # api/urls.py's app_name


@lru_cache(maxsize=1)
def time_zone_names() -> tuple[str, ...]:
    """Every IANA zone name this installation knows (the system's database, else the ``tzdata`` package)."""
    return tuple(sorted(zoneinfo.available_timezones()))


def zone_named(name: str) -> zoneinfo.ZoneInfo | None:
    """The named zone; None for no name, or for one a tzdata update dropped (the tenant's pages must stay up)."""
    if not name:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def validate_time_zone(value: str) -> None:
    if value and zone_named(value) is None:
        raise ValidationError(
            _("“%(value)s” is not a time zone. Use an IANA name such as Asia/Tokyo or Europe/Berlin."),
            code="unknown_time_zone",
            params={"value": value},
        )


def tenant_time_zone(tenant: Any) -> Any:
    return zone_named(getattr(tenant, "time_zone", "")) or timezone.get_default_timezone()


def person_time_zone(user: Any, tenant: Any) -> Any:
    """The zone to write to ``user`` in, wherever it is read: theirs, else the tenant's, else the default."""
    return zone_named(getattr(user, "time_zone", "")) or tenant_time_zone(tenant)


def user_time_zone(user: Any) -> Any:
    """The zone a person's pages are shown in; the session's user comes with its tenant (``portal.http``)."""
    if not getattr(user, "is_authenticated", False):
        return timezone.get_default_timezone()
    return person_time_zone(user, user.tenant)


class TenantTimeZoneMiddleware:
    """Activates the signed-in person's zone for the request, after ``AuthenticationMiddleware``."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        timezone.activate(user_time_zone(request.user))
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()

    def process_view(self, request, view_func, view_args, view_kwargs) -> None:
        # A token is only read by the view, so the API's zone cannot depend on who signed in: it answers in UTC.
        match = request.resolver_match
        if match is not None and API_NAMESPACE in match.namespaces:
            timezone.activate(UTC)
