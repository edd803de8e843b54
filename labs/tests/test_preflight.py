"""Preflight: the assessment in plain words, and against kubesim clusters configured both ways."""

from __future__ import annotations

import pytest

from labs.kubevirt import preflight
from labs.kubevirt.preflight import ClusterFacts


def kubevirt(version="v1.9.0", gates=(), disabled=(), phase="Deployed", emulation=False):
    developer = {}
    if gates:
        developer["featureGates"] = list(gates)
    if disabled:
        developer["disabledFeatureGates"] = list(disabled)
    if emulation:
        developer["useEmulation"] = True
    return {
        "spec": {"configuration": {"developerConfiguration": developer}},
        "status": {"observedKubeVirtVersion": version, "phase": phase},
    }


def node(runtime="containerd://2.3.2", kvm="1000"):
    return {
        "status": {
            "allocatable": {"cpu": "16", "devices.kubevirt.io/kvm": kvm},
            "nodeInfo": {"containerRuntimeVersion": runtime},
        }
    }


def codes(findings):
    return {f.code: f.level for f in findings}


def test_healthy_cluster_gives_only_the_running_note():
    findings = preflight.assess(ClusterFacts("v1.33.5", kubevirt(), [node()]))
    assert codes(findings) == {"running_deprecated": "info"}
    assert not preflight.blocking(findings)


def test_image_volume_on_with_an_old_containerd_is_blocking_and_names_the_fix():
    findings = preflight.assess(ClusterFacts("v1.33.5", kubevirt(), [node("containerd://2.2.3")] * 2))
    finding = next(f for f in findings if f.code == "image_volume_unsupported")
    assert finding.level == "error"
    assert "containerd://2.2.3" in finding.message and "no such file or directory" in finding.message
    assert "disabledFeatureGates" in finding.fix
    assert preflight.blocking(findings)


def test_image_volume_disabled_explicitly_is_clean_even_with_an_old_runtime():
    findings = preflight.assess(
        ClusterFacts("v1.33.5", kubevirt(disabled=["ImageVolume"]), [node("containerd://2.2.3")])
    )
    assert "image_volume_unsupported" not in codes(findings)


def test_before_v1_9_the_beta_gate_is_off_unless_enabled():
    old = [node("containerd://2.2.3")]
    assert "image_volume_unsupported" not in codes(preflight.assess(ClusterFacts("v1.33.5", kubevirt("v1.8.2"), old)))
    enabled = preflight.assess(ClusterFacts("v1.33.5", kubevirt("v1.8.2", gates=["ImageVolume"]), old))
    assert codes(enabled)["image_volume_unsupported"] == "error"


def test_mixed_or_unknown_runtimes_warn():
    mixed = preflight.assess(ClusterFacts("v1.33.5", kubevirt(), [node(), node("containerd://2.2.3")]))
    assert codes(mixed)["image_volume_unsupported"] == "warning"
    unknown = preflight.assess(ClusterFacts("v1.33.5", kubevirt(), [node("docker://27.1.0")]))
    assert codes(unknown)["image_volume_unverified"] == "warning"
    assert not preflight.blocking(unknown)


def test_no_kvm_is_blocking_unless_emulating():
    findings = preflight.assess(ClusterFacts("v1.33.5", kubevirt(), [node(kvm="0")]))
    assert codes(findings)["no_kvm"] == "error"
    emulated = preflight.assess(ClusterFacts("v1.33.5", kubevirt(emulation=True), [node(kvm="0")]))
    assert codes(emulated)["software_emulation"] == "warning"
    assert not preflight.blocking(emulated)


def test_missing_kubevirt_and_unfinished_deploy():
    assert codes(preflight.assess(ClusterFacts("v1.33.5", None, [node()])))["kubevirt_missing"] == "error"
    deploying = preflight.assess(ClusterFacts("v1.33.5", kubevirt(phase="Deploying"), [node()]))
    assert codes(deploying)["kubevirt_not_deployed"] == "warning"


@pytest.mark.parametrize(
    ("runtime", "verdict"),
    [
        ("containerd://2.2.3", False),
        ("containerd://2.3.0", True),
        ("containerd://1.7.27", False),
        ("cri-o://1.30.4", False),
        ("cri-o://1.31.0", True),
        ("docker://27.1.0", None),
        ("", None),
    ],
)
def test_runtime_support_table(runtime, verdict):
    assert preflight.runtime_mounts_image_volumes(runtime) is verdict


# ---- against kubesim ---------------------------------------------------------------------------------------


@pytest.fixture
def kubevirt_config(cluster, db):
    """Change the session kubesim's KubeVirt CR and runtime for one test, then put them back."""
    yield cluster.admin.set_kubevirt
    cluster.admin.set_kubevirt(
        version="v1.9.0", feature_gates=[], disabled_feature_gates=[], image_volume_supported=True
    )


