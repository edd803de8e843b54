"""PostgreSQL's timestamptz columns come back through psycopg's C loader, as the same values Django's loader gives."""

from __future__ import annotations

import datetime

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.test.utils import override_settings

from portal import pg_timestamps

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: SQLite has no timestamptz"),
]

SAMPLE = ("select ts from (values (timestamptz '2026-12-03 11:27:30.232755+00'), "
          "(timestamptz '1999-12-31 23:59:59+09'), (timestamptz '2026-03-29 01:30:00.5+02'), (null)) as t(ts)")


def read(cursor) -> list:
    cursor.execute(SAMPLE)
    return [row[0] for row in cursor.fetchall()]


def test_a_utc_connection_reads_timestamps_with_psycopgs_c_loader_and_the_same_values():
    assert pg_timestamps.C_AVAILABLE  # psycopg[binary] is what requirements.txt installs
    connection.ensure_connection()
    raw = connection.connection
    assert raw.adapters.get_loader(pg_timestamps.TIMESTAMPTZ_OID, 0) is pg_timestamps.UtcTimestamptzLoader
    with connection.cursor() as cursor:
        fast = read(cursor)
        # The cursor's loader is psycopg's own (C) one, not Django's Python one.
        loader = cursor.cursor._tx.get_loader(pg_timestamps.TIMESTAMPTZ_OID, 0)
        assert type(loader).__module__.startswith(("psycopg_binary", "psycopg_c"))
        register_tzloader(connection.timezone, cursor.cursor)  # Django's own, on this cursor only
        django = read(cursor)
    assert fast == django
    assert [value.tzinfo for value in fast[:3]] == [datetime.UTC] * 3
    assert fast[0] == datetime.datetime(2026, 12, 3, 11, 27, 30, 232755, tzinfo=datetime.UTC)
    assert fast[1] == datetime.datetime(1999, 12, 31, 14, 59, 59, tzinfo=datetime.UTC)
    assert fast[3] is None


def test_another_time_zone_keeps_djangos_loader_on_the_cursor():
    connection.ensure_connection()
    with override_settings(USE_TZ=False), connection.cursor() as cursor:
        # Django registers its own loader on the cursor when the zone differs: naive datetimes, as it gives them.
        assert all(value.tzinfo is None for value in read(cursor)[:3])
