"""The student's lab page says in plain words when the cluster is in trouble, and says nothing when it is not; the
sync task tells the open pages when that changes."""

from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers
from django.core.cache import cache
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext

from conftest import PASSWORD, make_person
from labs import tasks
from labs.health import reset_cluster_probe
from labs.kubevirt import client as kube_client
from labs.models import Attempt, AttemptState, TenantNamespace
from labs.services import tenant_namespace_ensure
from labs.sync_health import check_sync, record_sync_success
from labs.tests.test_events import _receive_all
from portal.models import Role

NOTICE = "The cluster is not answering; your lab may be slow to start."


def forget_cache() -> None:
    """This run's cache keys only: django-redis's clear() is FLUSHDB, which would also wipe the keys (sync
    heartbeats, queued tasks) of the other test processes sharing the Redis database."""
    if hasattr(cache, "delete_pattern"):
        cache.delete_pattern("*")
    else:
        cache.clear()


@pytest.mark.django_db
def test_unreachable_cluster_is_announced_on_the_lab_page(client, settings, tmp_path, lab_a, student_a):
    settings.KUBECONFIG = str(tmp_path / "missing-kubeconfig")
    kube_client.reset()
    forget_cache()
    try:
        client.login(username=student_a.username, password=PASSWORD)
        page = client.get(reverse("labs:lab_detail", args=[lab_a.id]))
    finally:
        kube_client.reset()
        forget_cache()
    assert page.status_code == 200
    assert NOTICE in page.content.decode()


@pytest.mark.django_db
def test_healthy_cluster_shows_no_notice(client, cluster, lab_a, student_a):
    forget_cache()
    record_sync_success()
    client.login(username=student_a.username, password=PASSWORD)
    page = client.get(reverse("labs:lab_detail", args=[lab_a.id]))
    assert page.status_code == 200
    # The place the page script writes a notice into later, empty and hidden.
    assert 'id="cluster-notice" hidden></p>' in page.content.decode()


@pytest.fixture
def unreachable_cluster(settings, tmp_path):
    settings.KUBECONFIG = str(tmp_path / "missing-kubeconfig")
    kube_client.reset()
    forget_cache()
    yield
    kube_client.reset()
    forget_cache()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("state", "says", "never"),
    [
        (
            AttemptState.RUNNING,
            "The cluster is not answering. Your VM may still be running; Check and Stop will work when it is back.",
            "slow to start",
        ),
        (
            AttemptState.STOPPING,
            "The cluster is not answering; your lab will finish stopping when it is back.",
            "slow to start",
        ),
        (AttemptState.STARTING, NOTICE, "Check and Stop"),
    ],
)
def test_unreachable_cluster_notice_says_what_is_true_for_the_attempt(
    client, unreachable_cluster, lab_a, student_a, state, says, never
):
    attempt = Attempt.objects.create(lab=lab_a, student=student_a, tenant=lab_a.course.tenant, state=state)
    client.login(username=student_a.username, password=PASSWORD)
    pages = [
        client.get(reverse("labs:lab_detail", args=[lab_a.id])),
        client.get(reverse("labs:attempt_detail", args=[attempt.id])),
    ]
    for page in pages:
        assert page.status_code == 200
        text = page.content.decode()
        assert 'id="cluster-notice"' in text and says in text and never not in text


@pytest.mark.django_db
def test_running_attempt_notice_is_in_japanese_too(client, unreachable_cluster, lab_a, student_a):
    Attempt.objects.create(lab=lab_a, student=student_a, tenant=lab_a.course.tenant, state=AttemptState.RUNNING)
    client.login(username=student_a.username, password=PASSWORD)
    page = client.get(reverse("labs:lab_detail", args=[lab_a.id]), HTTP_ACCEPT_LANGUAGE="ja")
    english = "The cluster is not answering. Your VM may still be running; Check and Stop will work when it is back."
    with translation.override("ja"):
        japanese = gettext(english)
    assert japanese != english
    assert japanese in page.content.decode()


