"""Where kubesim follows KubeVirt v1.9.0 and Kubernetes strictly: Pod Security admission of launcher pods, device
quantities as the kubelet writes them, the launcher pod's containers, security context and requests."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kubesim.tests.support import GROUP, VERSION, condition, get_or_none, vm_manifest, wait_for

MI = 2**20


def _vmi(custom, namespace, name):
    return get_or_none(custom, namespace, "virtualmachineinstances", name)


def _label(core, namespace, level):
    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}})


def _kubevirt_configuration(custom, configuration):
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "kubevirt", "kubevirts", "kubevirt", {"spec": {"configuration": configuration}}
    )


def test_restricted_namespace_refuses_the_launcher_pod_as_kubevirt_reports_it(custom, core, namespace):
    _label(core, namespace, "restricted")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest("psa", namespace=namespace)
    )
    wait_for(lambda: condition(_vmi(custom, namespace, "psa"), "Synchronized"), what="Synchronized=False")
    vmi = _vmi(custom, namespace, "psa")
    synchronized = condition(vmi, "Synchronized")
    assert (synchronized["status"], synchronized["reason"]) == ("False", "FailedCreate")
    assert synchronized["message"].startswith(
        f"failed to create pod for vmi {namespace}/psa, it needs a privileged namespace to run: "
        f'pods "virt-launcher-psa-" is forbidden: violates PodSecurity "restricted:latest": seccompProfile'
    )
    assert vmi["status"]["phase"] == "Pending"
    assert core.list_namespaced_pod(namespace).items == []
    events = [e for e in core.list_namespaced_event(namespace).items if e.reason == "FailedCreate"]
    assert events and events[0].type == "Warning"
    assert events[0].message.startswith("failed to render launch manifest: failed to create pod for vmi")
    # Relabelled privileged, the namespace admits the pod on virt-controller's next try.
    _label(core, namespace, "privileged")
    wait_for(
        lambda: _vmi(custom, namespace, "psa")["status"].get("phase") == "Running",
        timeout=15,
        what="the VMI to run once the namespace is privileged",
    )


def test_baseline_admits_the_non_root_launcher_and_restricted_needs_a_seccomp_profile(custom, core, namespace):
    _label(core, namespace, "baseline")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest("base", namespace=namespace)
    )
    wait_for(lambda: _vmi(custom, namespace, "base")["status"].get("phase") == "Running", what="Running")
    pod = core.list_namespaced_pod(namespace).items[0]
    assert pod.spec.security_context.run_as_non_root and pod.spec.security_context.run_as_user == 107
    assert pod.spec.security_context.seccomp_profile is None
    compute = pod.spec.containers[0].security_context
    assert compute.allow_privilege_escalation is False and compute.capabilities.drop == ["ALL"]
    assert compute.capabilities.add == ["NET_BIND_SERVICE"]
    try:
        _kubevirt_configuration(
            custom,
            {
                "seccompConfiguration": {
                    "virtualMachineInstanceProfile": {"customProfile": {"runtimeDefaultProfile": True}}
                }
            },
        )
        _label(core, namespace, "restricted")
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "virtualmachines", vm_manifest("strict", namespace=namespace)
        )
        wait_for(lambda: _vmi(custom, namespace, "strict")["status"].get("phase") == "Running", what="Running")
        pod = core.list_namespaced_pod(namespace, label_selector="app=strict").items[0]
        assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    finally:
        _kubevirt_configuration(custom, {"seccompConfiguration": None})


def test_nodes_advertise_kvm_devices_as_the_kubelet_writes_them(core):
    node = core.list_node().items[0]
    assert node.status.allocatable["devices.kubevirt.io/kvm"] == "1k"
    assert node.status.capacity["devices.kubevirt.io/tun"] == "1k"


def test_launcher_pod_has_the_console_log_sidecar_and_v1_9_overhead(custom, core, namespace):
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest("shape", namespace=namespace, memory="4Gi", cores=2)
    )
    wait_for(lambda: _vmi(custom, namespace, "shape")["status"].get("phase") == "Running", what="Running")
    pod = core.list_namespaced_pod(namespace).items[0]
    compute = pod.spec.containers[0]
    # 4Gi + 4Gi/512 (kB-rounded: one byte over 8Mi) + 220Mi fixed + 2 × 8Mi + 8Mi IOThread + 32Mi video.
    assert compute.resources.requests["cpu"] == "200m"
    assert int(compute.resources.requests["memory"]) == 4380 * MI + 1
    console = pod.spec.init_containers[0]
    assert console.name == "guest-console-log" and console.restart_policy == "Always"
    assert console.resources.requests == {"cpu": "5m", "memory": "35M"}
    assert console.resources.limits == {"cpu": "15m", "memory": "60M"}
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q"},
        "spec": {"hard": {"requests.cpu": "10", "requests.memory": "100Gi"}},
    }
    core.create_namespaced_resource_quota(namespace, quota)

    def used():
        status = core.read_namespaced_resource_quota("q", namespace).status
        return status and status.used and status.used.get("requests.cpu") not in (None, "0") and status.used

    counted = wait_for(used, what="the quota's usage")
    assert counted["requests.cpu"] == "205m"
    assert Decimal(counted["requests.memory"]) == 4380 * MI + 1 + 35_000_000


def test_disable_serial_console_log_removes_the_sidecar(custom, core, namespace):
    try:
        _kubevirt_configuration(custom, {"virtualMachineOptions": {"disableSerialConsoleLog": {}}})
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "virtualmachines", vm_manifest("quiet", namespace=namespace)
        )
        wait_for(lambda: _vmi(custom, namespace, "quiet")["status"].get("phase") == "Running", what="Running")
        pod = core.list_namespaced_pod(namespace).items[0]
        assert not pod.spec.init_containers
    finally:
        _kubevirt_configuration(custom, {"virtualMachineOptions": None})


def test_client_certificate_kubeconfig_with_tls_server_name_authenticates(sim):
    import yaml
    from kubernetes import client, config

    document = yaml.safe_load(sim.cert_kubeconfig.read_text())
    assert "token" not in document["users"][0]["user"]
    assert document["clusters"][0]["cluster"]["tls-server-name"] == "kubesim.cluster.local"
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(sim.cert_kubeconfig), client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        names = [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items]
    assert "kubevirt" in names
    # Without a certificate or a token the same listener answers 401.
    configuration.cert_file = configuration.key_file = None
    with client.ApiClient(configuration) as api, pytest.raises(client.ApiException) as refused:
        client.CoreV1Api(api).list_namespace()
    assert refused.value.status == 401
