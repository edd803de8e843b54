"""VMs that do not come up, and the reasons students read: a VMI that fails, a VM nobody can schedule, an image
that cannot be pulled, and KubeVirt's ImageVolume on a runtime without image volumes.

Runs against its own small kubesim (one node with 4 CPUs and 4Gi), so a large lab cannot be scheduled and the
KubeVirt configuration can be changed without touching the session's cluster.
"""

from __future__ import annotations

import pytest

from labs.kubevirt import client
from labs.models import Attempt, AttemptState
from labs.services import attempt_start
from labs.tests.conftest import sync_until, vm_names, wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def tight_kubesim(tmp_path_factory):
    from kubesim.testing import KubesimServer

    with KubesimServer(tmp_path_factory.mktemp("tight-kubesim"), nodes=1, node_cpu="4", node_memory="4Gi") as server:
        yield server


@pytest.fixture
def tight_cluster(tight_kubesim, lifecycle, settings):
    """The lifecycle fixture, pointed at the small cluster instead of the session's."""
    settings.KUBECONFIG = str(tight_kubesim.kubeconfig)
    client.reset()
    yield tight_kubesim
    tight_kubesim.admin.set_kubevirt(disabled_feature_gates=[], image_volume_supported=True)


def started(student, lab, capture) -> Attempt:
    with capture(execute=True):
        attempt = attempt_start(actor=student, lab=lab)
    attempt.refresh_from_db()
    return attempt


def test_a_running_vmi_that_fails_fails_the_attempt_with_the_cluster_reason(
    tight_cluster, student_a, lab_a, django_capture_on_commit_callbacks
):
    attempt = started(student_a, lab_a, django_capture_on_commit_callbacks)
    sync_until(attempt, AttemptState.RUNNING)
    tight_cluster.admin.fail_vmi(
        attempt.namespace, attempt.vm_name, reason="Crashed", message="qemu exited with signal 9"
    )
    with django_capture_on_commit_callbacks(execute=True):
        sync_until(attempt, AttemptState.FAILED)
    assert attempt.failure_reason.startswith("The VM stopped unexpectedly")
    assert "Crashed" in attempt.failure_reason and "qemu exited with signal 9" in attempt.failure_reason
    assert attempt.ended_at is not None
    # The failed attempt's VM is cleaned up (runStrategy Always would otherwise restart it).
    wait_until(lambda: vm_names(attempt.namespace) == [], what="the failed VM to be deleted")


def test_an_unschedulable_vm_fails_with_the_schedulers_words(
    tight_cluster, student_a, course_a, django_capture_on_commit_callbacks
):
    from conftest import make_lab

    large = make_lab(course_a, title="Kubernetes the hard way", size="large")
    attempt = started(student_a, large, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        sync_until(attempt, AttemptState.FAILED)
    assert "No node in the cluster has room for this VM" in attempt.failure_reason
    assert "Insufficient" in attempt.failure_reason
    assert "does not count against your attempt limit" in attempt.failure_reason
    assert attempt.pending_at is not None and attempt.vmi_running_at is None
    # As on KubeVirt: the VMI moved to Scheduling when its pod was made, and never to Scheduled (the page's
    # "Scheduled on a node" step stays open).
    assert attempt.scheduling_at is not None and attempt.scheduled_at is None
    wait_until(lambda: vm_names(attempt.namespace) == [], what="the unschedulable VM to be deleted")


def test_the_reason_is_written_in_the_language_the_student_started_in(
    tight_cluster, client, student_a, ta_a, course_a, django_capture_on_commit_callbacks
):
    from django.conf import settings
    from django.urls import reverse
    from django.utils import translation

    from conftest import make_lab

    large = make_lab(course_a, title="Kubernetes the hard way", size="large")
    client.force_login(student_a)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            reverse("labs:attempt_start", args=[large.id]), HTTP_ACCEPT="application/json", HTTP_ACCEPT_LANGUAGE="ja"
        )
    assert response.status_code == 201
    attempt = Attempt.objects.get(pk=response.json()["attempt"]["id"])
    assert attempt.language == "ja"
    # The sync that judges it runs in a worker, in the default language.
    with translation.override(settings.LANGUAGE_CODE), django_capture_on_commit_callbacks(execute=True):
        sync_until(attempt, AttemptState.FAILED)
    assert attempt.failure_reason.startswith("現在、この仮想マシンを動かせる空きがクラスターのどのノードにもありません")
    assert "Insufficient" in attempt.failure_reason  # the scheduler's own words stay as it wrote them
    assert "演習はもう一度開始できます" in attempt.failure_reason
    # Written in every language: course staff, or the student after switching the page to English, read it in theirs.
    assert attempt.failure_reason_texts["ja"] == attempt.failure_reason
    english = attempt.failure_reason_texts["en"]
    assert english.startswith("No node in the cluster has room for this VM right now") and "Insufficient" in english
    with translation.override("en"):
        assert attempt.failure_reason_shown == english
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    shown = client.get(reverse("labs:attempt_detail", args=[attempt.id])).content.decode()
    assert "No node in the cluster has room for this VM right now" in shown and "現在、この仮想マシン" not in shown
    client.force_login(ta_a)  # a TA whose browser asks for English, on the grading page of the attempt
    shown = client.get(reverse("grading:attempt_detail", args=[attempt.id]), HTTP_ACCEPT_LANGUAGE="en").content
    assert "No node in the cluster has room for this VM right now" in shown.decode()


