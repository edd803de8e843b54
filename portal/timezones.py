"""Each tenant's time zone: its validation, its choices, and the middleware that shows a person's pages in it.

A tenant is an institution, and its due dates, opening times and attempt histories mean its own clock: a
deadline of 23:59 in Tokyo is 14:59 in UTC. Pages are rendered in the zone of the signed-in person's tenant
(``Tenant.time_zone``), or in the deployment's ``TIME_ZONE`` when the tenant names none or the person has no
tenant; date-and-time formats end with the zone's abbreviation, and the page tells its scripts the zone
(``<html data-time-zone>``) so that times drawn in the browser use the same clock. Django admin forms read the
times an instructor types in the same zone.
"""

from __future__ import annotations

import zoneinfo
from functools import lru_cache
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


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
            code="unknown_time_zone", params={"value": value},
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
    """The zone a person's pages are shown in: their tenant's, or None for the deployment's default. The session's
    user comes with its tenant (``portal.auth_backends``), so this reads no more rows."""
    if not getattr(user, "is_authenticated", False) or getattr(user, "tenant_id", None) is None:
        return None
    return zone_named(user.tenant.time_zone)


class TenantTimeZoneMiddleware:
    """Activates the signed-in person's tenant zone for the request (after ``AuthenticationMiddleware``)."""

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
