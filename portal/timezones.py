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


def validate_time_zone(value: str) -> None:
    if not value:
        return
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValidationError(
            _("“%(value)s” is not a time zone. Use an IANA name such as Asia/Tokyo or Europe/Berlin."),
            code="unknown_time_zone",
            params={"value": value},
        ) from None


def zone_named(name: str) -> zoneinfo.ZoneInfo | None:
    """The named zone; None (the deployment's default) for no name, or for one this installation no longer knows
    (a tzdata update that dropped it must not take the tenant's pages down)."""
    if not name:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def tenant_time_zone(tenant: Any) -> Any:
    """The zone a tenant's times are written in, whoever reads them (the deployment's default if it names none)."""
    return zone_named(getattr(tenant, "time_zone", "")) or timezone.get_default_timezone()


def user_time_zone(user: Any) -> zoneinfo.ZoneInfo | None:
    """The zone a person's pages are shown in: their own if they chose one, else their tenant's, or None for the
    deployment's default. The session's user comes with its tenant (``portal.auth_backends``), so this reads no
    more rows."""
    if not getattr(user, "is_authenticated", False):
        return None
    own = zone_named(getattr(user, "time_zone", ""))
    if own is not None or getattr(user, "tenant_id", None) is None:
        return own
    return zone_named(user.tenant.time_zone)


def person_time_zone(user: Any, tenant: Any) -> Any:
    """The zone to write a message to ``user`` in, wherever it is read (an API client included): theirs, else the
    tenant's, else the deployment's default."""
    return zone_named(getattr(user, "time_zone", "")) or tenant_time_zone(tenant)


class TenantTimeZoneMiddleware:
    """Activates the signed-in person's zone (their own, else their tenant's) for the request, after
    ``AuthenticationMiddleware``; the API's requests stay in UTC."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        zone = user_time_zone(request.user)
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()

    def process_view(self, request, view_func, view_args, view_kwargs) -> None:
        """The API's views answer in UTC: a token is only read by the view, so the zone cannot depend on who signed
        in, and a client should not read other text for the same instant after signing in another way."""
        match = request.resolver_match
        if match is not None and API_NAMESPACE in match.namespaces:
            timezone.activate(UTC)
