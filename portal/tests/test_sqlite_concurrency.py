"""SQLite under connections of several threads, as the embedded default runs it: a write in progress on one makes
the others' reads see the last commit and their writes wait for it, rather than fail; a read under way holds up no
write (WAL)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from portal.models import Tenant

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.embedded_db,
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite only: the embedded default's database"),
]


def in_threads(*bodies: Callable[[], None]) -> list[BaseException]:
    """Run each body in a thread of its own (each with its own connection, closed after it), all at once; return
    what they raised."""
    errors: list[BaseException] = []

    def run(body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test, which shows it
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return errors


def test_a_write_in_progress_makes_another_connection_wait_rather_than_fail():
    writing = threading.Event()
    seen: dict[str, object] = {}

    def hold_a_write() -> None:
        with transaction.atomic():
            Tenant.objects.create(name="First University")
            writing.set()
            time.sleep(0.5)

    def read_then_write() -> None:
        assert writing.wait(timeout=10)
        seen["names_during_the_write"] = list(Tenant.objects.values_list("name", flat=True))
        started = time.monotonic()
        with transaction.atomic():
            Tenant.objects.create(name="Second College")
        seen["waited"] = time.monotonic() - started

    assert in_threads(hold_a_write, read_then_write) == []
    assert seen["names_during_the_write"] == []  # the uncommitted row is not read, and the read does not fail
    assert seen["waited"] > 0.2  # the second write waited for the first transaction to end
    assert sorted(Tenant.objects.values_list("name", flat=True)) == ["First University", "Second College"]


def test_a_long_read_does_not_hold_up_a_write():
    """A read still under way (a report streaming its rows) leaves writers free to commit: the database is in WAL
    mode. With SQLite's rollback journal a commit waits for every reader to finish."""
    for n in range(5):
        Tenant.objects.create(name=f"University {n}")
    reading = threading.Event()
    seen: dict[str, object] = {}

    def read_slowly() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM portal_tenant ORDER BY id")
            cursor.fetchone()  # the statement stays open, with rows left to read
            reading.set()
            time.sleep(2)
            seen["rows_read"] = 1 + len(cursor.fetchall())

    def write() -> None:
        assert reading.wait(timeout=10)
        started = time.monotonic()
        with transaction.atomic():
            Tenant.objects.create(name="Written During The Read")
        seen["write_seconds"] = time.monotonic() - started

    assert in_threads(read_slowly, write) == []
    assert seen["write_seconds"] < 1.0, seen  # it did not wait out the reader's two seconds
    assert seen["rows_read"] == 5  # the reader saw the database as it was when its read began
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
