"""The operations dashboard: scoped to the viewer's tenants, capacity against quota, start latency percentiles."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from conftest import PASSWORD, make_person
from labs.models import Attempt, AttemptState, TenantNamespace
from labs.sizes import launcher_requests
from ops.dashboard import ops_overview_for_user, percentile
from portal.models import Role

URL = "/admin/ops/"


def attempt(lab, *, state: str, username: str, **fields) -> Attempt:
    student = make_person(username=username, tenant=lab.course.tenant, course=lab.course, role=Role.STUDENT)
    return Attempt.objects.create(lab=lab, student=student, tenant=lab.course.tenant, state=state, **fields)


@pytest.fixture
def both_tenants_busy(lab_a, lab_b):
    now = timezone.now()
    # Tenant A: two running medium VMs with recorded launcher requests, one starting small VM without them.
    for index, total in enumerate((1.0, 3.0)):
        attempt(
            lab_a,
            state=AttemptState.RUNNING,
            username=f"run_a{index}",
            vcpus=2,
            memory_mib=4096,
            launcher_cpu_millicores=200,
            launcher_memory_mib=4400,
            requested_at=now - timedelta(minutes=10),
            agent_ready_at=now - timedelta(minutes=10, seconds=-total),
        )
    attempt(lab_a, state=AttemptState.STARTING, username="start_a", vcpus=1, memory_mib=2048)
    attempt(
        lab_a,
        state=AttemptState.STOPPED,
        username="done_a",
        vcpus=2,
        memory_mib=4096,
        launcher_cpu_millicores=200,
        launcher_memory_mib=4400,
    )
    # Tenant B: one running VM.
    attempt(
        lab_b,
        state=AttemptState.RUNNING,
        username="run_b0",
        vcpus=4,
        memory_mib=8192,
        launcher_cpu_millicores=400,
        launcher_memory_mib=8500,
        requested_at=now - timedelta(minutes=3),
        agent_ready_at=now - timedelta(minutes=3, seconds=-9),
    )


def test_percentile_interpolates_between_ranks():
    assert percentile([], 50) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)


@pytest.mark.django_db
def test_capacity_counts_held_vms_and_launcher_requests_against_quota(instructor_a, both_tenants_busy):
    overview = ops_overview_for_user(user=instructor_a)
    (row,) = overview.tenants
    assert row.tenant == instructor_a.tenant
    assert (row.running, row.starting, row.active) == (2, 1, 3)
    assert row.vcpus == 2 + 2 + 1
    small = launcher_requests(vcpus=1, memory_mib=2048)  # not recorded on the attempt: computed the same way
    assert row.cpu_millicores == 200 + 200 + small.cpu_millicores
    assert row.memory_mib == 4400 + 4400 + small.memory_mib
    assert row.vm_percent == round(100 * 3 / instructor_a.tenant.max_concurrent_vms)
    assert row.vcpu_percent == round(100 * 5 / instructor_a.tenant.max_vcpus)
    assert row.start.count == 2
    assert row.start.p50 == pytest.approx(2.0)
    assert row.start.p95 == pytest.approx(2.9)


@pytest.mark.django_db
def test_a_quota_lowered_below_what_runs_reads_as_over_quota_with_a_full_bar(client, instructor_a, both_tenants_busy):
    tenant = instructor_a.tenant
    tenant.max_concurrent_vms, tenant.max_vcpus = 2, 0  # 3 VMs and 5 vCPUs held
    tenant.save(update_fields=["max_concurrent_vms", "max_vcpus"])
    client.login(username=instructor_a.username, password=PASSWORD)
    response = client.get(URL)
    (row,) = response.context["overview"].tenants
    assert (row.vm_percent, row.vcpu_percent) == (150, 100)
    body = response.content.decode()
    assert body.count("over quota") == 2  # VMs and vCPUs; memory is within its quota
    assert 'style="width: 150%" class="ops-high"' in body and 'style="width: 100%" class="ops-high"' in body


@pytest.mark.django_db
def test_the_time_the_figures_were_taken_names_its_zone(client, instructor_a):
    instructor_a.tenant.time_zone = "Asia/Tokyo"
    instructor_a.tenant.save(update_fields=["time_zone"])
    client.login(username=instructor_a.username, password=PASSWORD)
    body = client.get(URL).content.decode()
    assert re.search(r"Generated at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d JST\.", body)


@pytest.mark.django_db
def test_instructor_of_tenant_b_never_sees_tenant_a(client, instructor_b, tenant_a, both_tenants_busy):
    client.login(username=instructor_b.username, password=PASSWORD)
    response = client.get(URL)
    assert response.status_code == 200
    body = response.content.decode()
    assert instructor_b.tenant.name in body
    assert tenant_a.name not in body
    assert tenant_a.namespace not in body
    assert [row.tenant for row in response.context["overview"].tenants] == [instructor_b.tenant]
    assert response.context["overview"].start.count == 1


@pytest.mark.django_db
def test_superuser_sees_every_tenant(client, superuser, tenant_a, tenant_b, both_tenants_busy):
    client.login(username=superuser.username, password=PASSWORD)
    response = client.get(URL)
    assert response.status_code == 200
    tenants = [row.tenant for row in response.context["overview"].tenants]
    assert set(tenants) == {tenant_a, tenant_b}
    assert response.context["overview"].start.count == 3
    body = response.content.decode()
    assert tenant_a.name in body and tenant_b.name in body


@pytest.mark.django_db
def test_people_without_staff_access_are_sent_to_the_admin_login(client, ta_a, student_a):
    for person in (ta_a, student_a):
        client.login(username=person.username, password=PASSWORD)
        response = client.get(URL)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))
    client.logout()
    assert client.get(URL).status_code == 302


@pytest.mark.django_db
def test_staff_without_an_instructor_role_are_refused(client, tenant_a, course_a):
    helper = make_person(username="staff_ta", tenant=tenant_a, course=course_a, role=Role.TA, is_staff=True)
    client.login(username=helper.username, password=PASSWORD)
    assert client.get(URL).status_code == 403


@pytest.mark.django_db
def test_admin_index_links_to_the_dashboard(client, instructor_a):
    client.login(username=instructor_a.username, password=PASSWORD)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 200
    assert f'href="{URL}"' in response.content.decode()


@pytest.mark.django_db
def test_only_superusers_see_the_sync_error_text(client, instructor_a, superuser):
    from labs import sync_health

    sync_health.record_sync_error(message="listing VMIs in lab-other-tenant failed")
    try:
        client.login(username=instructor_a.username, password=PASSWORD)
        assert "lab-other-tenant" not in client.get(URL).content.decode()
        client.login(username=superuser.username, password=PASSWORD)
        assert "lab-other-tenant" in client.get(URL).content.decode()
    finally:
        from django.core.cache import cache

        cache.delete(sync_health.SYNC_LAST_ERROR_KEY)


@pytest.mark.django_db
def test_a_failing_namespace_is_shown_in_words_with_how_long_to_its_tenants_operators(
    client, tenant_a, instructor_a, instructor_b, superuser
):
    now = timezone.now()
    TenantNamespace.objects.create(
        tenant=tenant_a,
        namespace=tenant_a.namespace,
        listed_at=now - timedelta(minutes=12),
        last_error="listing virtualmachineinstances: Internal error occurred",
        last_error_at=now - timedelta(minutes=1),
    )
    for operator in (instructor_a, superuser):
        client.login(username=operator.username, password=PASSWORD)
        page = client.get(URL).content.decode()
        assert "Namespace failing:" in page
        assert "VMs last listed 12\xa0minutes ago; last error 1\xa0minute ago:" in page
        assert "listing virtualmachineinstances: Internal error occurred" in page
    client.login(username=instructor_b.username, password=PASSWORD)
    page = client.get(URL).content.decode()
    assert "Namespace failing:" not in page and "Internal error occurred" not in page


@pytest.mark.django_db
def test_a_vmi_phase_stamped_in_whole_seconds_reads_as_zero_not_negative(instructor_a, lab_a):
    """The VMI's phase times come from the cluster without fractions: Pending in the second the VM was created
    reads before the portal's precise provisioned_at, which showed on the dashboard as a negative latency."""
    requested = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    attempt(
        lab_a,
        state=AttemptState.RUNNING,
        username="whole_seconds",
        requested_at=requested,
        provisioned_at=requested + timedelta(seconds=1.8),
        pending_at=requested + timedelta(seconds=1),
        scheduling_at=requested + timedelta(seconds=3),
        agent_ready_at=requested + timedelta(seconds=4.5),
    )
    overview = ops_overview_for_user(user=instructor_a)
    assert overview.phases["pending"].p50 == 0
    assert overview.phases["scheduling"].p50 == pytest.approx(2)


