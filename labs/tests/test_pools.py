"""Warm pools against kubesim and PostgreSQL: the claim (token, labels, state), claim races, the quota squeeze,
drain, failing pool VMs, the sweep, tenant isolation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from conftest import make_lab, make_person
from labs.agent_client import AgentTokenRejected, healthz
from labs.kubevirt import client, names, operations, status
from labs.models import Attempt, AttemptState, LabPool, PoolMode, PoolVm, PoolVmState
from labs.pool_selectors import pool_stats
from labs.services import agents, attempt_start, events, pools, sweeping, tracking
from labs.services.quota import tenant_totals
from labs.states import TRANSITIONS
from labs.tests.conftest import start_together, sync_until, wait_until
from portal.models import Role

pytestmark = pytest.mark.django_db


def warm_pool(lab, size: int, **fields) -> LabPool:
    """A pool of ``size`` for ``lab``, filled and every VM's agent answering."""
    pool = LabPool.objects.create(lab=lab, mode=fields.pop("mode", PoolMode.ALWAYS), size=size, **fields)
    pools.pools_refill()

    def all_ready() -> bool:
        pools.pool_vms_check()
        return PoolVm.objects.filter(pool=pool, state=PoolVmState.READY).count() == size

    wait_until(all_ready, timeout=60, interval=0.2, what=f"{size} ready pool VMs")
    return pool


def start(student, lab, capture) -> Attempt:
    with capture(execute=True):
        attempt = attempt_start(actor=student, lab=lab)
    attempt.refresh_from_db()
    return attempt


def test_a_start_claims_a_ready_vm_rotates_its_token_and_relabels_it(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    warm_pool(lab_a, 1)
    pool_vm = PoolVm.objects.get(lab=lab_a)
    pool_token = pool_vm.agent_token
    before = timezone.now()
    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)

    assert attempt.state == AttemptState.RUNNING
    assert attempt.vm_name == pool_vm.vm_name == names.pool_vm_name(pool_vm.id)
    assert attempt.agent_token != pool_token
    assert before <= attempt.agent_ready_at and attempt.expires_at == attempt.agent_ready_at + timedelta(
        minutes=lab_a.time_limit_minutes
    )
    pool_vm.refresh_from_db()
    assert (pool_vm.state, pool_vm.attempt_id) == (PoolVmState.CLAIMED, attempt.id)
    # The attempt's token works; the pool's is refused from now on.
    assert healthz(attempt)["ready"] is True
    pool_vm.agent_token = pool_token
    with pytest.raises(AgentTokenRejected):
        healthz(pool_vm)
    # The VM, its template and its VMI name the attempt, so the sweep and the sync see it as the attempt's.
    vm = operations.vm_get(namespace=attempt.namespace, name=attempt.vm_name)
    assert names.attempt_id_from_labels(vm["metadata"]["labels"]) == attempt.id
    assert vm["spec"]["template"]["metadata"]["labels"][names.ATTEMPT_LABEL] == str(attempt.id)
    vmi = client.custom_objects().get_namespaced_custom_object(
        client.KUBEVIRT_GROUP, client.KUBEVIRT_VERSION, attempt.namespace, "virtualmachineinstances", attempt.vm_name
    )
    assert names.attempt_id_from_labels(vmi["metadata"]["labels"]) == attempt.id
    # The sync keeps it running; the sweep keeps the VM; the stats count a hit.
    sync_until(attempt, AttemptState.RUNNING)
    report = sweeping.namespace_sweep_now(namespace=attempt.namespace)
    assert report.orphan_vms_deleted == [] and report.vanished == []
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING and attempt.node_name
    (stats,) = pool_stats(tenant_ids=[attempt.tenant_id])
    assert (stats.hits, stats.misses, stats.claimed, stats.hit_ratio) == (1, 0, 1, 1.0)


def test_a_claimed_attempt_is_pushed_running_once_with_what_its_vmi_says(
    lifecycle, student_a, lab_a, monkeypatch, django_capture_on_commit_callbacks
):
    # A second push per claimed attempt from the next sync would queue, for a whole class, ahead of the pushes the
    # pages still waiting on their claim need (the web process receives its channel messages one at a time).
    warm_pool(lab_a, 1)
    pushed: list[dict] = []
    monkeypatch.setattr(events, "send_to_group", lambda group, message, **_how: pushed.append(message))
    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        report = tracking.namespace_sync(namespace=attempt.namespace)
    updates = [message["attempt"] for message in pushed if message["type"] == "attempt.update"]
    assert [update["state"] for update in updates] == ["running"]
    assert report.namespaces == [attempt.namespace] and report.changed == 0
    # That one push carries what the sync would have added.
    seen = status.observe_vmi(operations.vmis_list(namespace=attempt.namespace)[0])
    attempt.refresh_from_db()
    assert (attempt.node_name, attempt.vmi_uid) == (seen.node_name, seen.uid) and seen.node_name
    assert attempt.vmi_running_at == seen.phase_times["Running"] and attempt.scheduled_at is not None
    assert updates[0]["node_name"] == seen.node_name and updates[0]["timestamps"]["vmi_running"] is not None


