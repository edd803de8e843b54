"""/metrics: protected, parseable Prometheus exposition whose figures follow the attempts, runs and counters."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from conftest import PASSWORD, make_person
from grading.models import GradingRun, RunState, RunTrigger
from labs.models import Attempt, AttemptState
from labs.pool_models import LabPool, PoolMode
from ops import metrics
from portal import metrics as event_counters
from portal.models import Role

TOKEN = "metrics-token-for-tests"


@pytest.fixture(autouse=True)
def clean_counters(settings):
    settings.METRICS_TOKEN = TOKEN
    for key in (metrics.CLUSTER_API_ERRORS_KEY, metrics.CONSOLE_SESSIONS_KEY):
        metrics.counters.clear(key)
    yield
    for key in (metrics.CLUSTER_API_ERRORS_KEY, metrics.CONSOLE_SESSIONS_KEY):
        metrics.counters.clear(key)


def scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, keyed by (sample name, sorted labels)."""
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def students(course, count: int, prefix: str):
    return [
        make_person(username=f"{prefix}{index}", tenant=course.tenant, course=course, role=Role.STUDENT)
        for index in range(count)
    ]


def attempt(lab, student, *, state: str, **fields) -> Attempt:
    return Attempt.objects.create(lab=lab, student=student, tenant=lab.course.tenant, state=state, **fields)


def test_metrics_refuse_anonymous_requests_and_wrong_tokens(client):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"METRICS_TOKEN" in response.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401


@pytest.mark.django_db
def test_metrics_without_a_token_setting_accept_no_bearer(client, settings):
    settings.METRICS_TOKEN = None
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer None").status_code == 401


@pytest.mark.django_db
def test_an_instructor_session_is_not_enough_but_a_superuser_session_is(client, instructor_a, superuser):
    # The figures span every tenant, so staff of one tenant may not read them.
    client.login(username=instructor_a.username, password=PASSWORD)
    assert client.get("/metrics").status_code == 401
    client.login(username=superuser.username, password=PASSWORD)
    assert client.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_attempt_counts_by_tenant_and_state_follow_the_database(client, lab_a, lab_b, course_a, course_b):
    namespace_a, namespace_b = lab_a.course.tenant.namespace, lab_b.course.tenant.namespace
    people_a = students(course_a, 3, "sa")
    person_b = students(course_b, 1, "sb")[0]
    running = [attempt(lab_a, person, state=AttemptState.RUNNING) for person in people_a[:2]]
    attempt(lab_a, people_a[2], state=AttemptState.STARTING)
    attempt(lab_b, person_b, state=AttemptState.FAILED)

    samples = scrape(client)
    assert samples[("portal_attempts", (("state", "running"), ("tenant", namespace_a)))] == 2
    assert samples[("portal_attempts", (("state", "starting"), ("tenant", namespace_a)))] == 1
    assert samples[("portal_attempts", (("state", "failed"), ("tenant", namespace_b)))] == 1
    assert samples[("portal_attempts_by_state", (("state", "running"),))] == 2
    assert samples[("portal_attempts_by_state", (("state", "stopped"),))] == 0

    assert samples[("portal_attempts_stopped_total", (("reason", "left"),))] == 0

    Attempt.objects.filter(id=running[0].id).update(state=AttemptState.STOPPED, stop_reason="left")
    Attempt.objects.filter(id=running[1].id).update(state=AttemptState.STOPPING, stop_reason="student")
    samples = scrape(client)
    assert samples[("portal_attempts_by_state", (("state", "running"),))] == 0
    assert samples[("portal_attempts_by_state", (("state", "stopped"),))] == 1
    assert samples[("portal_attempts_stopped_total", (("reason", "left"),))] == 1
    assert samples[("portal_attempts_stopped_total", (("reason", "student"),))] == 1
    assert samples[("portal_attempts_stopped_total", (("reason", "expired"),))] == 0


