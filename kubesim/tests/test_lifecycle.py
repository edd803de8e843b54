"""Lifecycle failures as a cluster shows them: bad images, the ImageVolume trap, crashes, lost nodes."""

from __future__ import annotations

import pytest
from kubernetes import watch

from kubesim.controllers import CONTAINER_DISK_ERROR
from kubesim.tests.support import GROUP, VERSION, condition, get_or_none, vm_manifest, wait_for

_get = get_or_none


def _printable(custom, namespace, name):
    return ((_get(custom, namespace, "virtualmachines", name) or {}).get("status") or {}).get("printableStatus")


def test_bad_image_gives_err_image_pull(custom, core, namespace):
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "virtualmachines",
        vm_manifest("pull", namespace=namespace, image="quay.io/containerdisks/missing:1.0"),
    )
    # ErrImagePull lasts a second before kubelet reports the back-off: a slow look may find either.
    pulling = ("ErrImagePull", "ImagePullBackOff")
    wait_for(lambda: _printable(custom, namespace, "pull") in pulling, what="ErrImagePull")
    vmi = _get(custom, namespace, "virtualmachineinstances", "pull")
    assert vmi["status"]["phase"] == "Scheduling"
    synchronized = condition(vmi, "Synchronized")
    assert synchronized["status"] == "False" and synchronized["reason"] in pulling
    pod = core.list_namespaced_pod(namespace, label_selector="app=pull").items[0]
    waiting = {s.name: s.state.waiting for s in pod.status.container_statuses}
    assert waiting["volumecontainerdisk"].reason in pulling
    failures = {
        e.message for e in core.list_namespaced_event(namespace).items if (e.reason, e.type) == ("Failed", "Warning")
    }
    assert "Error: ErrImagePull" in failures


def test_image_volume_on_a_runtime_without_image_volumes_fails_every_container_disk_vmi(sim, custom, core, namespace):
    sim.admin.set_kubevirt(image_volume_supported=False)
    try:
        node = core.list_node().items[0]
        assert node.status.node_info.container_runtime_version == "containerd://2.2.3"
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "virtualmachines", vm_manifest("trap", namespace=namespace, run_strategy="Once")
        )
        vmi = wait_for(
            lambda: (
                (v := _get(custom, namespace, "virtualmachineinstances", "trap"))
                and v.get("status", {}).get("phase") == "Failed"
                and v
            ),
            what="Failed VMI",
        )
        assert condition(vmi, "Synchronized")["message"] == CONTAINER_DISK_ERROR
        assert "Running" not in [t["phase"] for t in vmi["status"]["phaseTransitionTimestamps"]]
        events = core.list_namespaced_event(namespace, field_selector="type=Warning").items
        assert any("container-disk" in e.message and "no such file or directory" in e.message for e in events)
        # The documented workaround: disable the gate.
        sim.admin.set_kubevirt(disabled_feature_gates=["ImageVolume"])
        kubevirt = custom.get_namespaced_custom_object(GROUP, VERSION, "kubevirt", "kubevirts", "kubevirt")
        assert kubevirt["spec"]["configuration"]["developerConfiguration"]["disabledFeatureGates"] == ["ImageVolume"]
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "virtualmachines", vm_manifest("fine", namespace=namespace)
        )
        wait_for(lambda: _printable(custom, namespace, "fine") == "Running", what="Running with the gate off")
        # KubeVirt before v1.9 does not turn Beta gates on by default.
        sim.admin.set_kubevirt(disabled_feature_gates=[], version="v1.8.2")
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "virtualmachines", vm_manifest("older", namespace=namespace)
        )
        wait_for(lambda: _printable(custom, namespace, "older") == "Running", what="Running on v1.8")
    finally:
        sim.admin.set_kubevirt(image_volume_supported=True, disabled_feature_gates=[], version="v1.9.0")


def test_a_vmi_that_fails_before_running_backs_off(sim, custom, namespace):
    sim.admin.set_kubevirt(image_volume_supported=False)
    try:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "virtualmachines", vm_manifest("loop", namespace=namespace)
        )
        wait_for(lambda: _printable(custom, namespace, "loop") == "CrashLoopBackOff", what="CrashLoopBackOff")
        failure = _get(custom, namespace, "virtualmachines", "loop")["status"]["startFailure"]
        assert failure["consecutiveFailCount"] == 1 and failure["retryAfterTimestamp"]
    finally:
        sim.admin.set_kubevirt(image_volume_supported=True)