def test_the_transition_table_lets_a_claimed_attempt_run_from_requested():
    assert AttemptState.REQUESTED in TRANSITIONS[AttemptState.RUNNING]


@pytest.mark.django_db(transaction=True)
def test_many_starts_few_vms_each_vm_claimed_once_and_the_rest_start_cold(lifecycle, course_a, lab_a):
    warm_pool(lab_a, 2)
    students = [
        make_person(username=f"racer{i}", tenant=course_a.tenant, course=course_a, role=Role.STUDENT) for i in range(5)
    ]
    outcomes = start_together([(student, lab_a) for student in students])
    assert all(isinstance(outcome, Attempt) for outcome in outcomes), outcomes
    claimed = PoolVm.objects.filter(lab=lab_a, state=PoolVmState.CLAIMED)
    assert claimed.count() == 2
    assert len({vm.attempt_id for vm in claimed}) == 2
    warm = Attempt.objects.filter(lab=lab_a, vm_name__startswith=names.POOL_VM_PREFIX)
    assert warm.count() == 2 and all(a.state == AttemptState.RUNNING for a in warm)
    cold = Attempt.objects.filter(lab=lab_a, vm_name__startswith=names.VM_PREFIX)
    assert cold.count() == 3 and all(a.state != AttemptState.FAILED for a in cold)
    assert LabPool.objects.get(lab=lab_a).misses == 3


def test_a_cold_start_never_fails_for_quota_a_pool_vm_holds(
    lifecycle, tenant_a, course_a, student_a, lab_a, django_capture_on_commit_callbacks
):
    tenant_a.max_concurrent_vms = 2
    tenant_a.save(update_fields=["max_concurrent_vms"])
    warm_pool(lab_a, 2)
    assert tenant_totals(tenant_id=tenant_a.id, student=None).vms == 2
    other = make_lab(course_a, title="Networking")
    attempt = start(student_a, other, django_capture_on_commit_callbacks)
    assert attempt.state in (AttemptState.PROVISIONING, AttemptState.STARTING)
    gave_way = PoolVm.objects.get(lab=lab_a, state=PoolVmState.DELETED)
    assert gave_way.end_reason == pools.EndReason.GAVE_WAY
    wait_until(
        lambda: operations.vm_get(namespace=attempt.namespace, name=gave_way.vm_name) is None,
        what="the pool VM deleted",
    )
    # The pool refills only within the quota: it is full (one pool VM, one attempt).
    assert pools.pools_refill().created == []
    assert tenant_totals(tenant_id=tenant_a.id, student=None).vms == 2


def test_a_scheduled_pool_drains_at_the_end_of_its_window(lifecycle, lab_a):
    now = timezone.now()
    pool = warm_pool(
        lab_a, 2, mode=PoolMode.SCHEDULED, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1)
    )
    LabPool.objects.filter(id=pool.id).update(ends_at=timezone.now() - timedelta(seconds=1))
    report = pools.pools_refill()
    assert len(report.deleted) == 2 and report.created == []
    assert not PoolVm.objects.filter(pool=pool, state__in=[PoolVmState.BOOTING, PoolVmState.READY]).exists()
    namespace = lab_a.course.tenant.namespace
    wait_until(lambda: not [vm for vm in operations.vms_list(namespace=namespace)], what="the pool's VMs deleted")


def test_a_quota_lowered_below_what_the_tenant_holds_drains_idle_pool_vms(lifecycle, lab_a):
    pool = warm_pool(lab_a, 2)
    tenant = lab_a.course.tenant
    tenant.max_concurrent_vms = 1
    tenant.save(update_fields=["max_concurrent_vms"])
    report = pools.pools_refill()
    assert len(report.deleted) == 1 and report.created == []  # one left: within the quota again
    assert tenant_totals(tenant_id=tenant.id, student=None).vms == 1
    tenant.max_vcpus = 0
    tenant.save(update_fields=["max_vcpus"])
    assert len(pools.pools_refill().deleted) == 1
    assert not PoolVm.objects.filter(pool=pool, state__in=[PoolVmState.BOOTING, PoolVmState.READY]).exists()