def test_unschedulable_within_its_own_grace_is_shown_as_progress_not_failure(
    tight_cluster, settings, student_a, course_a, django_capture_on_commit_callbacks
):
    from conftest import make_lab

    # A VM that waits for room is given the autoscaler's minutes, whatever the grace for other problems.
    settings.ATTEMPT_FAILURE_GRACE_SECONDS = 0
    settings.ATTEMPT_UNSCHEDULABLE_GRACE_SECONDS = 300
    large = make_lab(course_a, title="Big", size="large")
    attempt = started(student_a, large, django_capture_on_commit_callbacks)

    def waiting_with_reason() -> bool:
        attempt.refresh_from_db()
        return "No node in the cluster has room" in attempt.status_message

    from labs.services import tracking

    wait_until(
        waiting_with_reason,
        step=lambda: tracking.namespace_sync(namespace=attempt.namespace),
        what="the unschedulable message",
    )
    assert attempt.state == AttemptState.STARTING and attempt.failure_reason == ""
    # Also worded in Japanese, for a page in Japanese (the scheduler's own words stay as it wrote them).
    assert attempt.status_message_texts["en"] == attempt.status_message
    assert attempt.status_message_texts["ja"].startswith("現在、この仮想マシンを動かせる空きがクラスターの")
    assert "Insufficient" in attempt.status_message_texts["ja"]


def test_a_bad_image_fails_with_an_image_pull_reason(
    tight_cluster, student_a, course_a, django_capture_on_commit_callbacks
):
    from conftest import make_lab

    lab = make_lab(course_a, title="Typo in the image")
    lab.image = "quay.io/containerdisks/missing-fedora:41"
    lab.save(update_fields=["image"])
    attempt = started(student_a, lab, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        sync_until(attempt, AttemptState.FAILED)
    assert "disk image could not be downloaded" in attempt.failure_reason
    assert "ErrImagePull" in attempt.failure_reason
    assert "missing-fedora" in attempt.failure_reason


def test_image_volume_without_runtime_support_explains_the_fix(
    tight_cluster, student_a, lab_a, django_capture_on_commit_callbacks
):
    tight_cluster.admin.set_kubevirt(image_volume_supported=False)
    attempt = started(student_a, lab_a, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        sync_until(attempt, AttemptState.FAILED)
    assert "container-disk" in attempt.failure_reason
    assert "disabledFeatureGates" in attempt.failure_reason


def test_a_namespace_that_refuses_launcher_pods_ends_the_start_within_seconds_with_kubevirts_message(
    tight_cluster, settings, student_a, lab_a, tenant_a, django_capture_on_commit_callbacks
):
    from kubernetes import client as k8s

    from labs.services import tenant_namespace_ensure

    # A refusal treated as one that may mend would hold the start for this grace: the wait below is a fraction of it.
    settings.ATTEMPT_FAILURE_GRACE_SECONDS = 300
    tenant_namespace_ensure(tenant=tenant_a)
    namespace = tenant_a.cluster_namespace.namespace
    core = k8s.CoreV1Api(tight_cluster.api_client())
    label = "pod-security.kubernetes.io/enforce"
    core.patch_namespace(namespace, {"metadata": {"labels": {label: "restricted"}}})
    try:
        attempt = started(student_a, lab_a, django_capture_on_commit_callbacks)
        with django_capture_on_commit_callbacks(execute=True):
            sync_until(attempt, AttemptState.FAILED, timeout=60)
    finally:
        core.patch_namespace(namespace, {"metadata": {"labels": {label: "privileged"}}})
    assert "it needs a privileged namespace to run" in attempt.failure_reason
    assert 'violates PodSecurity "restricted:latest"' in attempt.failure_reason
    assert "Pod Security" in attempt.failure_reason_texts["en"] and attempt.failure_reason_texts["ja"]
    wait_until(lambda: vm_names(attempt.namespace) == [], what="the refused VM to be deleted")


def test_a_quota_refusal_holds_the_attempt_with_kubevirts_message(
    tight_cluster, settings, student_a, lab_a, tenant_a, django_capture_on_commit_callbacks
):
    from kubernetes import client as k8s

    from labs.services import tenant_namespace_ensure, tracking

    settings.ATTEMPT_FAILURE_GRACE_SECONDS = 300
    tenant_namespace_ensure(tenant=tenant_a)
    namespace = tenant_a.cluster_namespace.namespace
    core = k8s.CoreV1Api(tight_cluster.api_client())
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "tiny"}, "spec": {"hard": {"requests.memory": "100Mi"}}}
    )
    try:
        attempt = started(student_a, lab_a, django_capture_on_commit_callbacks)

        def held() -> bool:
            attempt.refresh_from_db()
            return "exceeded quota: tiny" in attempt.status_message

        wait_until(held, step=lambda: tracking.namespace_sync(namespace=namespace), what="the quota message")
        assert attempt.state == AttemptState.STARTING and attempt.failure_reason == ""
    finally:
        core.delete_namespaced_resource_quota("tiny", namespace)


