"""The Kubernetes API semantics, through the unmodified ``kubernetes`` client (CustomObjectsApi, CoreV1Api,
watch.Watch().stream), as the portal uses it."""

from __future__ import annotations

import json
import threading

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kubesim.tests.support import GROUP, VERSION, condition, get_or_none, vm_manifest, wait_for

VMS, VMIS = "virtualmachines", "virtualmachineinstances"


def _vmi(custom, namespace, name):
    return get_or_none(custom, namespace, "virtualmachineinstances", name)


def test_create_vm_then_list_and_watch_vmis_to_running(sim, custom, namespace):
    sim.admin.configure(pending_delay=0.05, scheduling_delay=0.05, scheduled_delay=0.05, agent_delay=0.2)
    try:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, VMIS, label_selector="app=web")
        assert listed["items"] == []
        created = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, VMS, vm_manifest("web", namespace=namespace)
        )
        assert created["metadata"]["uid"] and created["metadata"]["generation"] == 1
        phases, conditions = [], set()
        stream = watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            VMIS,
            label_selector="app=web",
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=10,
        )
        for event in stream:
            status = event["object"].get("status") or {}
            if not phases or phases[-1] != status.get("phase"):
                phases.append(status.get("phase"))
            conditions |= {c["type"] for c in status.get("conditions") or ()}
            if "AgentConnected" in conditions:
                break
    finally:
        sim.admin.configure(pending_delay=0, scheduling_delay=0, scheduled_delay=0, agent_delay=0)
    assert phases == ["Pending", "Scheduling", "Scheduled", "Running"]
    vmi = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, VMIS, "web")
    status = vmi["status"]
    assert [t["phase"] for t in status["phaseTransitionTimestamps"]] == phases
    assert status["nodeName"] and vmi["metadata"]["labels"]["kubevirt.io/nodeName"] == status["nodeName"]
    assert status["interfaces"][0]["ipAddress"].startswith("10.244.")
    assert condition(vmi, "Ready")["status"] == "True" and condition(vmi, "AgentConnected")["status"] == "True"
    assert status["guestOSInfo"]["id"] == "fedora"
    owner = vmi["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("VirtualMachine", "web", True)
    vm = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "web")
    assert vm["status"]["created"] is True and vm["status"]["ready"] is True
    assert vm["status"]["printableStatus"] == "Running"
    assert {c["type"] for c in vm["status"]["conditions"]} >= {"Ready", "AgentConnected"}


def test_duplicate_create_is_409_already_exists(custom, namespace):
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, VMS, vm_manifest("dup", namespace=namespace))
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, VMS, vm_manifest("dup", namespace=namespace))
    body = json.loads(error.value.body)
    assert error.value.status == 409
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "AlreadyExists", 409)
    assert body["message"] == 'virtualmachines.kubevirt.io "dup" already exists'


def test_missing_object_is_404_status(custom, core, namespace):
    with pytest.raises(ApiException) as error:
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "nope")
    assert error.value.status == 404
    assert json.loads(error.value.body)["message"] == 'virtualmachines.kubevirt.io "nope" not found'
    with pytest.raises(ApiException) as error:
        core.read_namespaced_secret("nope", namespace)
    assert json.loads(error.value.body)["reason"] == "NotFound"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda vm: vm["spec"].update(running=True), "Running and RunStrategy are mutually exclusive"),
        (lambda vm: vm["spec"].pop("runStrategy"), "RunStrategy must be specified"),
        (lambda vm: vm["spec"]["template"]["spec"].update(volumes="disk"), "must be of type array"),
    ],
)
def test_invalid_vm_is_422_and_changes_nothing(custom, namespace, change, message):
    manifest = vm_manifest("bad", namespace=namespace)
    change(manifest)
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, VMS, manifest)
    body = json.loads(error.value.body)
    assert error.value.status == 422 and body["reason"] == "Invalid"
    assert message in body["message"]
    assert custom.list_namespaced_custom_object(GROUP, VERSION, namespace, VMS)["items"] == []


