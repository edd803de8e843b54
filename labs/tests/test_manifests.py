"""The manifests the portal sends: literal expectations, and validity against the KubeVirt and Kubernetes APIs."""

from __future__ import annotations

import base64

import pytest

from labs.kubevirt import manifests, names
from labs.tests.schema import core_errors, kubevirt_errors

LABELS = names.attempt_labels(tenant_id=3, course_id=5, lab_id=7, attempt_id=42)


def small_vm(**overrides):
    arguments = dict(
        name="attempt-42",
        namespace="lab-tenant-a-1a2b3c",
        labels=LABELS,
        image="quay.io/containerdisks/fedora:41",
        vcpus=1,
        memory_mib=2048,
        host_passthrough=False,
        cloud_init_secret="attempt-42-cloudinit",
    )
    arguments.update(overrides)
    return manifests.virtual_machine(**arguments)


def test_vm_manifest_is_exactly_what_design_section_4_describes():
    assert small_vm() == {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {
            "name": "attempt-42",
            "namespace": "lab-tenant-a-1a2b3c",
            "labels": {
                "app.kubernetes.io/managed-by": "lab-portal",
                "labs.portal/tenant": "3",
                "labs.portal/course": "5",
                "labs.portal/lab": "7",
                "labs.portal/attempt": "42",
            },
        },
        "spec": {
            "runStrategy": "Always",
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "evictionStrategy": "LiveMigrateIfPossible",
                    "domain": {
                        "cpu": {"cores": 1, "sockets": 1, "threads": 1},
                        "memory": {"guest": "2048Mi"},
                        "resources": {"requests": {"memory": "2048Mi"}},
                        "devices": {
                            "disks": [
                                {"name": "rootdisk", "disk": {"bus": "virtio"}},
                                {"name": "cloudinitdisk", "disk": {"bus": "virtio"}},
                            ],
                            "interfaces": [{"name": "default", "masquerade": {}}],
                            "rng": {},
                        },
                    },
                    "networks": [{"name": "default", "pod": {}}],
                    "volumes": [
                        {"name": "rootdisk", "containerDisk": {"image": "quay.io/containerdisks/fedora:41"}},
                        {"name": "cloudinitdisk", "cloudInitNoCloud": {"secretRef": {"name": "attempt-42-cloudinit"}}},
                    ],
                },
            },
        },
    }


def test_never_sets_running_next_to_run_strategy():
    assert "running" not in small_vm()["spec"]


def test_host_passthrough_only_for_nested_labs():
    assert "model" not in small_vm()["spec"]["template"]["spec"]["domain"]["cpu"]
    nested = small_vm(host_passthrough=True, vcpus=4, memory_mib=8192)
    domain = nested["spec"]["template"]["spec"]["domain"]
    assert domain["cpu"] == {"cores": 4, "sockets": 1, "threads": 1, "model": "host-passthrough"}
    assert domain["memory"] == {"guest": "8192Mi"}