@pytest.mark.django_db
def test_the_sync_tells_open_pages_when_the_cluster_stops_answering_once_and_when_it_is_back(
    cluster, settings, tenant_a, lab_a, student_a
):
    settings.HEALTH_CLUSTER_CACHE_SECONDS = 0  # each failed pass asks the cluster afresh
    settings.ATTEMPT_RESYNC_SECONDS = 0  # a namespace where all runs is listed on every pass, not every 30 s
    forget_cache()
    tenant_namespace_ensure(tenant=tenant_a)
    running = Attempt.objects.create(
        lab=lab_a, student=student_a, tenant=tenant_a, state=AttemptState.RUNNING, namespace=tenant_a.namespace
    )
    channel = f"notice-test-{running.id}"
    async_to_sync(channel_layers.make_backend("default").group_add)(f"attempt-{running.id}", channel)

    def notices() -> list[dict]:
        return [m["texts"] for m in async_to_sync(_receive_all)(channel, quiet=0.5) if m["type"] == "cluster.notice"]

    tasks.sync_attempts()
    notices()  # the first pass the task remembers tells the pages all is well
    tasks.sync_attempts()
    assert notices() == []

    running_words = (
        "The cluster is not answering. Your VM may still be running; Check and Stop will work when it is back."
    )
    with translation.override("ja"):
        japanese = gettext(running_words)
    cluster.admin.inject_fault(code=503)
    try:
        tasks.sync_attempts()
        assert notices() == [{"en": running_words, "ja": japanese}]
        tasks.sync_attempts()  # still failing: the pages were told already
        assert notices() == []
    finally:
        cluster.admin.clear_faults()
    tasks.sync_attempts()
    assert notices() == [{"en": "", "ja": ""}]


RUNNING_WORDS = "The cluster is not answering. Your VM may still be running; Check and Stop will work when it is back."


@pytest.fixture
def two_tenants_running(cluster, settings, tenant_a, tenant_b, lab_a, lab_b, student_a, student_b):
    """A running attempt in each tenant's namespace, listed on every pass."""
    settings.ATTEMPT_RESYNC_SECONDS = 0
    forget_cache()
    reset_cluster_probe()  # an earlier test's failed probe is remembered a few seconds
    attempts = []
    for tenant, lab, student in ((tenant_a, lab_a, student_a), (tenant_b, lab_b, student_b)):
        tenant_namespace_ensure(tenant=tenant)
        attempts.append(
            Attempt.objects.create(
                lab=lab, student=student, tenant=tenant, state=AttemptState.RUNNING, namespace=tenant.namespace
            )
        )
    yield attempts
    cluster.admin.clear_faults()
    forget_cache()


def fail_lists_in(cluster, namespace: str) -> None:
    """The cluster refuses to list VMIs in ``namespace`` only, as a removed RoleBinding or a webhook would."""
    cluster.admin.inject_fault(code=500, verbs=["list"], resources=["virtualmachineinstances"], namespaces=[namespace])


@pytest.mark.django_db
def test_one_failing_namespace_leaves_the_sync_ready_and_the_other_tenants_pages_quiet(
    client, cluster, settings, two_tenants_running, student_b, lab_b
):
    failing, healthy = two_tenants_running
    # The namespace has failed for longer than the staleness limit: no pass has been free of errors since.
    record_sync_success(at=datetime.now(tz=UTC) - timedelta(seconds=2 * settings.HEALTH_SYNC_MAX_AGE_SECONDS))
    fail_lists_in(cluster, failing.namespace)
    tasks.sync_attempts()

    assert "injected by kubesim" in TenantNamespace.objects.get(namespace=failing.namespace).last_error
    assert check_sync().ok
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["failing"] == []
    client.login(username=student_b.username, password=PASSWORD)
    for url in (reverse("labs:lab_detail", args=[lab_b.id]), reverse("labs:attempt_detail", args=[healthy.id])):
        page = client.get(url)
        assert page.status_code == 200
        assert 'id="cluster-notice" hidden></p>' in page.content.decode()