def test_unknown_fields_are_pruned_with_a_warning_unless_the_client_asks_for_strict(sim, custom, namespace):
    manifest = vm_manifest("colourful", namespace=namespace)
    manifest["spec"]["template"]["spec"]["domain"]["colour"] = "red"
    http = urllib3.PoolManager()
    url = f"{sim.url}/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines"
    headers = {**sim.auth_header(), "Content-Type": "application/json"}

    strict = http.request("POST", f"{url}?fieldValidation=Strict", body=json.dumps(manifest), headers=headers)
    refusal = json.loads(strict.data)
    assert strict.status == 400 and refusal["reason"] == "BadRequest"
    assert refusal["message"] == 'strict decoding error: unknown field "spec.template.spec.domain.colour"'
    assert custom.list_namespaced_custom_object(GROUP, VERSION, namespace, VMS)["items"] == []

    bad = http.request("POST", f"{url}?fieldValidation=Loose", body=json.dumps(manifest), headers=headers)
    assert bad.status == 400 and 'Unsupported value: "Loose"' in json.loads(bad.data)["message"]

    warned = http.request("POST", url, body=json.dumps(manifest), headers=headers)  # the default: Warn
    assert warned.status == 201
    assert warned.headers["Warning"] == '299 - "unknown field \\"spec.template.spec.domain.colour\\""'
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "colourful")
    assert "colour" not in stored["spec"]["template"]["spec"]["domain"]


def test_running_field_gets_a_deprecation_warning_header(sim, namespace):
    http = urllib3.PoolManager()
    response = http.request(
        "POST",
        f"{sim.url}/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines",
        body=json.dumps(vm_manifest("legacy", namespace=namespace, run_strategy=None, running=False)),
        headers={**sim.auth_header(), "Content-Type": "application/json"},
    )
    assert response.status == 201
    assert response.headers["Warning"] == '299 - "spec.running is deprecated, please use spec.runStrategy instead"'


def test_stale_watch_gets_410_expired(custom, namespace, sim, tmp_path):
    from kubesim.testing import KubesimServer

    with KubesimServer(tmp_path, guest="none", watch_history=20) as small:
        api = small.api_client()
        small_custom = client.CustomObjectsApi(api)
        first = small_custom.list_namespaced_custom_object(GROUP, VERSION, "default", VMS)
        for index in range(8):  # each VM produces a handful of VM events, pushing `first` out of the history
            small_custom.create_namespaced_custom_object(
                GROUP, VERSION, "default", VMS, vm_manifest(f"vm{index}", run_strategy="Halted")
            )
        stale = first["metadata"]["resourceVersion"]
        raw = small_custom.list_namespaced_custom_object(
            GROUP, VERSION, "default", VMS, watch=True, resource_version=stale, _preload_content=False
        )
        event = json.loads(raw.data.decode().splitlines()[0])
        assert event["type"] == "ERROR"
        assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
        with pytest.raises(ApiException) as error:
            for _ in watch.Watch().stream(
                small_custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                "default",
                VMS,
                resource_version=stale,
                timeout_seconds=2,
            ):
                pass
        assert error.value.status == 410
        # The recovery the reference prescribes: list again, watch from the new resourceVersion.
        fresh = small_custom.list_namespaced_custom_object(GROUP, VERSION, "default", VMS)
        events = list(
            watch.Watch().stream(
                small_custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                "default",
                VMS,
                resource_version=fresh["metadata"]["resourceVersion"],
                timeout_seconds=1,
            )
        )
        assert events == []
        api.close()


def test_watch_without_resource_version_starts_with_synthetic_added_events_and_bookmarks(custom, namespace):
    for name in ("a", "b"):
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, VMS, vm_manifest(name, namespace=namespace, run_strategy="Halted")
        )
    seen = []
    for event in watch.Watch().stream(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        VMS,
        allow_watch_bookmarks=True,
        timeout_seconds=3,
    ):
        seen.append((event["type"], event["raw_object"]["metadata"].get("name")))
        if event["type"] == "BOOKMARK":
            bookmark = event["raw_object"]
            break
    assert seen[:2] == [("ADDED", "a"), ("ADDED", "b")]
    assert seen[-1] == ("BOOKMARK", None)
    assert set(bookmark) == {"kind", "apiVersion", "metadata"} and int(bookmark["metadata"]["resourceVersion"]) > 0