def test_labels_are_copies_so_vm_and_template_cannot_alias():
    vm = small_vm()
    vm["metadata"]["labels"]["extra"] = "x"
    assert "extra" not in vm["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("size", [(1, 2048, False), (2, 4096, False), (4, 8192, True)])
def test_every_vm_the_portal_builds_validates_against_the_kubevirt_spec(size):
    vcpus, memory, nested = size
    vm = small_vm(vcpus=vcpus, memory_mib=memory, host_passthrough=nested)
    assert kubevirt_errors(vm, "v1.VirtualMachine") == []
    assert kubevirt_errors(vm["spec"]["template"], "v1.VirtualMachineInstanceTemplateSpec") == []


def test_the_strict_validator_catches_a_misspelt_field():
    vm = small_vm()
    vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["masqerade"] = {}
    vm["spec"]["runStrategy"] = 7
    errors = kubevirt_errors(vm, "v1.VirtualMachine")
    assert any("masqerade" in e for e in errors)
    assert any("runStrategy" in e for e in errors)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        small_vm(vcpus=0)
    with pytest.raises(ValueError):
        small_vm(image="  ")


def test_cloud_init_secret_carries_user_data_under_the_key_kubevirt_reads():
    secret = manifests.cloud_init_secret(
        name="attempt-42-cloudinit", namespace="ns", labels=LABELS, user_data="#cloud-config\nruncmd: []\n"
    )
    assert secret["metadata"] == {"name": "attempt-42-cloudinit", "namespace": "ns", "labels": LABELS}
    assert base64.b64decode(secret["data"]["userdata"]).decode() == "#cloud-config\nruncmd: []\n"
    assert core_errors(secret, "V1Secret") == []


def test_owner_reference_points_at_the_vm():
    reference = manifests.owner_reference({"metadata": {"name": "attempt-42", "uid": "u-1"}})
    assert reference == {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "name": "attempt-42",
        "uid": "u-1",
        "blockOwnerDeletion": False,
        "controller": False,
    }
    assert core_errors(reference, "V1OwnerReference") == []


def test_namespace_enforces_the_pod_security_level_launcher_pods_need():
    namespace = manifests.namespace(name="lab-x-1", tenant_id=3)
    assert namespace["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "lab-portal",
        "labs.portal/tenant": "3",
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
    }
    assert core_errors(namespace, "V1Namespace") == []


def test_network_policies_deny_ingress_and_open_only_the_agent_port_to_virt_api():
    deny, agent = manifests.network_policies(
        namespace="ns", tenant_id=3, agent_port=8787, kubevirt_namespace="kubevirt"
    )
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert agent["spec"] == {
        "podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "lab-portal"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubevirt"}},
                        "podSelector": {"matchLabels": {"kubevirt.io": "virt-api"}},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": 8787}],
            }
        ],
    }
    for policy in (deny, agent):
        assert core_errors(policy, "V1NetworkPolicy") == []


def test_network_policy_admits_the_portal_namespace_when_it_runs_in_cluster():
    _deny, agent = manifests.network_policies(
        namespace="ns", tenant_id=3, agent_port=8787, kubevirt_namespace="kubevirt", portal_namespace="portal"
    )
    peers = agent["spec"]["ingress"][0]["from"]
    assert peers[1] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "portal"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "lab-portal"}},
    }
    assert core_errors(agent, "V1NetworkPolicy") == []


def test_resource_quota_uses_launcher_arithmetic_for_cpu_with_the_console_log_sidecar():
    quota = manifests.resource_quota(namespace="ns", tenant_id=3, max_vms=10, max_vcpus=20, max_memory_mib=40960)
    assert quota["spec"]["hard"] == {
        "requests.cpu": "2050m",  # 20 vCPUs / cpuAllocationRatio 10, and 5m per VM for the console log sidecar
        "requests.memory": "40960Mi",
        "count/virtualmachines.kubevirt.io": "10",
    }
    assert quota["metadata"]["name"] == "lab-portal-quota"
    assert core_errors(quota, "V1ResourceQuota") == []


def test_core_validator_catches_unknown_fields():
    assert core_errors({"apiVersion": "v1", "kind": "Secret", "metadata": {"nmae": "x"}}, "V1Secret")


def test_eviction_strategy_is_explicit_and_host_passthrough_vms_are_not_migrated():
    # The cluster default is None unless configured (pkg/virt-config): a lab never depends on it. A drain migrates
    # an ordinary lab VM when it can; a host-passthrough VM cannot live-migrate and is shut down (runStrategy
    # Always then starts it afresh elsewhere, and the portal ends the attempt).
    assert small_vm()["spec"]["template"]["spec"]["evictionStrategy"] == "LiveMigrateIfPossible"
    nested = small_vm(host_passthrough=True)
    assert nested["spec"]["template"]["spec"]["evictionStrategy"] == "None"