def run_cluster_check(*args):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = StringIO()
    try:
        call_command("cluster_check", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_cluster_check_warns_about_image_volume_and_exits_non_zero(kubevirt_config):
    kubevirt_config(image_volume_supported=False)
    code, output = run_cluster_check()
    assert code == 1
    assert "ERROR: KubeVirt v1.9.0 has the ImageVolume feature gate on" in output
    assert "containerd://2.2.3" in output
    assert "disabledFeatureGates" in output and "Fix:" in output


def test_cluster_check_is_clean_once_image_volume_is_disabled(kubevirt_config):
    kubevirt_config(image_volume_supported=False, disabled_feature_gates=["ImageVolume"])
    code, output = run_cluster_check()
    assert code == 0, output
    assert "ImageVolume" not in output
    assert "Kubernetes v1.33.5, KubeVirt v1.9.0, 3 node(s)." in output
    assert "The cluster can run lab VMs." in output


def test_cluster_check_json(kubevirt_config):
    import json

    kubevirt_config(image_volume_supported=False)
    code, output = run_cluster_check("--json")
    report = json.loads(output)
    assert code == 1
    assert report["kubevirt_version"] == "v1.9.0"
    assert [f["code"] for f in report["findings"]][0] == "image_volume_unsupported"


def test_system_check_runs_only_when_deploy_checks_are_asked_for(kubevirt_config, cluster):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    kubevirt_config(image_volume_supported=False)
    before = cluster.admin.counters()["total"]
    call_command("check")  # the everyday check never touches the cluster
    assert cluster.admin.counters()["total"] == before
    with pytest.raises(SystemCheckError, match="labs.cluster.image_volume_unsupported"):
        call_command("check", "--deploy", "--tag", "cluster")
    assert cluster.admin.counters()["total"] > before


def run_cluster_check_with_kubeconfig(settings, kubeconfig):
    """``cluster_check`` against ``kubeconfig`` instead of the session's kubesim."""
    from labs.kubevirt import client

    settings.KUBECONFIG = str(kubeconfig)
    client.reset()
    try:
        return run_cluster_check()
    finally:
        client.reset()


def test_an_unreachable_cluster_is_a_blocking_finding(settings, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    code, output = run_cluster_check_with_kubeconfig(settings, kubeconfig)
    assert code == 1
    assert "Cannot talk to the cluster API" in output


def test_an_embedded_kubesim_that_is_not_running_says_to_start_the_portal(settings, tmp_path, monkeypatch):
    from labs.kubevirt import client

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings.KUBECONFIG, settings.EMBEDDED_KUBECONFIG = None, tmp_path / "kubeconfig"
    settings.EMBEDDED_KUBECONFIG.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    client.reset()
    try:
        code, output = run_cluster_check()
    finally:
        client.reset()
    assert code == 1
    assert "this is the embedded kubesim" in output and "start bin/run" in output
    assert "Check KUBECONFIG" not in output


@pytest.mark.parametrize("content", [None, "clusters: [unclosed"])
def test_a_kubeconfig_that_cannot_be_loaded_is_a_blocking_finding_not_a_traceback(settings, tmp_path, content):
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)
    code, output = run_cluster_check_with_kubeconfig(settings, kubeconfig)
    assert code == 1
    assert "Cannot talk to the cluster API" in output
    if content is None:
        assert f"KUBECONFIG points at {kubeconfig}, which does not exist." in output


# ---- KVM as the kubelet reports it, and Pod Security of tenant namespaces ---------------------------------------


@pytest.mark.parametrize("kvm", ["1k", "1000", "110", "2k"])
def test_kvm_devices_count_however_the_kubelet_writes_the_quantity(kvm):
    findings = preflight.assess(ClusterFacts("v1.33.5", kubevirt(), [node(kvm=kvm)]))
    assert "no_kvm" not in codes(findings)


def test_a_restricted_tenant_namespace_is_blocking_unless_kubevirt_sets_a_seccomp_profile():
    restricted = {"metadata": {"name": "lab-a", "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    baseline = {"metadata": {"name": "lab-b", "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    findings = preflight.assess(ClusterFacts("v1.33.5", kubevirt(), [node()], namespaces=[restricted, baseline]))
    finding = next(f for f in findings if f.code == "namespace_pod_security")
    assert finding.level == "error" and "lab-a" in finding.message and "lab-b" not in finding.message
    assert "kubectl label --overwrite namespace lab-a pod-security.kubernetes.io/enforce=privileged" in finding.fix
    profiled = kubevirt()
    profiled["spec"]["configuration"]["seccompConfiguration"] = {
        "virtualMachineInstanceProfile": {"customProfile": {"runtimeDefaultProfile": True}}
    }
    clean = preflight.assess(ClusterFacts("v1.33.5", profiled, [node()], namespaces=[restricted]))
    assert "namespace_pod_security" not in codes(clean)


def test_cluster_check_names_a_restricted_tenant_namespace_and_the_fix(kubevirt_config, cluster, tenant_a):
    from kubernetes import client as k8s

    from labs.models import TenantNamespace

    name = "lab-psa-check"
    core = k8s.CoreV1Api(cluster.api_client())
    core.create_namespace({"metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    TenantNamespace.objects.update_or_create(tenant=tenant_a, defaults={"namespace": name})
    try:
        code, output = run_cluster_check()
    finally:
        core.delete_namespace(name)
    assert code == 1
    assert f"Tenant namespace {name} enforces Pod Security" in output
    assert f"kubectl label --overwrite namespace {name} pod-security.kubernetes.io/enforce=privileged" in output


def test_cluster_check_says_when_the_cluster_cannot_answer_whether_the_portal_may_manage_a_tenant_namespace(
    kubevirt_config, cluster, tenant_a
):
    # The refusal itself is checked against a cluster enforcing RBAC (test_new_tenant_rbac); here the access review
    # fails: the check says so rather than calling the namespace fine or forbidden.
    cluster.admin.inject_fault(code=500, verbs=["create"], resources=["selfsubjectaccessreviews"])
    try:
        code, output = run_cluster_check()
    finally:
        cluster.admin.clear_faults()
    assert f"Cannot ask the cluster whether the portal may manage tenant namespace {tenant_a.namespace}" in output
    assert "The portal may not manage" not in output
