"""The size table and KubeVirt's virt-launcher arithmetic."""

import pytest

from labs.sizes import launcher_requests, launcher_requests_for_size


def test_medium_matches_the_measured_cluster_within_one_percent():
    # Measured on a real cluster: a 2 vCPU / 4Gi VM's virt-launcher pod requested 200m CPU and 4372Mi memory.
    requests = launcher_requests_for_size("medium")
    assert requests.cpu == "200m"
    assert abs(requests.memory_mib - 4372) / 4372 <= 0.01
    assert requests.memory_mib == 4400


def test_small_follows_the_reference_worked_example():
    # 1 vCPU, 2Gi guest: 4 + 240 + 8 + 8 + 32 = 292Mi of overhead.
    requests = launcher_requests(vcpus=1, memory_mib=2048)
    assert (requests.cpu_millicores, requests.memory_mib) == (100, 2048 + 292)


def test_large_and_no_graphics():
    assert launcher_requests_for_size("large").cpu == "400m"
    assert launcher_requests(vcpus=1, memory_mib=2048, graphics=False).memory_mib == 2048 + 260


def test_unknown_size_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown lab size 'huge'"):
        launcher_requests_for_size("huge")