def test_label_and_field_selectors_filter_lists_and_watches(custom, namespace):
    for name, team in (("red1", "red"), ("red2", "red"), ("blue1", "blue")):
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            VMS,
            vm_manifest(name, namespace=namespace, run_strategy="Halted", labels={"team": team}),
        )
    red = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, VMS, label_selector="team=red")
    assert sorted(i["metadata"]["name"] for i in red["items"]) == ["red1", "red2"]
    named = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, VMS, field_selector="metadata.name=blue1")
    assert [i["metadata"]["name"] for i in named["items"]] == ["blue1"]
    with pytest.raises(ApiException) as error:
        custom.list_namespaced_custom_object(GROUP, VERSION, namespace, VMS, field_selector="spec.running=true")
    assert error.value.status == 400
    # A label change that takes an object out of a selector is a DELETED event for that watch.
    rv = red["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, VMS, "red2", {"metadata": {"labels": {"team": "blue"}}}
    )
    events = [
        (e["type"], e["object"]["metadata"]["name"])
        for e in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            VMS,
            label_selector="team=red",
            resource_version=rv,
            timeout_seconds=1,
        )
    ]
    assert events == [("DELETED", "red2")]


def test_merge_patch_json_patch_and_status_subresource(sim, custom, namespace):
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, VMS, vm_manifest("p", namespace=namespace, run_strategy="Halted")
    )
    patched = custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, VMS, "p", {"metadata": {"annotations": {"portal/attempt": "7"}}}
    )
    assert patched["metadata"]["annotations"] == {"portal/attempt": "7"}
    assert patched["metadata"]["generation"] == 1, "metadata changes do not bump the generation"
    http = urllib3.PoolManager()
    path = f"{sim.url}/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/p"
    ops = [
        {"op": "test", "path": "/spec/runStrategy", "value": "Halted"},
        {"op": "replace", "path": "/spec/runStrategy", "value": "Manual"},
    ]
    response = http.request(
        "PATCH",
        path,
        body=json.dumps(ops),
        headers={**sim.auth_header(), "Content-Type": "application/json-patch+json"},
    )
    assert response.status == 200 and json.loads(response.data)["metadata"]["generation"] == 2
    failed = http.request(
        "PATCH",
        path,
        body=json.dumps(ops),
        headers={**sim.auth_header(), "Content-Type": "application/json-patch+json"},
    )
    assert failed.status == 422, "the test op no longer holds"
    # Status written through the main resource is ignored; through /status it sticks.
    current = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "p")
    current["status"]["printableStatus"] = "Imaginary"
    replaced = custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "p", current)
    assert replaced["status"]["printableStatus"] == "Stopped"
    stale = dict(current, metadata=dict(current["metadata"], resourceVersion="1"))
    with pytest.raises(ApiException) as conflict:
        custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "p", stale)
    assert conflict.value.status == 409
    unconditional = dict(current, metadata={k: v for k, v in current["metadata"].items() if k != "resourceVersion"})
    with pytest.raises(ApiException) as missing_rv:
        custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "p", unconditional)
    assert missing_rv.value.status == 422 and "must be specified for an update" in missing_rv.value.body


def test_deleting_a_vm_removes_its_vmi_pod_and_guest(sim, custom, core, namespace):
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, VMS, vm_manifest("gone", namespace=namespace))
    vmi = wait_for(
        lambda: (
            (_vmi(custom, namespace, "gone") or {}).get("status", {}).get("phase") == "Running"
            and _vmi(custom, namespace, "gone")
        ),
        what="Running VMI",
    )
    pods = core.list_namespaced_pod(namespace, label_selector=f"kubevirt.io/created-by={vmi['metadata']['uid']}")
    assert len(pods.items) == 1 and pods.items[0].metadata.owner_references[0].uid == vmi["metadata"]["uid"]
    assert sim.admin.guest(namespace, "gone") is not None
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "gone")
    wait_for(lambda: _vmi(custom, namespace, "gone") is None, what="VMI deleted")
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, what="pod deleted")
    with pytest.raises(ApiException):
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "gone")
    assert sim.admin.guest(namespace, "gone") is None


