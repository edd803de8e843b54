"""Node drains: launcher pod evictions as KubeVirt v1.9's eviction webhook decides them, and what follows."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubesim.tests.support import GROUP, VERSION, condition, vm_manifest, wait_for


def _vm(custom, namespace: str, name: str, strategy: str | None) -> dict:
    body = vm_manifest(name, namespace=namespace)
    if strategy:
        body["spec"]["template"]["spec"]["evictionStrategy"] = strategy
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachines", body)
    return wait_for(lambda: _running(custom, namespace, name), what=f"{name} Running")


def _vmi(custom, namespace: str, name: str) -> dict | None:
    try:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachineinstances", name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _running(custom, namespace: str, name: str) -> dict | None:
    vmi = _vmi(custom, namespace, name)
    return vmi if vmi and vmi["status"].get("phase") == "Running" else None


def _launcher(core, namespace: str, vmi_name: str):
    pods = core.list_namespaced_pod(namespace, label_selector=f"vm.kubevirt.io/name={vmi_name}").items
    return next(p for p in pods if p.metadata.deletion_timestamp is None)


@pytest.fixture
def node(sim):
    """A node the test drains; uncordoned afterwards so later tests have all nodes."""
    names: list[str] = []
    yield names.append
    for name in names:
        sim.admin.uncordon_node(name)


@pytest.mark.parametrize("strategy", [None, "None", "LiveMigrateIfPossible"])
def test_a_drain_shuts_a_vm_that_cannot_migrate_down_and_its_run_strategy_starts_it_elsewhere(
    sim, core, custom, namespace, node, strategy
):
    first = _vm(custom, namespace, "drained", strategy)
    assert condition(first, "LiveMigratable")["status"] == "False"  # a containerDisk VM here: no migration
    drained_node = first["status"]["nodeName"]
    node(drained_node)
    pod = _launcher(core, namespace, "drained").metadata.name

    result = sim.admin.drain_node(drained_node)
    assert f"{namespace}/{pod}" in result["evicted"] and result["refused"] == []
    # The guest was asked to shut down, the VMI Succeeded; runStrategy Always starts a new one on another node.
    wait_for(
        lambda: (
            {(e.reason, e.message) for e in core.list_namespaced_event(namespace).items}
            >= {
                ("ShuttingDown", "Signaled Graceful Shutdown"),
                ("Stopped", "The VirtualMachineInstance was shut down."),
            }
        ),
        what="the shutdown's events",
    )
    second = wait_for(
        lambda: (
            (v := _running(custom, namespace, "drained")) and v["metadata"]["uid"] != first["metadata"]["uid"] and v
        ),
        what="a new VMI Running",
    )
    assert second["status"]["nodeName"] != drained_node
    assert "evacuationNodeName" not in second["status"]
    cordoned = core.read_node(drained_node)
    assert cordoned.spec.unschedulable is True
    assert any(t.key == "node.kubernetes.io/unschedulable" for t in cordoned.spec.taints)


def test_live_migrate_on_a_vm_that_cannot_migrate_is_refused_by_the_webhook_and_the_vm_stays(
    sim, core, custom, namespace, node
):
    first = _vm(custom, namespace, "pinned", "LiveMigrate")
    node(first["status"]["nodeName"])
    pod = _launcher(core, namespace, "pinned").metadata.name
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod_eviction(
            pod, namespace, client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
        )
    assert refused.value.status == 429
    assert json.loads(refused.value.body)["message"] == (
        'admission webhook "virt-launcher-eviction-interceptor.kubevirt.io" denied the request: '
        "VMI pinned is configured with an eviction strategy but is not live-migratable"
    )
    result = sim.admin.drain_node(first["status"]["nodeName"])
    assert result["evicted"] == [] or f"{namespace}/{pod}" not in result["evicted"]
    assert [r["pod"] for r in result["refused"]] == [f"{namespace}/{pod}"]
    vmi = _vmi(custom, namespace, "pinned")
    assert vmi["metadata"]["uid"] == first["metadata"]["uid"] and vmi["status"]["phase"] == "Running"


def test_an_eviction_granted_through_the_api_deletes_the_launcher_after_the_guest_shut_down(
    sim, core, custom, namespace
):
    first = _vm(custom, namespace, "evicted", "None")
    pod = _launcher(core, namespace, "evicted").metadata.name
    core.create_namespaced_pod_eviction(
        pod, namespace, client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    )
    wait_for(
        lambda: (v := _vmi(custom, namespace, "evicted")) and v["metadata"]["uid"] != first["metadata"]["uid"],
        what="the VMI replaced",
    )
    names = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
    assert pod not in names


def test_a_cordoned_node_gets_no_new_launcher_pods_until_uncordoned(sim, core, custom, namespace):
    nodes = [n.metadata.name for n in core.list_node().items]
    for name in nodes[1:]:
        sim.admin.drain_node(name)
    try:
        placed = _vm(custom, namespace, "placed", None)
        assert placed["status"]["nodeName"] == nodes[0]
        sim.admin.drain_node(nodes[0])  # every node cordoned: the restarted VMI waits
        wait_for(
            lambda: condition(_vmi(custom, namespace, "placed"), "PodScheduled"),
            what="the VMI unschedulable",
        )
        message = condition(_vmi(custom, namespace, "placed"), "PodScheduled")["message"]
        assert f"0/{len(nodes)} nodes are available: {len(nodes)} node(s) were unschedulable." in message
    finally:
        for name in nodes:
            sim.admin.uncordon_node(name)
    wait_for(lambda: _running(custom, namespace, "placed"), what="Running once uncordoned")
