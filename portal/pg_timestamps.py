"""``timestamptz`` columns read by psycopg's C loader rather than by Django's pure-Python one.

Django's PostgreSQL backend registers its own loader for ``timestamptz`` on every psycopg 3 connection, a Python
subclass of psycopg's *Python* loader, so that each value comes back in the connection's time zone
(``django.db.backends.postgresql.psycopg_any.BaseTzLoader``). Subclassing the Python class also sets aside
psycopg's C implementation (``psycopg[binary]``): every timestamp is parsed with a regular expression in Python,
about 3.5 µs each against 0.4 µs. An attempt row carries a dozen timestamps, the namespace sync reads every tracked
attempt of a namespace at each list, and the gradebook reads thousands.

When Django's time zone for the connection is UTC (``USE_TZ`` with no ``TIME_ZONE`` in ``DATABASES``, the portal's
setting) and the session's is too (Django sets it so on every new connection), psycopg's C loader returns exactly
what Django's does: aware datetimes in ``datetime.timezone.utc``. For such connections the C loader is put back.
Django checks each new cursor's loader against its time zone through the loader's ``timezone`` attribute, which a C
class cannot take: ``UtcTimestamptzLoader`` carries it and makes C loaders. Any other time zone keeps Django's loader.
"""

from __future__ import annotations

import datetime
from typing import Any

from psycopg import adapters, pq
from psycopg.adapt import Loader

TIMESTAMPTZ_OID = adapters.types["timestamptz"].oid
# psycopg's own loader for the text format: the C one with psycopg[binary] or psycopg[c].
_PSYCOPG_LOADER = adapters.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT)
C_AVAILABLE = pq.__impl__ in ("c", "binary")


class UtcTimestamptzLoader(Loader):
    """Registered in Django's place; what psycopg instantiates from it is its own (C) loader."""

    timezone = datetime.UTC  # what Django's create_cursor compares with the connection's time zone

    def __new__(cls, oid: int, context: Any = None) -> Any:
        return _PSYCOPG_LOADER(oid, context)


def install(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: psycopg's C loader for a UTC connection's ``timestamptz`` columns."""
    if connection.vendor != "postgresql" or not C_AVAILABLE or connection.timezone != datetime.UTC:
        return
    raw = connection.connection
    if raw.info.parameter_status("TimeZone") != "UTC":
        return  # the C loader would answer in the session's zone: Django's then
    if raw.adapters.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT) is not UtcTimestamptzLoader:
        raw.adapters.register_loader(TIMESTAMPTZ_OID, UtcTimestamptzLoader)