def test_orphan_propagation_keeps_the_vmi(custom, namespace):
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, VMS, vm_manifest("orph", namespace=namespace))
    wait_for(lambda: _vmi(custom, namespace, "orph"), what="VMI")
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "orph", propagation_policy="Orphan")
    wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, VMS)["items"], what="VM gone")
    vmi = _vmi(custom, namespace, "orph")
    assert vmi is not None and vmi["metadata"].get("ownerReferences") == []


def test_graceful_vmi_deletion_goes_through_succeeded(sim, custom, namespace):
    sim.admin.configure(stop_delay=0.3)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, VMS, vm_manifest("g", namespace=namespace))
        wait_for(
            lambda: (_vmi(custom, namespace, "g") or {}).get("status", {}).get("phase") == "Running", what="Running"
        )
        rv = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, VMIS)["metadata"]["resourceVersion"]
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "g", {"spec": {"runStrategy": "Halted"}})
        seen = []
        for event in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            VMIS,
            resource_version=rv,
            timeout_seconds=5,
        ):
            obj = event["object"]
            seen.append((event["type"], obj["status"].get("phase"), bool(obj["metadata"].get("deletionTimestamp"))))
            if event["type"] == "DELETED":
                break
    finally:
        sim.admin.configure(stop_delay=0)
    assert seen[0] == ("MODIFIED", "Running", True)
    assert ("MODIFIED", "Succeeded", True) in seen and seen[-1][0] == "DELETED"
    vm = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, VMS, "g")
    assert vm["status"]["printableStatus"] == "Stopped" and "created" not in vm["status"]


def test_unschedulable_when_the_cluster_is_full(tmp_path):
    from kubesim.testing import KubesimServer

    with KubesimServer(tmp_path, guest="none", nodes=1, node_memory="3Gi") as small:
        api = small.api_client()
        small_custom = client.CustomObjectsApi(api)
        small_custom.create_namespaced_custom_object(GROUP, VERSION, "default", VMS, vm_manifest("fits", memory="2Gi"))
        small_custom.create_namespaced_custom_object(GROUP, VERSION, "default", VMS, vm_manifest("waits", memory="2Gi"))

        def vm_status(name):
            return (
                small_custom.get_namespaced_custom_object(GROUP, VERSION, "default", VMS, name)
                .get("status", {})
                .get("printableStatus")
            )

        wait_for(lambda: vm_status("waits") == "ErrorUnschedulable", what="ErrorUnschedulable")
        assert vm_status("fits") == "Running"
        vmi = small_custom.get_namespaced_custom_object(GROUP, VERSION, "default", VMIS, "waits")
        assert vmi["status"]["phase"] == "Scheduling"  # the pod exists, unscheduled
        assert list(vmi["status"]["activePods"].values()) == [""]
        scheduled = condition(vmi, "PodScheduled")
        assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
        assert scheduled["message"].startswith("0/1 nodes are available: 1 Insufficient memory.")
        core = client.CoreV1Api(api)
        pod = core.list_namespaced_pod("default", label_selector="app=waits").items[0]
        assert pod.status.phase == "Pending" and pod.spec.node_name is None
        events = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={pod.metadata.name},reason=FailedScheduling"
        )
        assert events.items and events.items[0].type == "Warning"
        # Freeing capacity lets the waiting VMI through: the scheduler retries when a pod goes.
        small_custom.delete_namespaced_custom_object(GROUP, VERSION, "default", VMS, "fits")
        wait_for(lambda: vm_status("waits") == "Running", what="the waiting VM to run")
        api.close()


