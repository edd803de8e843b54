"""The size table and KubeVirt's virt-launcher arithmetic."""

import time

import pytest

from labs.sizes import SIZE_TABLE, LauncherRequests, guest_resources, launcher_requests


def launcher_requests_for_size(size: str) -> LauncherRequests:
    guest = guest_resources(size)
    return launcher_requests(vcpus=guest.vcpus, memory_mib=guest.memory_mib)


def test_medium_matches_the_measured_cluster_within_one_percent():
    # Measured on a real cluster: a 2 vCPU / 4Gi VM's compute container requested 200m CPU and 4372Mi memory.
    requests = launcher_requests_for_size("medium")
    assert requests.compute_cpu_millicores == 200
    assert abs(requests.compute_memory_bytes / 2**20 - 4372) / 4372 <= 0.01
    # KubeVirt v1.9.0: 4096 + 8 (and a byte) + 220 + 16 + 8 + 32.
    assert requests.compute_memory_bytes == 4380 * 2**20 + 1


def test_small_follows_v1_9():
    # 1 vCPU, 2Gi guest: 4 + 220 + 8 + 8 + 32 = 272Mi of overhead (2Gi's page tables are a whole 4Mi), plus 35M.
    requests = launcher_requests(vcpus=1, memory_mib=2048)
    assert requests.compute_memory_bytes == (2048 + 272) * 2**20
    assert (requests.cpu_millicores, requests.memory_mib) == (105, 2048 + 272 + 34)


def test_large_and_no_graphics_and_no_console_log():
    assert launcher_requests_for_size("large").cpu_millicores == 405
    bare = launcher_requests(vcpus=1, memory_mib=2048, graphics=False, console_log=False)
    assert (bare.cpu_millicores, bare.memory_mib) == (100, 2048 + 240)


def test_unknown_size_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown lab size 'huge'"):
        launcher_requests_for_size("huge")


def test_pod_totals_count_the_serial_console_log_sidecar():
    # KubeVirt v1.9: compute 200m / 4380Mi and a byte; guest-console-log 5m / 35M; the pod is what quotas count.
    requests = launcher_requests_for_size("medium")
    assert requests.cpu_millicores == 205
    assert requests.memory_mib == -(-(4380 * 2**20 + 1 + 35_000_000) // 2**20)


@pytest.mark.parametrize("size", list(SIZE_TABLE))
def test_every_size_agrees_with_the_launcher_pod_kubesim_builds_to_the_mib(size, cluster):
    import uuid

    from kubernetes import client as k8s

    from kubesim.controllers.quota import effective_requests
    from labs.kubevirt import manifests
    from labs.sizes import guest_resources

    api = cluster.api_client()
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    namespace = f"sizes-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    guest = guest_resources(size)
    vm = manifests.virtual_machine(
        name="sized",
        namespace=namespace,
        labels={"app": "sized"},
        image="quay.io/containerdisks/debian:12",
        vcpus=guest.vcpus,
        memory_mib=guest.memory_mib,
        host_passthrough=False,
        cloud_init_secret="none",
    )
    vm["spec"]["template"]["spec"]["volumes"].pop()  # no cloud-init Secret needed for the pod's shape
    vm["spec"]["template"]["spec"]["domain"]["devices"]["disks"].pop()
    try:
        custom.create_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachines", vm)
        deadline = time.monotonic() + 20
        while not (pods := core.list_namespaced_pod(namespace).items) and time.monotonic() < deadline:
            time.sleep(0.05)
        pod = api.sanitize_for_serialization(pods[0])
    finally:
        core.delete_namespace(namespace)
    cpu, memory = effective_requests(pod)
    expected = launcher_requests_for_size(size)
    assert expected.cpu_millicores == int(cpu * 1000)
    assert 0 <= expected.memory_mib * 2**20 - memory < 2**20
