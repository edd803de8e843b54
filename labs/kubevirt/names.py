"""Server-generated names and labels for everything the portal creates on the cluster: from database ids only, never
user text, so they are valid DNS-1123 labels and a retried provisioning finds the VM it already made."""

from __future__ import annotations

from collections.abc import Mapping

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "lab-portal"
TENANT_LABEL = "labs.portal/tenant"
COURSE_LABEL = "labs.portal/course"
LAB_LABEL = "labs.portal/lab"
ATTEMPT_LABEL = "labs.portal/attempt"
# A warm pool's VM carries this (its PoolVm id) from creation on; the claim adds ATTEMPT_LABEL beside it.
POOL_VM_LABEL = "labs.portal/pool-vm"

# The only selector the portal lists or deletes with: nothing without this label is ever touched.
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

VM_PREFIX = "attempt-"
POOL_VM_PREFIX = "pool-"

DEFAULT_DENY_POLICY = "lab-portal-default-deny-ingress"
AGENT_POLICY = "lab-portal-allow-agent"
RESOURCE_QUOTA = "lab-portal-quota"


def _name(prefix: str, object_id: int) -> str:
    if not isinstance(object_id, int) or isinstance(object_id, bool) or object_id <= 0:
        raise ValueError(f"An id is a positive integer, not {object_id!r}.")
    return f"{prefix}{object_id}"


def _id(text: str) -> int | None:
    """A positive id written without leading zeros; None for anything else."""
    return int(text) if text.isascii() and text.isdigit() and not text.startswith("0") else None


def _id_from_name(prefix: str, name: str) -> int | None:
    return _id(name.removeprefix(prefix)) if name.startswith(prefix) else None


def _labels(*, tenant_id: int, course_id: int, lab_id: int, own: tuple[str, int]) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: MANAGED_BY,
        TENANT_LABEL: str(tenant_id),
        COURSE_LABEL: str(course_id),
        LAB_LABEL: str(lab_id),
        own[0]: str(own[1]),
    }


def _id_from_labels(labels: Mapping[str, str] | None, key: str) -> int | None:
    """The id an object of ours carries under ``key``; None when it is not ours or the label is malformed."""
    if not labels or labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
        return None
    return _id(labels.get(key, ""))


def vm_name(attempt_id: int) -> str:
    """The VirtualMachine (and VMI) name of an attempt: ``attempt-<id>``."""
    return _name(VM_PREFIX, attempt_id)


def cloud_init_secret_name(vm: str) -> str:
    """The Secret holding the VM's cloud-init user data (and so the agent token)."""
    return f"{vm}-cloudinit"


def attempt_id_from_vm_name(name: str) -> int | None:
    return _id_from_name(VM_PREFIX, name)


def attempt_labels(*, tenant_id: int, course_id: int, lab_id: int, attempt_id: int) -> dict[str, str]:
    """Labels on the VM, its VMI template (so VMIs and virt-launcher pods carry them) and its Secret."""
    return _labels(tenant_id=tenant_id, course_id=course_id, lab_id=lab_id, own=(ATTEMPT_LABEL, attempt_id))


def attempt_id_from_labels(labels: Mapping[str, str] | None) -> int | None:
    return _id_from_labels(labels, ATTEMPT_LABEL)


def pool_vm_name(pool_vm_id: int) -> str:
    """The VM name of a warm pool's VM: ``pool-<id>``; it keeps it when an attempt claims it."""
    return _name(POOL_VM_PREFIX, pool_vm_id)


def pool_vm_id_from_vm_name(name: str) -> int | None:
    return _id_from_name(POOL_VM_PREFIX, name)


def pool_vm_labels(*, tenant_id: int, course_id: int, lab_id: int, pool_vm_id: int) -> dict[str, str]:
    """Labels of an unclaimed pool VM: the lab's (NetworkPolicy and quota see it as the lab's), no attempt's yet."""
    return _labels(tenant_id=tenant_id, course_id=course_id, lab_id=lab_id, own=(POOL_VM_LABEL, pool_vm_id))


def pool_vm_id_from_labels(labels: Mapping[str, str] | None) -> int | None:
    return _id_from_labels(labels, POOL_VM_LABEL)


def namespace_labels(*, tenant_id: int) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGED_BY, TENANT_LABEL: str(tenant_id)}