@pytest.mark.django_db
def test_start_phase_histogram_buckets_the_recent_attempts(client, lab_a, course_a):
    now = timezone.now()
    people = students(course_a, 3, "p")

    def started(person, *, provision: float, total: float, requested_ago: timedelta = timedelta(minutes=5)):
        requested = now - requested_ago
        attempt(
            lab_a,
            person,
            state=AttemptState.RUNNING,
            requested_at=requested,
            provisioned_at=requested + timedelta(seconds=provision),
            vmi_running_at=requested + timedelta(seconds=total - 0.01),
            agent_ready_at=requested + timedelta(seconds=total),
        )

    started(people[0], provision=0.04, total=0.3)
    started(people[1], provision=0.2, total=1.5)
    started(people[2], provision=0.2, total=40, requested_ago=timedelta(hours=3))  # outside the window

    samples = scrape(client)

    def bucket(phase: str, le: str) -> float:
        return samples[("portal_attempt_phase_seconds_bucket", (("le", le), ("phase", phase)))]

    assert bucket("total", "0.25") == 0
    assert bucket("total", "0.5") == 1
    assert bucket("total", "2.0") == 2
    assert bucket("total", "+Inf") == 2
    assert samples[("portal_attempt_phase_seconds_count", (("phase", "total"),))] == 2
    assert samples[("portal_attempt_phase_seconds_sum", (("phase", "total"),))] == pytest.approx(1.8)
    assert bucket("provision", "0.05") == 1
    assert bucket("provision", "0.25") == 2
    # No VMI phase was recorded for these attempts: those phases stay empty rather than guessed.
    assert samples[("portal_attempt_phase_seconds_count", (("phase", "scheduling"),))] == 0


def test_a_vmi_phase_stamped_in_whole_seconds_never_makes_a_negative_span(client, lab_a, course_a):
    """Kubernetes writes the VMI's phase times without fractions: a VMI Pending in the second its VM was created
    reads up to a second before the portal's precise provisioned_at. That span is 0, not negative."""
    requested = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    attempt(
        lab_a,
        students(course_a, 1, "w")[0],
        state=AttemptState.RUNNING,
        requested_at=requested,
        provisioned_at=requested + timedelta(seconds=1.8),
        pending_at=requested + timedelta(seconds=1),
        scheduling_at=requested + timedelta(seconds=3),
        vmi_running_at=requested + timedelta(seconds=4),
        agent_ready_at=requested + timedelta(seconds=4.5),
    )
    samples = scrape(client)
    assert samples[("portal_attempt_phase_seconds_count", (("phase", "pending"),))] == 1
    assert samples[("portal_attempt_phase_seconds_sum", (("phase", "pending"),))] == 0
    assert samples[("portal_attempt_phase_seconds_bucket", (("le", "0.05"), ("phase", "pending")))] == 1
    assert samples[("portal_attempt_phase_seconds_sum", (("phase", "scheduling"),))] == pytest.approx(2)


@pytest.mark.django_db
def test_grading_outcomes_and_durations_come_from_runs(client, lab_a, student_a):
    now = timezone.now()
    owner = attempt(lab_a, student_a, state=AttemptState.RUNNING)

    def run(state: str, *, seconds: float | None, trigger: str = RunTrigger.STUDENT):
        started = now - timedelta(seconds=30)
        return GradingRun.objects.create(
            attempt=owner,
            state=state,
            trigger=trigger,
            started_at=started,
            finished_at=started + timedelta(seconds=seconds) if seconds is not None else None,
            score=Decimal("1") if state == RunState.DONE else None,
        )

    run(RunState.DONE, seconds=0.8)
    run(RunState.DONE, seconds=3, trigger=RunTrigger.EXPIRY)
    run(RunState.ERROR, seconds=20)
    run(RunState.QUEUED, seconds=None)

    samples = scrape(client)
    assert samples[("portal_grading_runs_total", (("outcome", "done"), ("trigger", "student")))] == 1
    assert samples[("portal_grading_runs_total", (("outcome", "done"), ("trigger", "expiry")))] == 1
    assert samples[("portal_grading_runs_total", (("outcome", "error"), ("trigger", "student")))] == 1
    assert samples[("portal_grading_runs_unfinished", (("state", "queued"),))] == 1
    assert samples[("portal_grading_run_seconds_bucket", (("le", "1.0"), ("outcome", "done")))] == 1
    assert samples[("portal_grading_run_seconds_bucket", (("le", "5.0"), ("outcome", "done")))] == 2
    assert samples[("portal_grading_run_seconds_count", (("outcome", "error"),))] == 1
    assert samples[("portal_grading_run_seconds_sum", (("outcome", "error"),))] == pytest.approx(20)


