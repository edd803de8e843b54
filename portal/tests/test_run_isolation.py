"""Each test process's Redis keys begin with a prefix of its own (tests/run_isolation.py), and so does everything
the portal writes to Redis: a task a test queues cannot reach another run's or another worker's Celery worker."""

from __future__ import annotations

import os

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache

from labs.console.state import console_key
from portal import metrics
from portal.celery import app


@pytest.fixture
def redis_client():
    if not settings.REDIS_URL:
        pytest.skip("Only the production wiring (REDIS_URL) keeps anything in Redis.")
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


def test_the_prefix_is_this_process_own():
    prefix = settings.REDIS_KEY_PREFIX
    assert prefix.startswith("test-") and prefix == os.environ["REDIS_KEY_PREFIX"]
    assert prefix.endswith(f"-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}:")


def test_a_queued_task_waits_under_the_prefix(redis_client):
    queue = f"{settings.REDIS_KEY_PREFIX}celery"
    before = redis_client.llen(queue)
    app.send_task("labs.tasks.sync_attempts")
    assert redis_client.llen(queue) == before + 1
    redis_client.delete(queue)


def test_cache_channel_layer_console_and_metrics_keys_carry_the_prefix(redis_client):
    prefix = settings.REDIS_KEY_PREFIX.encode()
    cache.set("run-isolation-probe", 1, 30)
    async_to_sync(get_channel_layer().group_add)("run-isolation", "specific.probe!x")
    metrics.counters.incr(metrics.REQUEST_FAILURES_KEY, "probe")
    redis_client.set(console_key("lease", 1), "probe", ex=30)
    keys = set(redis_client.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}*", count=1000))
    assert any(b"run-isolation-probe" in key for key in keys)
    assert prefix + b"asgi:group:run-isolation" in keys
    assert prefix + metrics.REQUEST_FAILURES_KEY.encode() in keys
    assert prefix + b"portal:console:lease:1" in keys
    metrics.counters.clear(metrics.REQUEST_FAILURES_KEY)


def test_a_test_own_cache_prefix_stays_under_the_run_prefix():
    from api.tests.world import fresh_cache_settings

    prefix = fresh_cache_settings()["default"].get("KEY_PREFIX", "")
    assert prefix.startswith(settings.REDIS_KEY_PREFIX) and prefix != settings.REDIS_KEY_PREFIX


def test_clearing_the_cache_leaves_every_other_key_in_redis(redis_client):
    """django-redis's own clear() was FLUSHDB: a test clearing its cache emptied the database under every other
    test process, and a page of theirs open at that moment lost its live update (its channel-layer group was gone)."""
    import uuid

    elsewhere = f"test-{uuid.uuid4().hex[:12]}-elsewhere:asgi:group:attempt-1"  # another process's page, say
    ours = f"{settings.REDIS_KEY_PREFIX}asgi:group:run-isolation-clear"
    try:
        redis_client.zadd(elsewhere, {"specific.other!x": 1})
        async_to_sync(get_channel_layer().group_add)("run-isolation-clear", "specific.probe!x")
        cache.set("run-isolation-clear", 1, 30)
        cache.set("run-isolation-clear-v2", 1, 30, version=2)
        cache.clear()
        assert cache.get("run-isolation-clear") is None and cache.get("run-isolation-clear-v2", version=2) is None
        assert redis_client.exists(elsewhere) and redis_client.exists(ours)
    finally:
        redis_client.delete(elsewhere, ours)