def test_virt_launcher_pod_labels_requests_and_read_only(custom, core, namespace):
    manifest = vm_manifest("sized", namespace=namespace, memory="4Gi", cores=2, labels={"portal/attempt": "42"})
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, VMS, manifest)
    vmi = wait_for(
        lambda: (
            (_vmi(custom, namespace, "sized") or {}).get("status", {}).get("phase") == "Running"
            and _vmi(custom, namespace, "sized")
        ),
        what="Running",
    )
    pod = core.list_namespaced_pod(namespace, label_selector="portal/attempt=42").items[0]
    labels = pod.metadata.labels
    assert labels["kubevirt.io"] == "virt-launcher" and labels["kubevirt.io/created-by"] == vmi["metadata"]["uid"]
    assert labels["vm.kubevirt.io/name"] == "sized" and labels["vmi.kubevirt.io/id"] == "sized"
    assert pod.metadata.name.startswith("virt-launcher-sized-")
    assert pod.metadata.annotations["kubevirt.io/domain"] == "sized"
    compute = pod.spec.containers[0]
    assert compute.name == "compute"
    # 4380Mi and a byte: KubeVirt v1.9.0's arithmetic (see test_fidelity.py).
    assert compute.resources.requests["cpu"] == "200m" and compute.resources.requests["memory"] == "4592762881"
    assert compute.resources.limits["devices.kubevirt.io/kvm"] == "1"
    assert pod.status.phase == "Running" and pod.status.pod_ip == vmi["status"]["interfaces"][0]["ipAddress"]
    with pytest.raises(ApiException) as error:
        core.create_namespaced_pod(
            namespace, {"metadata": {"name": "mine"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        )
    assert error.value.status == 405
    # Deleting the launcher pod kills the VMI, as on a cluster; runStrategy Always then starts a new one.
    core.delete_namespaced_pod(pod.metadata.name, namespace)
    wait_for(
        lambda: (
            (_vmi(custom, namespace, "sized") or {}).get("metadata", {}).get("uid")
            not in (None, vmi["metadata"]["uid"])
        ),
        what="a replacement VMI",
    )


def test_nodes_kubevirt_cr_version_and_discovery(sim, api, core):
    nodes = core.list_node().items
    assert len(nodes) == 3
    allocatable = nodes[0].status.allocatable
    assert allocatable["devices.kubevirt.io/kvm"] == "1k" and allocatable["memory"] == "64Gi"
    assert nodes[0].status.node_info.kubelet_version == "v1.33.5"
    assert nodes[0].status.node_info.container_runtime_version.startswith("containerd://")
    kubevirt = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, "kubevirt", "kubevirts", "kubevirt"
    )
    assert kubevirt["status"]["observedKubeVirtVersion"] == "v1.9.0"
    assert client.VersionApi(api).get_code().git_version == "v1.33.5"
    http = urllib3.PoolManager()
    sub = json.loads(http.request("GET", f"{sim.url}/apis/subresources.kubevirt.io/v1", headers=sim.auth_header()).data)
    names = {r["name"] for r in sub["resources"]}
    assert {
        "virtualmachineinstances/console",
        "virtualmachineinstances/portforward",
        "virtualmachines/start",
        "virtualmachineinstances/guestosinfo",
    } <= names
    version = json.loads(
        http.request("GET", f"{sim.url}/apis/subresources.kubevirt.io/v1/version", headers=sim.auth_header()).data
    )
    assert version["gitVersion"] == "v1.9.0"
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"kubevirt.io", "subresources.kubevirt.io", "networking.k8s.io"} <= groups


def test_requests_without_the_token_get_401_everywhere(sim):
    http = urllib3.PoolManager()
    for path in (
        "/api/v1/namespaces",
        "/apis/kubevirt.io/v1/virtualmachines",
        "/kubesim/counters",
        "/version",
        "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/x/console",
    ):
        response = http.request("GET", sim.url + path, headers={"Authorization": "Bearer wrong"})
        assert response.status == 401, path
        assert json.loads(response.data)["reason"] == "Unauthorized"