@pytest.mark.django_db
def test_shared_counters_for_cluster_errors_and_console_sessions(client):
    event_counters.record_cluster_api_error(operation="list_vmis", reason="503")
    event_counters.record_cluster_api_error(operation="list_vmis", reason="503")
    event_counters.record_cluster_api_error(operation="create_vm", reason="timeout")
    for _ in range(3):
        event_counters.console_session_opened()
    event_counters.console_session_closed()

    samples = scrape(client)
    assert samples[("portal_cluster_api_errors_total", (("operation", "list_vmis"), ("reason", "503")))] == 2
    assert samples[("portal_cluster_api_errors_total", (("operation", "create_vm"), ("reason", "timeout")))] == 1
    assert samples[("portal_console_sessions_opened_total", ())] == 3
    assert samples[("portal_console_sessions_active", ())] == 2


@pytest.mark.django_db
async def test_async_console_counters_for_consumers(client):
    await sync_to_async(event_counters.console_session_opened)()
    await event_counters.aconsole_session_closed()
    assert metrics.counters.read(metrics.CONSOLE_SESSIONS_KEY) == {"opened": 1, "closed": 1}


@pytest.mark.django_db
def test_counters_live_in_redis_so_every_process_sees_them(settings):
    import redis

    event_counters.record_cluster_api_error(operation="watch_vmis", reason="connection")
    other_process_view = redis.Redis.from_url(settings.REDIS_URL)
    key = settings.REDIS_KEY_PREFIX + metrics.CLUSTER_API_ERRORS_KEY
    assert other_process_view.hget(key, "watch_vmis|connection") == b"1"


@pytest.mark.django_db
def test_a_scrape_costs_a_fixed_handful_of_queries(client, lab_a, course_a, django_assert_max_num_queries):
    for person in students(course_a, 20, "q"):
        attempt(lab_a, person, state=AttemptState.RUNNING, agent_ready_at=timezone.now())
    # Two of them the warm pools' (the pools, and their VMs' times), however many pools and VMs there are.
    with django_assert_max_num_queries(10):
        scrape(client)


@pytest.mark.django_db
def test_a_broken_source_is_reported_and_the_rest_still_served(client, settings):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
    }
    samples = scrape(client)
    assert samples[("portal_metrics_source_up", (("source", "sync"),))] == 0
    assert samples[("portal_metrics_source_up", (("source", "attempts"),))] == 1
    assert ("portal_attempts_by_state", (("state", "running"),)) in samples


@pytest.mark.django_db
def test_failed_cluster_calls_are_counted_by_operation_and_status(client, cluster):
    from labs.kubevirt import operations

    # 500, not 503: urllib3 itself retries a 503 that carries Retry-After, as kubesim's does.
    cluster.admin.inject_fault(code=500, verbs=["list"], resources=["virtualmachineinstances"], count=1)
    try:
        with pytest.raises(operations.ClusterError):
            operations.vmis_list(namespace="default")
    finally:
        cluster.admin.clear_faults()
    assert operations.vmis_list(namespace="default") == []  # succeeded: not counted
    samples = scrape(client)
    key = ("portal_cluster_api_errors_total", (("operation", "listing_virtualmachineinstances"), ("reason", "500")))
    assert samples[key] == 1


def test_every_family_served_is_listed_for_operators(client, lab_a, course_a, settings):
    """deploy/README.md (Metrics) is the operators' list: a family added to the scrape is added there too."""
    LabPool.objects.create(lab=lab_a, mode=PoolMode.ALWAYS, size=1)
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    listed = (settings.BASE_DIR / "deploy" / "README.md").read_text()
    families = {family.name for family in text_string_to_metric_families(response.content.decode())}
    assert "portal_pool_hit_ratio" in families
    assert {name for name in families if f"`{name}" not in listed} == set()
