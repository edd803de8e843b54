"""List faults (500, 503, 429 with a long Retry-After, latency) against the real worker and beat while the cluster
moves: the state converges once they clear, retries back off, /readyz names the trouble, and no watch is opened (the
portal lists each namespace per sync, so 410 Gone and dropped watch streams cannot leave it stale)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from django.test import Client

from labs import tasks
from labs.kubevirt import operations
from labs.models import Attempt, AttemptState
from labs.services import attempt_start, attempt_stop
from labs.tests.reliability import (
    PortalProcesses,
    agreement,
    cluster_fixture,
    flush_redis,
    kubesim_fixture,
    make_course,
    make_lab,
    make_students,
    make_tenant,
    wait_until,
)
from labs.wording import cluster_notice

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

SYNC_SECONDS = 1
SWEEP_SECONDS = 2
# Namespaces where everything runs are listed this often (30 s in production): a crash is seen within it.
RESYNC_SECONDS = 2


kubesim = kubesim_fixture("faults")
# /readyz is asked in this process: a sync pass older than 3 s counts as stale. The portal fixture sets up the
# database and Redis.
cluster = cluster_fixture(database=False, HEALTH_SYNC_MAX_AGE_SECONDS=3, HEALTH_CLUSTER_CACHE_SECONDS=0)


@pytest.fixture
def portal(cluster, tmp_path, transactional_db):
    flush_redis()
    processes = PortalProcesses(
        directory=tmp_path / "processes",
        kubeconfig=cluster.kubeconfig,
        concurrency=3,
        env_overrides={
            "ATTEMPT_SYNC_INTERVAL_SECONDS": str(SYNC_SECONDS),
            "ATTEMPT_SWEEP_INTERVAL_SECONDS": str(SWEEP_SECONDS),
            "ATTEMPT_RESYNC_SECONDS": str(RESYNC_SECONDS),
        },
    )
    processes.start()
    yield processes
    processes.stop()
    flush_redis()


def running_attempts(count_per_tenant: int, portal: PortalProcesses, *names: str) -> list[list[Attempt]]:
    """``count_per_tenant`` running attempts in each of the named tenants (started through the worker)."""
    groups = []
    for name in names:
        lab = make_lab(make_course(make_tenant(name)))
        groups.append([attempt_start(actor=s, lab=lab) for s in make_students(lab.course, count_per_tenant)])
    everyone = [a for group in groups for a in group]

    def all_running() -> bool:
        return all(Attempt.objects.get(pk=a.pk).state == AttemptState.RUNNING for a in everyone)

    wait_until(all_running, timeout=60, what="attempts to run", describe=portal.log_tail)
    for attempt in everyone:
        attempt.refresh_from_db()
    return groups


def readyz() -> tuple[int, dict]:
    response = Client().get("/readyz")
    return response.status_code, response.json()


def requests_during(cluster, seconds: float, *, each: Callable[[], None] | None = None) -> dict[str, int]:
    """Let ``seconds`` pass (calling ``each`` every 0.2 s) and return the API requests made meanwhile."""
    cluster.admin.reset_counters()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if each is not None:
            each()
        time.sleep(0.2)
    return cluster.admin.counters()["by_verb_resource"]


def state(attempt: Attempt) -> str:
    return Attempt.objects.get(pk=attempt.pk).state


def vm_deletes(cluster) -> int:
    """VM deletions the API server was asked for so far, answered or refused."""
    return cluster.admin.counters()["by_verb_resource"].get("delete virtualmachines", 0)


def test_a_burst_of_500s_on_lists_converges_with_bounded_requests_and_readiness_says_so(portal, cluster):
    (first, second) = running_attempts(2, portal, "Faults North", "Faults South")
    tenants = [first[0].tenant, second[0].tenant]
    crashed, kept = first
    stopped, untouched = second
    wait_until(lambda: readyz()[0] == 200, timeout=15, what="/readyz ready", describe=lambda: str(readyz()[1]))

    cluster.admin.inject_fault(code=500, verbs=["list"])
    cluster.admin.fail_vmi(crashed.namespace, crashed.vm_name, reason="Crashed", message="the guest kernel panicked")
    attempt_stop(actor=stopped.student, attempt=stopped)
    readiness_seen: list[dict] = []

    def look_at_readiness() -> None:
        status, body = readyz()
        if status == 503:
            readiness_seen.append(body)

    window = 6.0
    made = requests_during(cluster, window, each=look_at_readiness)

    # The sync and the sweep kept their pace: about one list per namespace per sync and two per sweep, never a
    # tight loop (the kubernetes client no longer retries a 500 by itself either).
    lists = sum(count for key, count in made.items() if key.startswith("list "))
    namespaces = len(tenants)
    bound = namespaces * (window / SYNC_SECONDS + 2 * window / SWEEP_SECONDS + 4)
    assert 0 < lists <= bound, (lists, bound, made)
    # Meanwhile /readyz named the stale sync loop, in words, with its last failure.
    assert readiness_seen, "readiness never reported the failing sync loop"
    assert "sync" in readiness_seen[-1]["failing"]
    assert "failed" in readiness_seen[-1]["components"]["sync"]["message"]
    # Nothing was decided on missing information: the crashed VMI is not yet known, the others run.
    assert state(kept) == state(untouched) == AttemptState.RUNNING

    cluster.admin.clear_faults()
    wait_until(
        lambda: state(crashed) == AttemptState.FAILED and state(stopped) == AttemptState.STOPPED,
        timeout=20,
        what="the state to converge",
        describe=portal.log_tail,
    )
    crashed.refresh_from_db()
    assert "Crashed" in crashed.failure_reason or "panicked" in crashed.failure_reason, crashed.failure_reason
    assert state(kept) == state(untouched) == AttemptState.RUNNING
    wait_until(lambda: readyz()[0] == 200, timeout=15, what="/readyz ready again", describe=lambda: str(readyz()[1]))
    wait_until(
        lambda: not agreement(tenants).problems,
        timeout=20,
        what="database and cluster to agree",
        describe=lambda: str(agreement(tenants).problems),
    )
    # The portal never opened a watch: 410 Gone and dropped watch streams cannot leave it stale.
    assert cluster.admin.drop_watches() == 0
    assert cluster.admin.counters()["open_watches"] == 0


def test_a_429_with_a_long_retry_after_does_not_stall_the_sync(portal, cluster):
    (attempts,) = running_attempts(2, portal, "Rate Limited")
    crashed, kept = attempts
    cluster.admin.inject_fault(code=429, verbs=["list"], retry_after=30)
    cluster.admin.fail_vmi(crashed.namespace, crashed.vm_name, reason="Crashed")
    window = 4.0
    made = requests_during(cluster, window)
    lists = sum(count for key, count in made.items() if key.startswith("list "))
    assert 0 < lists <= window / SYNC_SECONDS + 2 * window / SWEEP_SECONDS + 4, made

    cluster.admin.clear_faults()
    # A request that honoured the 30 s Retry-After itself (three times over, as urllib3 does by default) would hold
    # the sync for a minute and a half; the first such wait began as the 4 s window opened, so it would end 26 s after
    # the fault cleared at the earliest. 20 s is short of that, and ample for the portal's own pace on a busy host.
    wait_until(
        lambda: state(crashed) == AttemptState.FAILED, timeout=20, what="the crash to be seen", describe=portal.log_tail
    )
    assert state(kept) == AttemptState.RUNNING


def test_503_on_every_request_with_latency_backs_off_then_starts_the_lab(portal, cluster):
    (attempts,) = running_attempts(1, portal, "Unavailable")
    lab = attempts[0].lab
    (late_student,) = make_students(lab.course, 1, prefix="late")
    wait_until(lambda: readyz()[0] == 200, timeout=15, what="/readyz ready", describe=lambda: str(readyz()[1]))

    cluster.admin.inject_fault(code=503, latency={"*": 0.3})
    started = attempt_start(actor=late_student, lab=lab)  # the worker's provisioning meets the outage
    readiness_seen: list[dict] = []

    def look_at_readiness() -> None:
        status, body = readyz()
        if status == 503:
            readiness_seen.append(body)

    window = 8.0
    made = requests_during(cluster, window, each=look_at_readiness)
    # Provisioning retried with capped exponential backoff (1, 2, 4 s ...): a handful of tries, not a storm.
    secret_creates = made.get("create secrets", 0)
    assert 1 <= secret_creates <= 5, made
    assert made.get("create virtualmachines", 0) == 0
    # /readyz named the cluster (its /version probe got the 503 too), and students get a plain sentence.
    assert readiness_seen and "cluster" in readiness_seen[-1]["failing"]
    assert "HTTP 503" in readiness_seen[-1]["components"]["cluster"]["message"]
    assert cluster_notice(state=state(started)) == "The cluster is not answering; your lab may be slow to start."
    assert state(started) == AttemptState.PROVISIONING  # still trying, not failed, not stuck silently

    cluster.admin.clear_faults()
    wait_until(
        lambda: state(started) == AttemptState.RUNNING,
        timeout=90,
        what="the delayed start to run",
        describe=portal.log_tail,
    )
    assert operations.vm_get(namespace=started.namespace, name=started.vm_name) is not None
    wait_until(lambda: readyz()[0] == 200, timeout=15, what="/readyz ready again", describe=lambda: str(readyz()[1]))


def test_task_backoff_is_capped_whatever_the_server_asks():
    # Celery's Redis transport redelivers a task whose countdown passes its visibility timeout: no retry may wait
    # that long, whatever Retry-After the API server sent.
    from django.conf import settings

    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    delays = [tasks.backoff_seconds(retries) for retries in range(tasks.MAX_RETRIES + 1)]
    assert delays[0] < delays[3] and max(delays) <= tasks.BACKOFF_CAP_SECONDS * 1.25
    error = operations.cluster_error(_rate_limited(retry_after="86400"), doing="listing")
    assert error.transient and error.retry_after is not None
    assert tasks.backoff_seconds(0, error.retry_after) <= tasks.BACKOFF_CAP_SECONDS * 1.25 < visibility


def _rate_limited(*, retry_after: str):
    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=429, reason="Too Many Requests")
    exc.headers = {"Retry-After": retry_after}
    exc.body = '{"message": "Too many requests, please try again later."}'
    return exc


def test_a_stop_during_an_outage_finishes_as_soon_as_the_cluster_answers(portal, cluster):
    (attempts,) = running_attempts(1, portal, "Outage Stop")
    (attempt,) = attempts
    cluster.admin.inject_fault(code=503)
    deletes_before = vm_deletes(cluster)
    attempt_stop(actor=attempt.student, attempt=attempt)
    # Once the teardown's fifth try has failed, its next retry waits 16 to 20 s (backoff 1, 2, 4, 8, 16 s), and the
    # sweep queues a lost teardown again only after minutes.
    wait_until(
        lambda: vm_deletes(cluster) - deletes_before >= 5,
        timeout=60,
        what="the teardown's fifth try",
        describe=portal.log_tail,
    )
    assert state(attempt) == AttemptState.STOPPING

    cluster.admin.clear_faults()
    # The first sync that reaches the cluster resumes the teardown: not its next retry, 16 s away.
    wait_until(
        lambda: state(attempt) == AttemptState.STOPPED, timeout=12, what="the stop to finish", describe=portal.log_tail
    )
    again = attempt_start(actor=attempt.student, lab=attempt.lab)  # no 409: the student starts again at once
    assert again.state == AttemptState.REQUESTED
