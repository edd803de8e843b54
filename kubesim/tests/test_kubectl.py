"""kubectl (the real binary) against the kubeconfig kubesim writes: apply, get, get -w, delete."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

import pytest

from kubesim.tests.support import wait_for

SEED_VM = """\
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: my-vm, namespace: default}
spec:
  running: true
  template:
    spec:
      domain:
        devices:
          disks: [{name: containerdisk, disk: {bus: virtio}}]
          interfaces: [{name: default, masquerade: {}}]
        resources: {requests: {memory: 1Gi, cpu: "1"}}
      networks: [{name: default, pod: {}}]
      volumes: [{name: containerdisk, containerDisk: {image: quay.io/containerdisks/fedora:latest}}]
"""

KUBECTL = shutil.which("kubectl") or "kubectl"  # CI installs it; without it these tests fail, visibly


@pytest.fixture
def kubectl(sim, tmp_path):
    # kubectl sends a bearer token only over TLS, hence the TLS kubeconfig.
    env = {**os.environ, "KUBECONFIG": str(sim.tls_kubeconfig)}

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [KUBECTL, "--cache-dir", str(tmp_path / "cache"), *args],
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    return run


def test_apply_get_watch_and_delete_the_seed_vm(kubectl, tmp_path):
    manifest = tmp_path / "vm.yaml"
    manifest.write_text(SEED_VM)
    applied = kubectl("apply", "-f", str(manifest))
    assert applied.stdout.strip() == "virtualmachine.kubevirt.io/my-vm created"
    assert "spec.running is deprecated, please use spec.runStrategy instead" in applied.stderr
    listing = wait_for(
        lambda: (
            (out := kubectl("get", "vm,vmi").stdout) and "Running" in out.split("virtualmachineinstance")[-1] and out
        ),
        what="VM and VMI Running",
    )
    lines = [line.split() for line in listing.splitlines() if line.strip()]
    assert lines[0] == ["NAME", "AGE", "STATUS", "READY"]
    assert lines[1][0] == "virtualmachine.kubevirt.io/my-vm" and lines[1][2:] == ["Running", "True"]
    assert lines[2] == ["NAME", "AGE", "PHASE", "IP", "NODENAME", "READY"]
    assert lines[3][0] == "virtualmachineinstance.kubevirt.io/my-vm" and lines[3][2] == "Running"
    assert lines[3][3].startswith("10.244.") and lines[3][-1] == "True"
    # Applying again is a no-op patch; changing the manifest patches the VM.
    assert kubectl("apply", "-f", str(manifest)).stdout.strip() == "virtualmachine.kubevirt.io/my-vm unchanged"
    manifest.write_text(SEED_VM.replace("memory: 1Gi", "memory: 2Gi"))
    assert kubectl("apply", "-f", str(manifest)).stdout.strip() == "virtualmachine.kubevirt.io/my-vm configured"
    assert (
        kubectl("get", "vm", "my-vm", "-o", "jsonpath={.spec.template.spec.domain.resources.requests.memory}").stdout
        == "2Gi"
    )
    deleted = kubectl("delete", "-f", str(manifest))
    assert deleted.stdout.strip() == 'virtualmachine.kubevirt.io "my-vm" deleted'
    assert kubectl("get", "vm,vmi", "-o", "name").stdout.strip() == ""


def test_get_watch_streams_changes(kubectl, sim, tmp_path):
    env = {**os.environ, "KUBECONFIG": str(sim.tls_kubeconfig)}
    watches = sim.admin.counters()["open_watches"]
    watcher = subprocess.Popen(
        [KUBECTL, "--cache-dir", str(tmp_path / "cache"), "get", "vm", "-w", "--output-watch-events"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(iter(watcher.stdout.readline, "")), daemon=True)
    reader.start()

    def rows() -> list[list[str]]:
        """EVENT NAME AGE STATUS READY, for the watched VM."""
        return [row for row in (line.split() for line in list(output)) if row[1:2] == ["watched"]]

    try:
        # The changes are made once kubectl watches, and waited for as it prints them, however slow the host.
        wait_for(lambda: sim.admin.counters()["open_watches"] > watches, timeout=30, what="kubectl's watch")
        manifest = tmp_path / "watched.yaml"
        manifest.write_text(SEED_VM.replace("my-vm", "watched").replace("running: true", "runStrategy: Halted"))
        kubectl("apply", "-f", str(manifest))
        # Added with no status yet, then Stopped once the controller has seen it.
        wait_for(lambda: ["Stopped"] in [row[3:4] for row in rows()], timeout=30, what="get -w to show it Stopped")
        kubectl("delete", "vm", "watched")
        wait_for(lambda: rows()[-1][0] == "DELETED", timeout=30, what="get -w to show the deletion")
    finally:
        watcher.terminate()
        watcher.wait(timeout=10)
        reader.join(timeout=10)
        errors = watcher.stderr.read()
    assert rows()[0][0] == "ADDED", f"{output!r} {errors!r}"
    assert rows()[-1][3:4] in (["Stopped"], ["Terminating"])


def test_get_namespaces_nodes_pods_events_and_kubevirt(kubectl):
    assert "kubevirt" in kubectl("get", "namespaces", "-o", "name").stdout
    nodes = kubectl("get", "nodes").stdout.splitlines()
    assert nodes[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"] and len(nodes) == 4
    assert "Deployed" in kubectl("get", "kubevirt", "-n", "kubevirt").stdout
    assert kubectl("get", "networkpolicies,resourcequotas", "-A").returncode == 0
    assert kubectl("api-resources", "--api-group=kubevirt.io").stdout.count("kubevirt.io/v1") == 3


def test_imperative_verbs_operators_type(kubectl):
    # kubectl's typed clients send built-in objects as protobuf (application/vnd.kubernetes.protobuf).
    kubectl("create", "namespace", "ops-x")
    kubectl("label", "namespace", "ops-x", "pod-security.kubernetes.io/enforce=privileged")
    kubectl("label", "--overwrite", "namespace", "ops-x", "pod-security.kubernetes.io/enforce=baseline")
    kubectl("annotate", "namespace", "ops-x", "owner=ops")
    kubectl("patch", "namespace", "ops-x", "-p", '{"metadata":{"labels":{"team":"a"}}}')
    shown = kubectl("get", "namespace", "ops-x", "-o", "json").stdout
    assert '"pod-security.kubernetes.io/enforce": "baseline"' in shown and '"owner": "ops"' in shown
    assert '"team": "a"' in shown
    kubectl("create", "secret", "generic", "s1", "-n", "ops-x", "--from-literal=userdata=#cloud-config")
    assert (
        kubectl("get", "secret", "s1", "-n", "ops-x", "-o", "jsonpath={.data.userdata}").stdout
        == "I2Nsb3VkLWNvbmZpZw=="
    )
    kubectl("create", "configmap", "c1", "-n", "ops-x", "--from-literal=a=b")
    assert kubectl("get", "configmap", "c1", "-n", "ops-x", "-o", "jsonpath={.data.a}").stdout == "b"
    kubectl("create", "quota", "q1", "-n", "ops-x", "--hard=requests.cpu=2,requests.memory=4Gi,pods=3")
    assert kubectl("get", "quota", "q1", "-n", "ops-x", "-o", "jsonpath={.spec.hard.requests\\.memory}").stdout == "4Gi"
    kubectl("label", "namespace", "ops-x", "team-")
    assert '"team"' not in kubectl("get", "namespace", "ops-x", "-o", "json").stdout
    kubectl("delete", "namespace", "ops-x")
