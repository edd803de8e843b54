"""A pytest plugin (loaded early by ``-p``): each test process's own Redis key prefix and var dir, left clean.

Set before Django reads its settings, and inherited by the portal processes a test starts. At the end of the
session every key under the prefix is deleted (tasks queued by tests among them) and the session fails if any
is left, so no later run's worker can execute this run's tasks.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID", uuid.uuid4().hex)[:12]
KEY_PREFIX = f"test-{RUN_ID}-{WORKER}:"

os.environ["REDIS_KEY_PREFIX"] = KEY_PREFIX
if "PYTEST_XDIST_WORKER" in os.environ:
    # Recordings, SQLite files and the embedded kubeconfig are named by attempt id: one directory per worker.
    os.environ["PORTAL_VAR_DIR"] = str(Path(os.environ.get("PORTAL_VAR_DIR") or REPO_ROOT / "var") / WORKER)


def run_keys(client) -> list[bytes]:
    return list(client.scan_iter(match=f"{KEY_PREFIX}*", count=1000))


def delete_run_keys() -> int:
    """Delete every Redis key of this test process (its queued tasks, cache, sessions, leases); how many there were."""
    import redis
    from django.conf import settings

    if not settings.REDIS_URL:
        return 0
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        keys = run_keys(client)
        if keys:
            client.delete(*keys)
        return len(keys)
    finally:
        client.close()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from django.conf import settings

    if not settings.REDIS_URL:
        return
    import redis

    delete_run_keys()
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        left = run_keys(client)
    finally:
        client.close()
    if left:
        session.config.get_terminal_writer().line(
            f"run_isolation: {len(left)} Redis keys of this run are still there: {sorted(left)[:10]}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