@pytest.mark.django_db
def test_unclaimed_pool_vms_count_as_held_vms_and_requests(client, instructor_a, lab_a, lab_b, both_tenants_busy):
    from labs.models import LabPool, PoolMode, PoolVmState
    from ops.tests.test_pool_figures import pool_vm

    pool_a = LabPool.objects.create(lab=lab_a, mode=PoolMode.ALWAYS, size=3)
    for state in (PoolVmState.READY, PoolVmState.BOOTING, PoolVmState.CLAIMED, PoolVmState.DELETED):
        pool_vm(pool_a, state, minutes_up=5)  # 1 vCPU, 2048 MiB guest, 2300 MiB requested each
    pool_vm(LabPool.objects.create(lab=lab_b, mode=PoolMode.ALWAYS, size=1), PoolVmState.READY, minutes_up=5)

    (row,) = ops_overview_for_user(user=instructor_a).tenants
    small = launcher_requests(vcpus=1, memory_mib=2048)
    # Three attempts (both_tenants_busy) and the two unclaimed pool VMs; not the claimed, deleted or B's one.
    assert (row.active, row.pool_vms) == (5, 2)
    assert row.vcpus == 2 + 2 + 1 + 2
    assert row.cpu_millicores == 200 + 200 + small.cpu_millicores + 2 * small.cpu_millicores
    assert row.memory_mib == 4400 + 4400 + small.memory_mib + 2 * 2300
    assert row.vm_percent == round(100 * 5 / instructor_a.tenant.max_concurrent_vms)
    client.login(username=instructor_a.username, password=PASSWORD)
    assert "2 in warm pools" in client.get(URL).content.decode()