def test_secrets_events_networkpolicies_quota_and_namespace_deletion(sim, api, core, namespace):
    secret = core.create_namespaced_secret(namespace, {"metadata": {"name": "ci"}, "stringData": {"userdata": "x"}})
    assert secret.data == {"userdata": "eA=="} and secret.type == "Opaque"
    networking = client.NetworkingV1Api(api)
    networking.create_namespaced_network_policy(
        namespace, {"metadata": {"name": "deny"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    )
    assert [p.metadata.name for p in networking.list_namespaced_network_policy(namespace).items] == ["deny"]
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "q"}, "spec": {"hard": {"requests.memory": "3Gi", "pods": "5"}}}
    )
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, VMS, vm_manifest("q1", namespace=namespace))
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, VMS, vm_manifest("q2", namespace=namespace, memory="2Gi")
    )
    wait_for(
        lambda: (
            (_vmi(custom, namespace, "q2") or {}).get("status", {}).get("conditions")
            and condition(_vmi(custom, namespace, "q2"), "Synchronized")
        ),
        what="quota denial",
    )
    denial = condition(_vmi(custom, namespace, "q2"), "Synchronized")
    assert denial["reason"] == "FailedCreate" and "exceeded quota: q" in denial["message"]
    quota = core.read_namespaced_resource_quota("q", namespace)
    assert quota.status.used["pods"] == "1" and quota.status.used["requests.memory"] == str(
        1294 * 2**20 + 35_000_000
    )  # 1Gi + v1.9.0's overhead, plus the console log sidecar's 35M
    events = core.list_namespaced_event(namespace, field_selector="reason=FailedCreate").items
    assert events and "exceeded quota" in events[0].message
    core.delete_namespace(namespace)
    wait_for(
        lambda: not any(n.metadata.name == namespace for n in core.list_namespace().items), what="namespace deletion"
    )
    core.create_namespace({"metadata": {"name": namespace}})  # the fixture deletes it again


def test_metadata_only_lists_and_gets_as_client_go_asks(sim, core, namespace):
    """``as=PartialObjectMetadataList`` / ``as=PartialObjectMetadata`` (client-go's metadata client): the objects'
    metadata and nothing else; a client that prefers plain JSON still gets whole objects."""
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "big", "labels": {"app": "x"}}, "stringData": {"userdata": "x" * 50_000}}
    )
    http = urllib3.PoolManager()
    base = f"{sim.url}/api/v1/namespaces/{namespace}/secrets"

    def get(url: str, accept: str) -> dict:
        response = http.request("GET", url, headers={"Authorization": f"Bearer {sim.token}", "Accept": accept})
        assert response.status == 200, response.data[:200]
        return json.loads(response.data)

    listed = get(
        f"{base}?labelSelector=app%3Dx",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json",
    )
    assert (listed["kind"], listed["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    assert listed["metadata"]["resourceVersion"]
    [item] = listed["items"]
    assert set(item) == {"kind", "apiVersion", "metadata"}
    assert (item["kind"], item["apiVersion"]) == ("PartialObjectMetadata", "meta.k8s.io/v1")
    assert item["metadata"]["name"] == "big" and item["metadata"]["labels"] == {"app": "x"}
    one = get(f"{base}/big", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1")
    assert (one["kind"], one["apiVersion"], "data" in one) == ("PartialObjectMetadata", "meta.k8s.io/v1beta1", False)
    whole = get(base, "application/json, application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")
    assert whole["kind"] == "SecretList" and len(whole["items"][0]["data"]["userdata"]) > 50_000


def test_many_concurrent_watchers_all_see_the_event(api, custom, namespace):
    rv = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, VMS)["metadata"]["resourceVersion"]
    received = []

    def watcher():
        local = client.CustomObjectsApi(api)
        for event in watch.Watch().stream(
            local.list_namespaced_custom_object, GROUP, VERSION, namespace, VMS, resource_version=rv, timeout_seconds=3
        ):
            received.append(event["object"]["metadata"]["name"])
            return

    threads = [threading.Thread(target=watcher) for _ in range(8)]
    for thread in threads:
        thread.start()
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, VMS, vm_manifest("fan", namespace=namespace, run_strategy="Halted")
    )
    for thread in threads:
        thread.join(timeout=5)
    assert received == ["fan"] * 8


def test_bad_query_parameters_and_bodies_are_400(sim, namespace):
    http = urllib3.PoolManager()
    base = f"{sim.url}/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines"
    cases = (
        (base + "?limit=lots", "GET", None),
        (base + "?labelSelector=a%20in%20b%20c", "GET", None),
        (base, "POST", b"{not json"),
        (base + "/x?gracePeriodSeconds=soon", "DELETE", None),
    )
    for url, method, body in cases:
        response = http.request(
            method, url, body=body, headers={**sim.auth_header(), "Content-Type": "application/json"}
        )
        assert response.status == 400, (url, response.data)
        assert json.loads(response.data)["reason"] == "BadRequest"