def test_image_pull_back_off_flips_do_not_restart_the_grace(
    tight_cluster, settings, student_a, course_a, django_capture_on_commit_callbacks
):
    import time

    from conftest import make_lab

    # kubelet flips ErrImagePull ↔ ImagePullBackOff (back-off 1, 2, 4, 8 s here), each flip a new
    # lastTransitionTime, 1, 1, 1, 2, 1, 4, 1, 8 s apart: timed from the last flip, a 6 s grace would first run out
    # about 16 s in, against 6 s from the first failed pull. 11 s leaves each side 5 s for a slow start or sync.
    tight_cluster.admin.configure(image_pull_backoff=1.0)
    settings.ATTEMPT_FAILURE_GRACE_SECONDS = 6
    lab = make_lab(course_a, title="Typo again")
    lab.image = "quay.io/containerdisks/missing-debian:12"
    lab.save(update_fields=["image"])
    try:
        begun = time.monotonic()
        attempt = started(student_a, lab, django_capture_on_commit_callbacks)
        with django_capture_on_commit_callbacks(execute=True):
            sync_until(attempt, AttemptState.FAILED, timeout=30)
        took = time.monotonic() - begun
        assert took < 11, f"failed {took:.1f} s after the start: the grace was restarted by a flip"
    finally:
        tight_cluster.admin.configure(image_pull_backoff=10.0)
    assert "disk image could not be downloaded" in attempt.failure_reason
    assert "missing-debian" in attempt.failure_reason


def test_a_vmi_that_fails_without_a_status_reason_is_explained_from_conditions_and_events(
    tight_cluster, student_a, lab_a, django_capture_on_commit_callbacks
):
    from labs.services import tracking

    tight_cluster.admin.configure(scheduling_delay=30)
    try:
        attempt = started(student_a, lab_a, django_capture_on_commit_callbacks)

        def scheduling() -> bool:
            attempt.refresh_from_db()
            return attempt.scheduling_at is not None

        wait_until(
            scheduling,
            step=lambda: tracking.namespace_sync(namespace=attempt.namespace),
            what="the VMI to be scheduling",
        )
        # No message: KubeVirt v1.9 leaves status.reason empty, and only the Event names what happened.
        tight_cluster.admin.fail_vmi(attempt.namespace, attempt.vm_name, reason="GuestPanicked")
        with django_capture_on_commit_callbacks(execute=True):
            sync_until(attempt, AttemptState.FAILED)
    finally:
        tight_cluster.admin.configure(scheduling_delay=0)
    assert "no reason given" not in attempt.failure_reason
    assert "GuestPanicked" in attempt.failure_reason


def test_a_node_drained_under_a_running_lab_fails_the_attempt_saying_so(
    tight_cluster, student_a, lab_a, django_capture_on_commit_callbacks
):
    from labs.kubevirt import operations

    attempt = started(student_a, lab_a, django_capture_on_commit_callbacks)
    sync_until(attempt, AttemptState.RUNNING)
    vm = operations.vm_get(namespace=attempt.namespace, name=attempt.vm_name)
    assert vm["spec"]["template"]["spec"]["evictionStrategy"] == "LiveMigrateIfPossible"
    try:
        drained = tight_cluster.admin.drain_node(attempt.node_name)
        assert drained["refused"] == []  # a containerDisk VM cannot live-migrate: it is shut down
        with django_capture_on_commit_callbacks(execute=True):
            sync_until(attempt, AttemptState.FAILED)
    finally:
        tight_cluster.admin.uncordon_node(attempt.node_name)
    assert attempt.failure_reason.startswith("The node your lab ran on was drained for maintenance"), (
        attempt.failure_reason
    )
    assert attempt.failure_reason_texts["en"] == attempt.failure_reason
