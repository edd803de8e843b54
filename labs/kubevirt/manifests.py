"""Pure builders of what the portal sends to the cluster: an attempt's VirtualMachine and cloud-init Secret, a
tenant's Namespace, NetworkPolicies and ResourceQuota (DESIGN §4). Plain dicts, no I/O: tests compare them with
literals and validate them against KubeVirt's OpenAPI spec."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from labs.kubevirt import names
from labs.sizes import namespace_cpu_millicores

KUBEVIRT_API_VERSION = "kubevirt.io/v1"
# The guest's disk is thrown away with the VM, so a long shutdown protects nothing; a short one frees the
# tenant's quota sooner.
TERMINATION_GRACE_SECONDS = 5
ROOT_DISK = "rootdisk"
CLOUD_INIT_DISK = "cloudinitdisk"
POD_NETWORK = "default"
# KubeVirt's cloudInitNoCloud reads these keys from the Secret named by secretRef.
USER_DATA_KEY = "userdata"


def virtual_machine(
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    image: str,
    vcpus: int,
    memory_mib: int,
    host_passthrough: bool,
    cloud_init_secret: str,
) -> dict[str, Any]:
    """The VirtualMachine of one attempt."""
    if vcpus < 1 or memory_mib < 1:
        raise ValueError("A VM needs at least one vCPU and some memory.")
    if not image.strip():
        raise ValueError("A VM needs a containerDisk image.")
    cpu: dict[str, Any] = {"cores": vcpus, "sockets": 1, "threads": 1}
    if host_passthrough:
        cpu["model"] = "host-passthrough"
    memory = f"{memory_mib}Mi"
    return {
        "apiVersion": KUBEVIRT_API_VERSION,
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "runStrategy": "Always",
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    # Explicit, not the cluster's default (None unless configured): a drain migrates the VM when
                    # it can; a host-passthrough CPU cannot live-migrate, so such a VM is shut down instead.
                    "evictionStrategy": "None" if host_passthrough else "LiveMigrateIfPossible",
                    "domain": {
                        "cpu": cpu,
                        "memory": {"guest": memory},
                        "resources": {"requests": {"memory": memory}},
                        "devices": {
                            "disks": [
                                {"name": ROOT_DISK, "disk": {"bus": "virtio"}},
                                {"name": CLOUD_INIT_DISK, "disk": {"bus": "virtio"}},
                            ],
                            "interfaces": [{"name": POD_NETWORK, "masquerade": {}}],
                            "rng": {},
                        },
                    },
                    "networks": [{"name": POD_NETWORK, "pod": {}}],
                    "volumes": [
                        {"name": ROOT_DISK, "containerDisk": {"image": image}},
                        {"name": CLOUD_INIT_DISK, "cloudInitNoCloud": {"secretRef": {"name": cloud_init_secret}}},
                    ],
                },
            },
        },
    }


def cloud_init_secret(*, name: str, namespace: str, labels: Mapping[str, str], user_data: str) -> dict[str, Any]:
    """The Secret carrying the VM's cloud-init user data (with the agent token)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "type": "Opaque",
        "data": {USER_DATA_KEY: base64.b64encode(user_data.encode("utf-8")).decode("ascii")},
    }


def owner_reference(vm: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to a VM as the API server returned it, so deleting the VM garbage-collects the Secret."""
    metadata = vm["metadata"]
    return {
        "apiVersion": KUBEVIRT_API_VERSION,
        "kind": "VirtualMachine",
        "name": metadata["name"],
        "uid": metadata["uid"],
        "blockOwnerDeletion": False,
        "controller": False,
    }


def namespace(*, name: str, tenant_id: int) -> dict[str, Any]:
    """A tenant's namespace, enforcing Pod Security ``privileged`` as KubeVirt's functional tests label theirs
    (``restricted`` refuses virt-launcher pods, see ``preflight``); audit and warn at ``restricted`` show operators
    what would tighten it."""
    labels = names.namespace_labels(tenant_id=tenant_id) | {
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
    }
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def network_policies(
    *,
    namespace: str,
    tenant_id: int,
    agent_port: int,
    kubevirt_namespace: str,
    portal_namespace: str | None = None,
) -> list[dict[str, Any]]:
    """Default-deny ingress for the namespace, and one opening: the agent's port, from virt-api (which dials the VMI
    for the ``portforward`` subresource) and the portal's own pods. Egress stays open: guests install packages."""

    def peer(pod_namespace: str, pod_labels: dict[str, str]) -> dict[str, Any]:
        namespace_labels = {"kubernetes.io/metadata.name": pod_namespace}
        return {"namespaceSelector": {"matchLabels": namespace_labels}, "podSelector": {"matchLabels": pod_labels}}

    def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        metadata = {"name": name, "namespace": namespace, "labels": names.namespace_labels(tenant_id=tenant_id)}
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata, "spec": spec}

    peers = [peer(kubevirt_namespace, {"kubevirt.io": "virt-api"})]
    if portal_namespace:
        peers.append(peer(portal_namespace, {"app.kubernetes.io/name": names.MANAGED_BY}))
    agent = {
        "podSelector": {"matchLabels": {names.MANAGED_BY_LABEL: names.MANAGED_BY}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": agent_port}]}],
    }
    return [
        policy(names.DEFAULT_DENY_POLICY, {"podSelector": {}, "policyTypes": ["Ingress"]}),
        policy(names.AGENT_POLICY, agent),
    ]


def quota_hard(*, max_vms: int, max_vcpus: int, max_memory_mib: int) -> dict[str, str]:
    """The namespace's hard limits: those the portal admits attempts against, as virt-launcher pods request them."""
    cpu_millicores = namespace_cpu_millicores(max_vcpus=max_vcpus, max_vms=max_vms)
    return {
        "requests.cpu": f"{cpu_millicores}m",
        "requests.memory": f"{max_memory_mib}Mi",
        "count/virtualmachines.kubevirt.io": str(max_vms),
    }


def resource_quota(
    *, namespace: str, tenant_id: int, max_vms: int, max_vcpus: int, max_memory_mib: int
) -> dict[str, Any]:
    """The cluster's backstop for the tenant's quotas, should the portal's own accounting ever be bypassed."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": names.RESOURCE_QUOTA,
            "namespace": namespace,
            "labels": names.namespace_labels(tenant_id=tenant_id),
        },
        "spec": {"hard": quota_hard(max_vms=max_vms, max_vcpus=max_vcpus, max_memory_mib=max_memory_mib)},
    }
