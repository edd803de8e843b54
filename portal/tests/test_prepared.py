"""A prepared statement made stale by a migration (a column's type changed under a running process) is planned
anew outside a transaction, and fails only its own transaction inside one (portal/apps.py)."""

from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.db import NotSupportedError, connection, transaction

from portal.apps import replan_stale_statements

pytestmark = [
    pytest.mark.django_db(transaction=True),  # autocommit, as the portal's reads run
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
        reason="prepared statements are PostgreSQL's (bin/test and CI run on PostgreSQL)",
    ),
]

QUERY = "SELECT id, name FROM portal_prepared_probe WHERE id = %s"


@pytest.fixture
def probe_table():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE portal_prepared_probe (id integer PRIMARY KEY, name varchar(20))")
        cursor.execute("INSERT INTO portal_prepared_probe VALUES (1, 'first')")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS portal_prepared_probe")


def prepared_then_altered() -> None:
    """Run the query until psycopg has prepared it, then widen the column from another session (a migration)."""
    threshold = connection.connection.prepare_threshold
    assert threshold is not None, "this test needs DB_PREPARE_THRESHOLD > 0"
    with connection.cursor() as cursor:
        for _ in range(threshold + 2):
            cursor.execute(QUERY, [1])
            assert cursor.fetchone() == (1, "first")
    dsn = connection.connection.info.dsn
    with psycopg.connect(
        dsn, password=settings.DATABASES["default"].get("PASSWORD") or None, autocommit=True
    ) as migration:
        migration.execute("ALTER TABLE portal_prepared_probe ALTER COLUMN name TYPE varchar(40)")


def test_the_portal_wraps_its_postgresql_statements(probe_table):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert replan_stale_statements in connection.execute_wrappers


def test_a_stale_prepared_statement_is_planned_anew_outside_a_transaction(probe_table):
    prepared_then_altered()
    with connection.cursor() as cursor:
        cursor.execute(QUERY, [1])
        assert cursor.fetchone() == (1, "first")
        cursor.execute(QUERY, [1])  # and from then on, prepared again against the new schema
        assert cursor.fetchone() == (1, "first")


def test_without_the_wrapper_the_connection_keeps_failing(probe_table):
    """What the wrapper prevents: outside a transaction nothing makes psycopg forget the stale statement."""
    connection.execute_wrappers.remove(replan_stale_statements)
    try:
        prepared_then_altered()
        for _ in range(2):
            with (
                pytest.raises(NotSupportedError, match="cached plan must not change result type"),
                connection.cursor() as cursor,
            ):
                cursor.execute(QUERY, [1])
    finally:
        connection.execute_wrappers.insert(0, replan_stale_statements)


def test_inside_a_transaction_the_error_ends_it_and_the_next_one_works(probe_table):
    prepared_then_altered()
    with (
        pytest.raises(NotSupportedError, match="cached plan must not change result type"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(QUERY, [1])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(QUERY, [1])
        assert cursor.fetchone() == (1, "first")
