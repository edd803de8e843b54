"""/healthz and /readyz: liveness without I/O; readiness naming each failing component in plain words."""

from __future__ import annotations

import json
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.cache import cache
from django.db import connections
from django.test import override_settings

from labs import health, sync_health
from labs.kubevirt import client as kube_client
from labs.wording import cluster_notice
from portal.metrics import CLUSTER_API_ERRORS_KEY, counters


def closed_port() -> int:
    """A local TCP port with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "broken",
                "clusters": [{"name": "broken", "cluster": {"server": server}}],
                "users": [{"name": "broken", "user": {"token": "not-a-real-token-but-secret-looking"}}],
                "contexts": [{"name": "broken", "context": {"cluster": "broken", "user": "broken"}}],
            }
        )
    )
    return path


@pytest.fixture(autouse=True)
def fresh_probe_state():
    health.reset_cluster_probe()
    cache.delete_many([sync_health.SYNC_LAST_SUCCESS_KEY, sync_health.SYNC_LAST_ERROR_KEY])
    counters.clear(CLUSTER_API_ERRORS_KEY)
    yield
    health.reset_cluster_probe()
    cache.delete_many([sync_health.SYNC_LAST_SUCCESS_KEY, sync_health.SYNC_LAST_ERROR_KEY])


@pytest.fixture
def broken_cluster(settings, tmp_path):
    """The portal pointed at an API server address where nothing listens."""
    port = closed_port()
    settings.KUBECONFIG = str(write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}"))
    kube_client.reset()
    yield port
    kube_client.reset()


@pytest.fixture
def fresh_sync():
    sync_health.record_sync_success()


def test_healthz_is_alive_without_any_io(client):
    # No django_db mark: pytest-django makes any database access in this test an error.
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "alive"}
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


@pytest.mark.django_db
def test_readyz_is_ready_with_database_redis_cluster_and_fresh_sync(client, cluster, fresh_sync):
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ready"
    assert body["failing"] == []
    assert set(body["components"]) == {"database", "redis", "cluster", "sync"}
    assert all(component["ok"] for component in body["components"].values())


@pytest.mark.django_db
def test_readyz_names_a_stale_sync_loop(client, cluster, settings):
    settings.HEALTH_SYNC_MAX_AGE_SECONDS = 60
    sync_health.record_sync_success(at=datetime.now(tz=UTC) - timedelta(seconds=300))
    sync_health.record_sync_error(message="list VMIs: 503", at=datetime.now(tz=UTC) - timedelta(seconds=5))
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["failing"] == ["sync"]
    problem = body["problems"][0]
    assert "last succeeded 300 s ago" in problem or "last succeeded 301 s ago" in problem
    assert "limit 60 s" in problem
    assert "last pass failed" in problem
    assert "503" not in problem  # the error text is for the staff dashboard, not an unauthenticated probe


@pytest.mark.django_db
def test_readyz_says_when_the_sync_loop_never_ran(client, cluster):
    body = client.get("/readyz").json()
    assert body["failing"] == ["sync"]
    assert "has not run yet" in body["problems"][0]


@pytest.mark.django_db
def test_sync_heartbeat_accepts_iso_strings_and_epoch_floats(client, cluster):
    cache.set(sync_health.SYNC_LAST_SUCCESS_KEY, datetime.now(tz=UTC).isoformat())
    assert client.get("/readyz").status_code == 200
    cache.set(sync_health.SYNC_LAST_SUCCESS_KEY, time.time() - 3600)
    assert client.get("/readyz").json()["failing"] == ["sync"]


@pytest.mark.django_db
def test_a_recent_error_after_a_recent_success_stays_ready_but_is_reported(client, cluster):
    sync_health.record_sync_success(at=datetime.now(tz=UTC) - timedelta(seconds=4))
    sync_health.record_sync_error(message="watch dropped", at=datetime.now(tz=UTC) - timedelta(seconds=1))
    response = client.get("/readyz")
    assert response.status_code == 200
    assert "last pass failed" in response.json()["components"]["sync"]["message"]


@pytest.mark.django_db
def test_readyz_names_an_unreachable_cluster_without_revealing_its_address(client, broken_cluster, fresh_sync):
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["failing"] == ["cluster"]
    assert body["problems"] == ["The cluster API is not reachable (the connection failed)."]
    text = response.content.decode()
    assert str(broken_cluster) not in text
    assert "127.0.0.1" not in text
    assert "secret-looking" not in text
    # The failure is counted as a cluster API error, for every process to see.
    assert counters.read(CLUSTER_API_ERRORS_KEY) == {"version|connection": 1}


@pytest.mark.django_db
def test_readyz_names_a_missing_cluster_configuration(client, settings, tmp_path, fresh_sync):
    settings.KUBECONFIG = str(tmp_path / "missing-kubeconfig")
    kube_client.reset()
    try:
        body = client.get("/readyz").json()
    finally:
        kube_client.reset()
    assert body["failing"] == ["cluster"]
    assert body["problems"][0].startswith("No cluster is configured")


@pytest.mark.django_db
def test_readyz_reports_cluster_api_errors_injected_in_kubesim(client, cluster, fresh_sync):
    cluster.admin.inject_fault(code=503)
    try:
        body = client.get("/readyz").json()
    finally:
        cluster.admin.clear_faults()
    assert body["failing"] == ["cluster"]
    assert body["problems"] == ["The cluster API answered with an error (HTTP 503)."]
    health.reset_cluster_probe()
    assert client.get("/readyz").status_code == 200


@pytest.mark.django_db
def test_cluster_probe_is_remembered_for_a_few_seconds(client, cluster, fresh_sync, settings):
    settings.HEALTH_CLUSTER_CACHE_SECONDS = 30
    before = cluster.admin.counters()["by_verb_resource"].get("get version", 0)
    for _ in range(5):
        assert client.get("/readyz").status_code == 200
    after = cluster.admin.counters()["by_verb_resource"].get("get version", 0)
    assert after - before == 1


@pytest.mark.django_db
def test_readyz_names_redis_when_it_is_down(client, cluster, settings, fresh_sync):
    settings.REDIS_URL = f"redis://127.0.0.1:{closed_port()}/0"
    body = client.get("/readyz").json()
    assert body["failing"] == ["redis"]
    assert body["problems"][0].startswith("Redis is not answering")


@pytest.mark.django_db
def test_readyz_names_the_cache_when_the_heartbeat_cannot_be_read(client, cluster):
    unreachable = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{closed_port()}/0",
        }
    }
    with override_settings(CACHES=unreachable):
        body = client.get("/readyz").json()
    assert "sync" in body["failing"]
    assert body["components"]["sync"]["message"] == (
        "Cannot read the sync loop's heartbeat: the cache is not answering."
    )


@pytest.fixture
def unreachable_database(django_db_blocker):
    """A second database alias pointing where no PostgreSQL listens, as if the database went away.

    The test runs outside pytest-django's per-test transaction (which would refuse an alias it did not set up),
    with database access unblocked: the probe only reads.
    """
    alias = "unreachable"
    connections.settings[alias] = {**connections.settings["default"], "HOST": "127.0.0.1", "PORT": closed_port()}
    with django_db_blocker.unblock():
        yield alias
    connections[alias].close()
    del connections[alias]
    del connections.settings[alias]


def test_readyz_names_a_database_that_does_not_answer(client, cluster, fresh_sync, unreachable_database):
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["failing"] == ["database:unreachable"]
    assert body["problems"] == ["The database is not answering (OperationalError)."]
    assert body["components"]["database"]["ok"] is True


@pytest.mark.django_db
def test_readyz_exclude_skips_named_components_and_rejects_unknown_ones(client, broken_cluster):
    assert client.get("/readyz?exclude=cluster,sync").status_code == 200
    response = client.get("/readyz?exclude=etcd")
    assert response.status_code == 400
    assert "etcd" in response.json()["error"]


@pytest.mark.django_db
def test_cluster_notice_speaks_to_students(broken_cluster, fresh_sync):
    assert cluster_notice(state=None) == "The cluster is not answering; your lab may be slow to start."


@pytest.mark.django_db
def test_cluster_notice_is_silent_when_all_is_well(cluster, fresh_sync):
    assert cluster_notice(state=None) is None


@pytest.mark.django_db
def test_readyz_needs_no_login_and_accepts_only_get(client, cluster, fresh_sync):
    assert client.get("/readyz").status_code == 200
    assert client.post("/readyz").status_code == 405


@pytest.mark.django_db
def test_readyz_speaks_the_language_asked_for_and_english_by_default(client, broken_cluster, fresh_sync):
    japanese = client.get("/readyz", headers={"accept-language": "ja"}).json()
    assert japanese["problems"] == ["クラスター API に接続できません (接続に失敗しました)。"]
    # The same remembered probe result, read again without a language: English, as probes expect.
    assert client.get("/readyz").json()["problems"] == ["The cluster API is not reachable (the connection failed)."]


@pytest.mark.django_db
def test_sync_messages_keep_their_figures_in_japanese(client, cluster, settings):
    from django.utils import translation

    settings.HEALTH_SYNC_MAX_AGE_SECONDS = 60
    now = datetime.now(tz=UTC)
    sync_health.record_sync_success(at=now - timedelta(seconds=300))
    sync_health.record_sync_error(message="list VMIs: 503", at=now - timedelta(seconds=5))
    status = sync_health.check_sync(now=now)
    with translation.override("ja"):
        assert str(status.message) == (
            "実施の同期ループが最後に成功したのは 300 秒前です (上限 60 秒)。最後の実行は 5 秒前に失敗しました。"
        )
    assert str(status.message) == (
        "The attempt sync loop last succeeded 300 s ago (limit 60 s); its last pass failed 5 s ago."
    )


@pytest.mark.django_db
def test_readyz_refuses_an_unknown_component_in_words(client):
    response = client.get("/readyz?exclude=sync,disk", headers={"accept-language": "ja"})
    assert response.status_code == 400
    assert response.json()["error"] == (
        "exclude に不明なコンポーネントがあります: disk。指定できるもの: database, redis, cluster, sync。"
    )


@pytest.mark.django_db
def test_the_web_pods_probe_keeps_the_pages_up_through_a_cluster_outage_and_a_stalled_sync(client, broken_cluster):
    from portal.tests.test_deploy_manifests import load_all, of_kind

    (web,) = [d for d in of_kind(load_all(), "Deployment") if d["metadata"]["name"] == "lab-portal-web"]
    (container,) = [c for c in web["spec"]["template"]["spec"]["containers"] if c["name"] == "web"]
    probe = container["readinessProbe"]["httpGet"]["path"]
    assert client.get("/readyz").json()["failing"] == ["cluster", "sync"]
    assert client.get(probe).status_code == 200