def test_a_shrunk_pool_gives_up_a_booting_vm_before_a_ready_one(lifecycle, lab_a):
    pool = warm_pool(lab_a, 2)
    first, second = PoolVm.objects.filter(pool=pool).order_by("id")
    PoolVm.objects.filter(id=first.id).update(state=PoolVmState.BOOTING)  # as if it were still coming up
    LabPool.objects.filter(id=pool.id).update(size=1)
    assert pools.pools_refill().deleted == [first.vm_name]


def test_a_pool_drains_when_its_lab_closes(lifecycle, lab_a):
    warm_pool(lab_a, 1)
    lab_a.due_at = timezone.now() - timedelta(minutes=1)
    lab_a.save(update_fields=["due_at"])
    assert len(pools.pools_refill().deleted) == 1


def test_a_ready_pool_vm_that_stops_answering_is_replaced(lifecycle, lab_a):
    pool = warm_pool(lab_a, 1)
    lost = PoolVm.objects.get(pool=pool)
    operations.vm_delete(namespace=lost.namespace, name=lost.vm_name)  # gone behind the portal's back
    wait_until(lambda: lost.vm_name in pools.pool_vms_check().deleted, what="the lost VM noticed")
    lost.refresh_from_db()
    # Seen on the cluster (its VMI going, then gone) before its agent, asked only every 30 s, is asked again.
    assert lost.state == PoolVmState.DELETED
    assert lost.end_reason in (pools.EndReason.VMI_ENDED, pools.EndReason.VM_GONE)
    assert len(pools.pools_refill().created) == 1


def test_a_ready_pool_vm_whose_agent_stops_answering_is_replaced(lifecycle, monkeypatch, settings, lab_a):
    pool = warm_pool(lab_a, 1)
    settings.POOL_READY_CHECK_SECONDS = 0
    monkeypatch.setattr(agents, "_agent_answers", lambda pool_vm: False)
    lost = PoolVm.objects.get(pool=pool)
    assert pools.pool_vms_check().deleted == [lost.vm_name]
    lost.refresh_from_db()
    assert (lost.state, lost.end_reason) == (PoolVmState.DELETED, pools.EndReason.AGENT_LOST)


def booting_pool_vm(lab) -> PoolVm:
    """One pool VM of ``lab`` made and its VMI up, its agent not asked yet."""
    LabPool.objects.create(lab=lab, mode=PoolMode.ALWAYS, size=1)
    (name,) = pools.pools_refill().created
    pool_vm = PoolVm.objects.get(vm_name=name)
    wait_until(
        lambda: name in {vmi["metadata"]["name"] for vmi in operations.vmis_list(namespace=pool_vm.namespace)},
        what="the pool VM's VMI",
    )
    return pool_vm


def test_a_booting_pool_vm_whose_vmi_fails_is_replaced_at_the_next_pass(lifecycle, lab_a):
    # Failed before Running, KubeVirt retries only after a back-off (10 s here): the VMI stays Failed meanwhile.
    delays = lifecycle.admin.configure()
    lifecycle.admin.configure(pending_delay=30)
    try:
        pool_vm = booting_pool_vm(lab_a)
    finally:
        lifecycle.admin.configure(pending_delay=delays["pending_delay"])
    lifecycle.admin.fail_vmi(pool_vm.namespace, pool_vm.vm_name, reason="FailedCreate", message="the pod failed")
    report = pools.pool_vms_check()
    assert report.deleted == [pool_vm.vm_name] and report.ready == []
    pool_vm.refresh_from_db()
    assert (pool_vm.state, pool_vm.end_reason) == (PoolVmState.DELETED, pools.EndReason.VMI_ENDED)
    assert "the pod failed" in pool_vm.problem
    assert len(pools.pools_refill().created) == 1