@pytest.mark.django_db
def test_the_failing_namespaces_pages_alone_are_told_once_per_change(
    client, cluster, two_tenants_running, student_a, lab_a
):
    failing, healthy = two_tenants_running
    layer = channel_layers.make_backend("default")
    channels = {}
    for attempt in (failing, healthy):
        channels[attempt.id] = f"namespace-notice-{attempt.id}"
        async_to_sync(layer.group_add)(f"attempt-{attempt.id}", channels[attempt.id])

    def notices(attempt: Attempt) -> list[dict]:
        messages = async_to_sync(_receive_all)(channels[attempt.id], quiet=0.5)
        return [m["texts"] for m in messages if m["type"] == "cluster.notice"]

    tasks.sync_attempts()
    notices(failing), notices(healthy)  # the first pass the task remembers tells the pages all is well
    with translation.override("ja"):
        japanese = gettext(RUNNING_WORDS)

    fail_lists_in(cluster, failing.namespace)
    tasks.sync_attempts()
    assert notices(failing) == [{"en": RUNNING_WORDS, "ja": japanese}]
    assert notices(healthy) == []
    client.login(username=student_a.username, password=PASSWORD)
    for url in (reverse("labs:lab_detail", args=[lab_a.id]), reverse("labs:attempt_detail", args=[failing.id])):
        page = client.get(url).content.decode()
        # The words name neither the namespace nor what the cluster said there.
        assert RUNNING_WORDS in page and "injected by kubesim" not in page
    # A classmate who has not started yet is told of the namespace the Start would use.
    classmate = make_person(username="classmate_a", tenant=failing.tenant, course=lab_a.course, role=Role.STUDENT)
    client.login(username=classmate.username, password=PASSWORD)
    assert NOTICE in client.get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()
    tasks.sync_attempts()  # still failing: the page was told already
    assert notices(failing) == notices(healthy) == []

    cluster.admin.clear_faults()
    tasks.sync_attempts()
    assert notices(failing) == [{"en": "", "ja": ""}]
    assert notices(healthy) == []


@pytest.mark.django_db
def test_a_namespace_refused_for_want_of_rbac_is_left_to_the_start_before_one_and_told_after(
    client, cluster, two_tenants_running, student_a, lab_a
):
    failing, _healthy = two_tenants_running
    record_sync_success()
    refusal = f'virtualmachineinstances.kubevirt.io is forbidden: User "portal" cannot list in "{failing.namespace}"'
    TenantNamespace.objects.filter(namespace=failing.namespace).update(last_error=refusal)
    client.login(username=student_a.username, password=PASSWORD)
    assert RUNNING_WORDS in client.get(reverse("labs:attempt_detail", args=[failing.id])).content.decode()
    # Before a Start, whose refusal says "not ready yet" itself, the page does not say the cluster is away.
    classmate = make_person(username="classmate_r", tenant=failing.tenant, course=lab_a.course, role=Role.STUDENT)
    client.login(username=classmate.username, password=PASSWORD)
    assert 'id="cluster-notice" hidden></p>' in client.get(reverse("labs:lab_detail", args=[lab_a.id])).content.decode()


@pytest.mark.django_db
def test_pages_are_told_nothing_they_do_not_show_but_all_are_told_after_a_stall(cluster, settings, two_tenants_running):
    from labs.sync_health import SYNC_NOTICE_KEY

    first, second = two_tenants_running
    layer = channel_layers.make_backend("default")
    for attempt in (first, second):
        async_to_sync(layer.group_add)(f"attempt-{attempt.id}", f"stall-{attempt.id}")

    def notices(attempt: Attempt) -> list[dict]:
        messages = async_to_sync(_receive_all)(f"stall-{attempt.id}", quiet=0.5)
        return [m["texts"] for m in messages if m["type"] == "cluster.notice"]

    record_sync_success()
    cache.set(SYNC_NOTICE_KEY, {first.namespace: ""})  # the second namespace's first attempt is new to the task
    tasks.sync_attempts()
    assert notices(first) == notices(second) == []  # a page drawn while all is well shows no notice to take down
    # The loop stalled: pages drawn meanwhile say updates are delayed, and no pass told them. The next tells all.
    record_sync_success(at=datetime.now(tz=UTC) - timedelta(seconds=2 * settings.HEALTH_SYNC_MAX_AGE_SECONDS))
    tasks.sync_attempts()
    assert notices(first) == notices(second) == [{"en": "", "ja": ""}]
    tasks.sync_attempts()
    assert notices(first) == notices(second) == []