def test_forced_failure_and_restart_by_run_strategy(sim, custom, namespace):
    for name, strategy in (("once", "Once"), ("always", "Always")):
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "virtualmachines", vm_manifest(name, namespace=namespace, run_strategy=strategy)
        )
        wait_for(lambda n=name: _printable(custom, namespace, n) == "Running", what=f"{name} Running")
    first = _get(custom, namespace, "virtualmachineinstances", "always")["metadata"]["uid"]
    failed = sim.admin.fail_vmi(namespace, "once", reason="GuestPanicked", message="kernel panic")
    # v1.9 writes status.reason only for a lost node: the reason is in the Synchronized condition and Events.
    assert failed["status"]["phase"] == "Failed" and "reason" not in failed["status"]
    assert condition(failed, "Synchronized")["reason"] == "GuestPanicked"
    wait_for(lambda: _printable(custom, namespace, "once") == "Stopped", what="Once stays down")
    assert _get(custom, namespace, "virtualmachineinstances", "once")["status"]["phase"] == "Failed"
    assert sim.admin.guest(namespace, "once") is None
    sim.admin.fail_vmi(namespace, "always", reason="Crashed")
    wait_for(
        lambda: (
            (v := _get(custom, namespace, "virtualmachineinstances", "always"))
            and v["metadata"]["uid"] != first
            and v["status"].get("phase") == "Running"
        ),
        what="Always restarts a VMI that ran",
    )
    with pytest.raises(Exception, match="404"):
        sim.admin.fail_vmi(namespace, "ghost")


def test_removing_a_node_fails_its_vmis(tmp_path):
    from kubernetes import client

    from kubesim.testing import KubesimServer

    with KubesimServer(tmp_path, guest="none", nodes=2) as small:
        api = small.api_client()
        custom = client.CustomObjectsApi(api)
        for index in range(4):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, "default", "virtualmachines", vm_manifest(f"n{index}", run_strategy="Once")
            )
        vmis = wait_for(
            lambda: (
                (
                    items := custom.list_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachineinstances")[
                        "items"
                    ]
                )
                and all(v["status"].get("phase") == "Running" for v in items)
                and len(items) == 4
                and items
            ),
            what="4 Running",
        )
        on_node = sorted(v["metadata"]["name"] for v in vmis if v["status"]["nodeName"] == "node01")
        assert on_node, "the scheduler spreads VMIs over both nodes"
        small.admin.remove_node("node01")
        assert [n.metadata.name for n in client.CoreV1Api(api).list_node().items] == ["node02"]
        after = {
            v["metadata"]["name"]: v
            for v in custom.list_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachineinstances")["items"]
        }
        for name, vmi in after.items():
            if name in on_node:
                assert (vmi["status"]["phase"], vmi["status"]["reason"]) == ("Failed", "NodeUnresponsive")
            else:
                assert vmi["status"]["phase"] == "Running"
        api.close()


def test_a_missing_cloud_init_secret_holds_the_vmi_until_it_exists(custom, core, namespace):
    from kubesim.tests.support import agent_user_data, secret_manifest

    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "virtualmachines",
        vm_manifest("early", namespace=namespace, cloud_init_secret="early-ci"),
    )
    wait_for(
        lambda: any(e.reason == "FailedMount" for e in core.list_namespaced_event(namespace).items),
        what="FailedMount event",
    )
    assert _get(custom, namespace, "virtualmachineinstances", "early")["status"]["phase"] == "Scheduling"
    core.create_namespaced_secret(namespace, secret_manifest("early-ci", agent_user_data(token="y" * 20)))
    wait_for(lambda: _printable(custom, namespace, "early") == "Running", timeout=10, what="Running once it exists")


def test_image_pull_errors_flip_with_back_off_and_each_flip_renews_the_condition(sim, custom, core, namespace):
    sim.admin.configure(image_pull_backoff=1.0)
    try:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachineinstances")
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "virtualmachines",
            vm_manifest("flip", namespace=namespace, image="quay.io/containerdisks/missing:2.0"),
        )
        seen = []
        # Watched, not polled: a look slowed past the second between two flips would miss one.
        for event in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "virtualmachineinstances",
            label_selector="app=flip",
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=30,
        ):
            synchronized = condition(event["object"], "Synchronized")
            if synchronized and (not seen or seen[-1] != (synchronized["reason"], synchronized["lastTransitionTime"])):
                seen.append((synchronized["reason"], synchronized["lastTransitionTime"]))
            if len(seen) >= 3:
                break
    finally:
        sim.admin.configure(image_pull_backoff=10.0)
    assert [reason for reason, _ in seen[:3]] == ["ErrImagePull", "ImagePullBackOff", "ErrImagePull"]
    assert len({when for _, when in seen[:3]}) == 3  # a new lastTransitionTime at each flip (CheckFailure)
    vmi = _get(custom, namespace, "virtualmachineinstances", "flip")
    assert "reason" not in vmi["status"]
    back_off = [e for e in core.list_namespaced_event(namespace).items if e.reason == "BackOff"]
    assert back_off and 'Back-off pulling image "quay.io/containerdisks/missing:2.0"' in back_off[0].message
