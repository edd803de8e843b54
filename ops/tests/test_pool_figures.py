"""Warm pools' figures on /metrics and on the operations dashboard, each tenant seeing only its own; the admin's
suggested size and window."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from conftest import PASSWORD, make_person
from labs.models import Attempt, AttemptState, LabPool, PoolMode, PoolVm, PoolVmState
from labs.pool_selectors import SCHEDULE_LEAD, SCHEDULE_TAIL, pool_stats, pool_suggestion
from ops.tests.test_metrics import TOKEN, scrape
from portal.models import Role

pytestmark = pytest.mark.django_db


def pool_vm(pool, state: str, *, minutes_up: float, claimed_after: float | None = None, attempt=None) -> PoolVm:
    created = timezone.now() - timedelta(minutes=minutes_up)
    return PoolVm.objects.create(
        pool=pool,
        tenant=pool.lab.course.tenant,
        lab=pool.lab,
        state=state,
        vm_name=f"pool-{PoolVm.objects.count() + 1}",
        namespace=pool.lab.course.tenant.namespace,
        agent_token="t" * 32,
        vcpus=1,
        memory_mib=2048,
        launcher_memory_mib=2300,
        created_at=created,
        claimed_at=created + timedelta(minutes=claimed_after) if claimed_after is not None else None,
        attempt=attempt,
    )


@pytest.fixture
def busy_pool(lab_a, student_a) -> LabPool:
    pool = LabPool.objects.create(lab=lab_a, mode=PoolMode.ALWAYS, size=3, misses=1)
    pool_vm(pool, PoolVmState.READY, minutes_up=10)
    pool_vm(pool, PoolVmState.BOOTING, minutes_up=1)
    running = Attempt.objects.create(
        lab=lab_a, student=student_a, tenant=lab_a.course.tenant, state=AttemptState.RUNNING
    )
    pool_vm(pool, PoolVmState.CLAIMED, minutes_up=30, claimed_after=5, attempt=running)
    return pool


def test_pool_stats_count_states_hits_misses_and_idle_time(busy_pool):
    (stats,) = pool_stats()
    assert (stats.target, stats.ready, stats.booting, stats.claimed) == (3, 1, 1, 1)
    assert (stats.hits, stats.misses, stats.hit_ratio) == (1, 1, 0.5)
    # 10 + 1 minutes unclaimed so far, and 5 before the claim.
    assert 16 <= stats.idle_vm_minutes < 18


def test_a_pool_short_of_its_target_for_want_of_quota_says_so_on_the_dashboard(admin_client, busy_pool, tenant_a):
    assert pool_stats()[0].problem == ""  # one VM short, with room in the quota: the next refill makes it
    tenant_a.max_concurrent_vms = 3  # held by the running attempt and the two unclaimed pool VMs
    tenant_a.save(update_fields=["max_concurrent_vms"])
    page = admin_client.get("/admin/ops/").content.decode()
    assert "Not booting:" in page and "quota has no room for another VM of this lab" in page


def test_metrics_show_each_pool(client, settings, busy_pool):
    settings.METRICS_TOKEN = TOKEN
    samples = scrape(client)
    key = (("lab", str(busy_pool.lab_id)), ("tenant", busy_pool.lab.course.tenant.namespace))
    assert samples[("portal_pool_vms", (*key[:1], ("state", "ready"), key[1]))] == 1
    assert samples[("portal_pool_hits_total", key)] == 1
    assert samples[("portal_pool_misses_total", key)] == 1
    assert samples[("portal_pool_hit_ratio", key)] == 0.5
    # At least the 16 minutes of the fixture; the two unclaimed VMs keep adding while the test runs.
    assert 16 * 60 <= samples[("portal_pool_idle_vm_seconds_total", key)] < 16 * 60 + 120
    assert samples[("portal_metrics_source_up", (("source", "pools"),))] == 1


def test_the_dashboard_shows_a_tenant_its_pools_and_not_the_others(client, busy_pool, tenant_b, course_b, lab_b):
    LabPool.objects.create(lab=lab_b, mode=PoolMode.ALWAYS, size=2)
    instructor = make_person(
        username="pool_instructor",
        tenant=busy_pool.lab.course.tenant,
        course=busy_pool.lab.course,
        role=Role.INSTRUCTOR,
        is_staff=True,
    )
    client.login(username=instructor.username, password=PASSWORD)
    response = client.get("/admin/ops/")
    assert response.status_code == 200
    assert [row.lab_id for row in response.context["pools"]] == [busy_pool.lab_id]
    assert "Warm pools" in response.content.decode()


def test_the_suggestion_covers_the_class_within_the_quota_around_the_opening(lab_a, course_a, tenant_a):
    for index in range(12):
        make_person(username=f"enrolled{index}", tenant=tenant_a, course=course_a, role=Role.STUDENT)
    tenant_a.max_concurrent_vms = 10
    tenant_a.save(update_fields=["max_concurrent_vms"])
    lab_a.opens_at = timezone.now() + timedelta(days=1)
    lab_a.save(update_fields=["opens_at"])
    suggestion = pool_suggestion(lab=lab_a)
    assert suggestion.enrolled == 12 + 0  # the fixtures' student_a is not requested here
    assert (suggestion.scheduled_size, suggestion.always_size) == (10, 2)
    assert (
        suggestion.starts_at == lab_a.opens_at - SCHEDULE_LEAD and suggestion.ends_at == lab_a.opens_at + SCHEDULE_TAIL
    )


def test_a_scheduled_pool_wants_vms_only_inside_its_window(lab_a):
    now = timezone.now()
    pool = LabPool(lab=lab_a, mode=PoolMode.SCHEDULED, size=5, starts_at=now, ends_at=now + timedelta(hours=1))
    assert pool.target(now - timedelta(seconds=1)) == 0
    assert pool.target(now) == 5
    assert pool.target(now + timedelta(hours=1)) == 0
    pool.mode = PoolMode.OFF
    assert pool.target(now) == 0


def test_an_instructor_sets_a_pool_for_their_lab_but_not_another_tenants(client, instructor_a, lab_a, lab_b):
    instructor_a.is_staff = True
    instructor_a.save(update_fields=["is_staff"])
    client.force_login(instructor_a)
    add = reverse("admin:labs_labpool_add")
    data = {"mode": "always", "size": 2, "starts_at_0": "", "starts_at_1": "", "ends_at_0": "", "ends_at_1": ""}
    refused = client.post(add, {**data, "lab": lab_b.pk})
    assert refused.status_code == 200 and not LabPool.objects.exists()
    response = client.post(add, {**data, "lab": lab_a.pk})
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else response
    assert LabPool.objects.get().lab == lab_a
    change = client.get(reverse("admin:labs_labpool_change", args=[LabPool.objects.get().pk]))
    assert "students enrolled" in change.content.decode()


def test_a_scheduled_pool_that_has_already_ended_is_refused_at_save(admin_client, lab_a):
    add = reverse("admin:labs_labpool_add")
    data = {"lab": lab_a.pk, "mode": "scheduled", "size": 2, "starts_at_0": "2020-01-06", "starts_at_1": "09:00"}
    response = admin_client.post(add, {**data, "ends_at_0": "2020-01-06", "ends_at_1": "11:00"})
    assert response.status_code == 200 and not LabPool.objects.exists()
    assert "This time has passed" in str(response.context["adminform"].form.errors["ends_at"])
    later = (timezone.localtime() + timedelta(days=1)).strftime("%Y-%m-%d")
    assert admin_client.post(add, {**data, "ends_at_0": later, "ends_at_1": "11:00"}).status_code == 302


def test_long_ended_pool_vm_rows_are_pruned_and_their_figures_kept(settings, busy_pool, lab_a, student_a):
    from labs.services.pools import pool_vms_prune

    settings.POOL_VM_RETENTION_DAYS = 30
    day = 24 * 60
    long_ago = timezone.now() - timedelta(days=31)
    stopped = Attempt.objects.create(
        lab=lab_a, student=student_a, tenant=lab_a.course.tenant, state=AttemptState.STOPPED
    )
    other = make_person(username="old_student", tenant=lab_a.course.tenant, course=lab_a.course, role=Role.STUDENT)
    still_running = Attempt.objects.create(
        lab=lab_a, student=other, tenant=lab_a.course.tenant, state=AttemptState.RUNNING
    )
    old_hit = pool_vm(busy_pool, PoolVmState.CLAIMED, minutes_up=40 * day, claimed_after=8 * day + 7, attempt=stopped)
    old_drained = pool_vm(busy_pool, PoolVmState.DELETED, minutes_up=35 * day)
    PoolVm.objects.filter(id=old_drained.id).update(ended_at=long_ago)
    # Kept: a claimed VM whose attempt is still active, however old, and one deleted recently.
    held = pool_vm(busy_pool, PoolVmState.CLAIMED, minutes_up=40 * day, claimed_after=3, attempt=still_running)
    recent = pool_vm(busy_pool, PoolVmState.DELETED, minutes_up=60)
    PoolVm.objects.filter(id=recent.id).update(ended_at=timezone.now() - timedelta(days=29))
    now = timezone.now()
    (before,) = pool_stats(now=now)

    assert pool_vms_prune(now=now) == 2
    assert not PoolVm.objects.filter(id__in=[old_hit.id, old_drained.id]).exists()
    assert PoolVm.objects.filter(id__in=[held.id, recent.id]).count() == 2
    busy_pool.refresh_from_db()
    assert busy_pool.pruned_hits == 1
    assert busy_pool.pruned_idle_seconds == pytest.approx((8 * day + 7) * 60 + (4 * day) * 60, abs=5)
    (after,) = pool_stats(now=now)
    assert (after.hits, after.misses, after.ready, after.booting, after.claimed) == (
        before.hits,
        before.misses,
        before.ready,
        before.booting,
        before.claimed,
    )
    assert after.idle_vm_seconds == pytest.approx(before.idle_vm_seconds)
    assert pool_vms_prune(now=now) == 0


def test_a_pool_whose_rows_were_all_pruned_keeps_its_figures(settings, lab_b):
    from labs.services.pools import pool_vms_prune

    pool = LabPool.objects.create(lab=lab_b, mode=PoolMode.ALWAYS, size=1)
    gone = pool_vm(pool, PoolVmState.DELETED, minutes_up=50 * 24 * 60)
    PoolVm.objects.filter(id=gone.id).update(ended_at=timezone.now() - timedelta(days=40))
    LabPool.objects.filter(id=pool.id).update(mode=PoolMode.OFF)
    assert pool_vms_prune() == 1
    (stats,) = pool_stats()
    assert stats.lab_id == lab_b.id and stats.idle_vm_seconds == pytest.approx(10 * 24 * 3600, abs=5)


def test_the_pool_pass_prunes_hourly(settings, lab_b):
    from django.core.cache import cache

    from labs import tasks

    pool = LabPool.objects.create(lab=lab_b, mode=PoolMode.OFF, size=0)
    first, second = (pool_vm(pool, PoolVmState.DELETED, minutes_up=50 * 24 * 60) for _n in range(2))
    PoolVm.objects.filter(id=first.id).update(ended_at=timezone.now() - timedelta(days=40))
    cache.delete(tasks.PRUNE_KEY)
    tasks.tend_pools()
    assert list(PoolVm.objects.filter(pool=pool)) == [second]
    PoolVm.objects.filter(id=second.id).update(ended_at=timezone.now() - timedelta(days=40))
    tasks.tend_pools()
    assert list(PoolVm.objects.filter(pool=pool)) == [second]  # not again within the hour
    cache.delete(tasks.PRUNE_KEY)