def test_a_pool_vm_that_cannot_pull_its_image_says_why_and_keeps_it_when_replaced(lifecycle, admin_client, lab_a):
    lab_a.image = "quay.io/containerdisks/missing-fedora:41"
    lab_a.save(update_fields=["image"])
    pool_vm = booting_pool_vm(lab_a)

    def problem_seen() -> bool:
        pools.pool_vms_check()
        pool_vm.refresh_from_db()
        return bool(pool_vm.problem_texts)

    wait_until(problem_seen, timeout=30, interval=0.2, what="the pool VM's image-pull problem")
    # It waits for the boot timeout (kubelet keeps retrying the pull), saying why in each language.
    assert pool_vm.state == PoolVmState.BOOTING
    assert "disk image could not be downloaded" in pool_vm.problem_texts["en"]
    assert "missing-fedora" in pool_vm.problem_texts["ja"]
    assert pool_vm.problem_texts["ja"] != pool_vm.problem_texts["en"]
    (stats,) = pool_stats()
    assert "missing-fedora" in stats.problem
    page = admin_client.get("/admin/ops/").content.decode()
    assert "Not booting:" in page and "missing-fedora" in page
    # Ended (here: at the boot timeout), the row keeps why; the problem of a VM no longer booting is not shown.
    PoolVm.objects.filter(id=pool_vm.id).update(created_at=timezone.now() - timedelta(hours=1))
    assert pools.pool_vms_check().deleted == [pool_vm.vm_name]
    pool_vm.refresh_from_db()
    assert pool_vm.end_reason == pools.EndReason.BOOT_TIMEOUT and "missing-fedora" in pool_vm.problem
    assert pool_stats()[0].problem == ""


def test_a_booting_pool_vm_whose_problem_mended_shows_none(lifecycle, lab_a):
    pool_vm = booting_pool_vm(lab_a)
    PoolVm.objects.filter(id=pool_vm.id).update(problem_texts={"en": "No node has room.", "ja": "空きがありません。"})
    pools.pool_vms_check()
    pool_vm.refresh_from_db()
    assert pool_vm.problem_texts == {}


def test_a_booting_pool_vm_whose_vm_vanished_is_replaced_at_the_next_pass(lifecycle, lab_a):
    pool_vm = booting_pool_vm(lab_a)
    operations.vm_delete(namespace=pool_vm.namespace, name=pool_vm.vm_name)  # behind the portal's back
    wait_until(
        lambda: (
            not operations.vmis_list(namespace=pool_vm.namespace)
            and operations.vm_get(namespace=pool_vm.namespace, name=pool_vm.vm_name) is None
        ),
        what="the VM and its VMI gone",
    )
    assert pools.pool_vms_check().deleted == [pool_vm.vm_name]
    pool_vm.refresh_from_db()
    assert (pool_vm.state, pool_vm.end_reason) == (PoolVmState.DELETED, pools.EndReason.VM_GONE)


def test_a_pass_over_recently_asked_ready_vms_opens_no_portforward(lifecycle, monkeypatch, settings, lab_a):
    from labs import agent_client

    pool = warm_pool(lab_a, 3)
    opened: list[object] = []
    connect = agent_client._connect
    monkeypatch.setattr(
        agent_client, "_connect", lambda *args, **kwargs: opened.append(args) or connect(*args, **kwargs)
    )
    report = pools.pool_vms_check()
    assert (report.ready, report.deleted, opened) == ([], [], [])
    # Once they were last asked longer ago than the setting, each is asked again, once.
    settings.POOL_READY_CHECK_SECONDS = 0
    assert pools.pool_vms_check().deleted == []
    assert len(opened) == 3
    assert PoolVm.objects.filter(pool=pool, state=PoolVmState.READY).count() == 3


def test_a_claimed_vm_whose_agent_is_gone_falls_back_to_a_cold_start(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    pool = warm_pool(lab_a, 1)
    pool_vm = PoolVm.objects.get(pool=pool)
    operations.vm_delete(namespace=pool_vm.namespace, name=pool_vm.vm_name)
    wait_until(lambda: operations.vm_get(namespace=pool_vm.namespace, name=pool_vm.vm_name) is None, what="the VM gone")
    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    assert attempt.vm_name == names.vm_name(attempt.id)
    assert attempt.state == AttemptState.STARTING
    pool_vm.refresh_from_db()
    assert (pool_vm.state, pool_vm.end_reason, pool_vm.attempt_id) == (
        PoolVmState.DELETED,
        pools.EndReason.CLAIM_FAILED,
        None,
    )
    sync_until(attempt, AttemptState.RUNNING)


def test_the_sweep_keeps_ready_pool_vms_and_deletes_orphaned_ones(lifecycle, lab_a):
    pool = warm_pool(lab_a, 2)
    kept, orphaned = PoolVm.objects.filter(pool=pool).order_by("id")
    PoolVm.objects.filter(id=orphaned.id).delete()  # its row lost: nothing holds the VM any more
    report = sweeping.namespace_sweep_now(namespace=kept.namespace)
    assert report.orphan_vms_deleted == [f"{orphaned.namespace}/{orphaned.vm_name}"]
    assert operations.vm_get(namespace=kept.namespace, name=kept.vm_name) is not None
    kept.refresh_from_db()
    assert kept.state == PoolVmState.READY


def test_a_pool_vm_of_one_tenant_is_never_claimed_by_another(
    lifecycle, tenant_a, tenant_b, student_b, lab_a, lab_b, django_capture_on_commit_callbacks
):
    warm_pool(lab_a, 1)
    # Even a pool row naming the other tenant's lab is not the other tenant's to claim.
    stray = PoolVm.objects.get(lab=lab_a)
    PoolVm.objects.filter(id=stray.id).update(lab=lab_b)
    attempt = start(student_b, lab_b, django_capture_on_commit_callbacks)
    assert attempt.vm_name == names.vm_name(attempt.id)
    stray.refresh_from_db()
    assert stray.state == PoolVmState.READY and stray.attempt_id is None
    # Nor does it count against the other tenant's quota, or show on its pages.
    assert tenant_totals(tenant_id=tenant_b.id, student=None).vms == 1
    assert pool_stats(tenant_ids=[tenant_b.id]) == []


def test_a_pool_vm_made_before_the_labs_settings_changed_is_replaced_not_claimed(
    lifecycle, student_a, lab_a, django_capture_on_commit_callbacks
):
    warm_pool(lab_a, 1)
    old = PoolVm.objects.get(lab=lab_a)
    lab_a.image = "quay.io/containerdisks/fedora:42"
    lab_a.save(update_fields=["image"])
    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    assert attempt.vm_name == names.vm_name(attempt.id)
    report = pools.pools_refill()
    assert old.vm_name in report.deleted and len(report.created) == 1
    old.refresh_from_db()
    assert (old.state, old.end_reason) == (PoolVmState.DELETED, pools.EndReason.STALE)


def test_a_refill_makes_at_most_its_per_pass_share(lifecycle, settings, lab_a):
    settings.POOL_REFILL_PER_PASS = 2
    LabPool.objects.create(lab=lab_a, mode=PoolMode.ALWAYS, size=3)
    assert len(pools.pools_refill().created) == 2
    assert len(pools.pools_refill().created) == 1
    assert pools.pools_refill().created == []


def test_the_sweep_deletes_a_pool_secret_whose_vm_was_never_made(lifecycle, monkeypatch, lab_a):
    from django.core.cache import cache

    from labs.kubevirt.operations import ClusterError

    kept = warm_pool(lab_a, 1).vms.get()
    LabPool.objects.filter(lab=lab_a).update(size=2)

    def unanswered(*args, **kwargs):
        raise ClusterError("the cluster did not answer")

    # The VM is never made, and the Secret made before it cannot be deleted then: it is left behind.
    with monkeypatch.context() as patched:
        patched.setattr(operations, "vm_create", unanswered)
        patched.setattr(operations, "secret_delete", unanswered)
        assert pools.pools_refill().errors == ["the cluster did not answer"]
    lost = PoolVm.objects.get(lab=lab_a, state=PoolVmState.DELETED)
    assert lost.end_reason == pools.EndReason.CREATE_FAILED
    namespace, lost_secret = lost.namespace, names.cloud_init_secret_name(lost.vm_name)

    def swept() -> list[str]:
        cache.delete(sweeping.CLOUD_INIT_SWEEP_KEY.format(namespace=namespace))
        return sweeping.namespace_sweep_now(namespace=namespace).orphan_secrets_deleted

    def secret_names() -> set[str]:
        return {secret["metadata"]["name"] for secret in operations.secrets_list(namespace=namespace)}

    assert swept() == [] and lost_secret in secret_names()  # too young: its VM may be on its way
    monkeypatch.setattr(sweeping, "POOL_SECRET_MIN_AGE", timedelta(0))
    # A booting row whose VM is not made yet holds its Secret.
    PoolVm.objects.filter(id=lost.id).update(state=PoolVmState.BOOTING)
    assert swept() == []
    PoolVm.objects.filter(id=lost.id).update(state=PoolVmState.DELETED)
    assert swept() == [f"{namespace}/{lost_secret}"]
    assert secret_names() == {names.cloud_init_secret_name(kept.vm_name)}  # the ready VM's Secret is its VM's
