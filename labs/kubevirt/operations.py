"""The lifecycle's calls to the cluster API, each safe to repeat: "already exists" on create and "not found" on
delete are the success they mean, which keeps the Celery tasks idempotent. Lists carry the portal's label
selector; other failures raise ``ClusterError`` (``calls``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from labs.kubevirt import client, names
from labs.kubevirt.calls import REQUEST_TIMEOUT, ClusterError, api_call, cluster_error, has_status, raw_json

# Callers catch ``operations.ClusterError``; the call helpers live in ``calls``.
__all__ = [
    "REQUEST_TIMEOUT",
    "ClusterError",
    "cluster_error",
    "events_for",
    "namespace_bootstrap",
    "secret_create",
    "secret_delete",
    "secret_set_owner",
    "secrets_list",
    "vm_create",
    "vm_delete",
    "vm_get",
    "vmis_list",
    "vms_list",
]

logger = logging.getLogger(__name__)

# Every write asks the API server to refuse unknown fields (400) rather than drop them with a warning, its default:
# a misspelt or newer-than-the-cluster field in what the portal sends is a bug to see, not a setting silently lost.
STRICT = "Strict"
VMS = "virtualmachines"
VMIS = "virtualmachineinstances"


def _kubevirt(function_name: str) -> Any:
    return getattr(client.custom_objects(), function_name)


# ---- VirtualMachines and their instances ---------------------------------------------------------------------


def vm_create(body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create a VM; returns (the VM, created). A VM of that name already there is returned as it is."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        response = _kubevirt("create_namespaced_custom_object")(
            client.KUBEVIRT_GROUP,
            client.KUBEVIRT_VERSION,
            namespace,
            VMS,
            dict(body),
            field_validation=STRICT,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        return raw_json(response), True
    except Exception as exc:
        if not has_status(exc, 409):
            raise cluster_error(exc, doing=f"creating VM {namespace}/{name}") from exc
    existing = vm_get(namespace=namespace, name=name)
    if existing is None:  # deleted between our create and get: let the caller's retry create it again
        raise ClusterError(f"VM {namespace}/{name} disappeared while being created", transient=True)
    return existing, False


def vm_get(*, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        response = _kubevirt("get_namespaced_custom_object")(
            client.KUBEVIRT_GROUP,
            client.KUBEVIRT_VERSION,
            namespace,
            VMS,
            name,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        return raw_json(response)
    except Exception as exc:
        if has_status(exc, 404):
            return None
        raise cluster_error(exc, doing=f"reading VM {namespace}/{name}") from exc


def vm_delete(*, namespace: str, name: str) -> bool:
    """Delete a VM (its VMI, launcher pod and, by ownerReference, its Secret follow). False if already gone."""
    try:
        _kubevirt("delete_namespaced_custom_object")(
            client.KUBEVIRT_GROUP,
            client.KUBEVIRT_VERSION,
            namespace,
            VMS,
            name,
            body={"propagationPolicy": "Foreground"},
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        return True
    except Exception as exc:
        if has_status(exc, 404):
            return False
        raise cluster_error(exc, doing=f"deleting VM {namespace}/{name}") from exc


def vm_label(*, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
    """Add ``labels`` to a VM, its VMI template (so a restarted VMI carries them) and its running VMI, in two merge
    patches (labels not named are kept). False when the VM is gone."""
    vm_patch = {"metadata": {"labels": dict(labels)}, "spec": {"template": {"metadata": {"labels": dict(labels)}}}}
    vmi_patch = {"metadata": {"labels": dict(labels)}}
    for plural, patch in ((VMS, vm_patch), (VMIS, vmi_patch)):
        try:
            _kubevirt("patch_namespaced_custom_object")(
                client.KUBEVIRT_GROUP,
                client.KUBEVIRT_VERSION,
                namespace,
                plural,
                name,
                patch,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except Exception as exc:
            if has_status(exc, 404):
                return False
            raise cluster_error(exc, doing=f"labelling {plural} {namespace}/{name}") from exc
    return True


def _list_kubevirt(plural: str, namespace: str) -> list[dict[str, Any]]:
    payload = api_call(
        f"listing {plural} in {namespace}",
        _kubevirt("list_namespaced_custom_object"),
        client.KUBEVIRT_GROUP,
        client.KUBEVIRT_VERSION,
        namespace,
        plural,
        label_selector=names.MANAGED_SELECTOR,
    )
    return list(payload.get("items") or [])


def vmis_list(*, namespace: str) -> list[dict[str, Any]]:
    """The portal's VMIs in a namespace: one request, whatever the number of attempts."""
    return _list_kubevirt(VMIS, namespace)


def vms_list(*, namespace: str) -> list[dict[str, Any]]:
    """The portal's VMs in a namespace (label-selected: never anyone else's), metadata only: the sweep reads names,
    labels and deletion marks, and ``vm_get`` reads the one VM whose status it wants."""
    payload = api_call(
        f"listing {VMS} in {namespace}",
        client.metadata_custom_objects().list_namespaced_custom_object,
        client.KUBEVIRT_GROUP,
        client.KUBEVIRT_VERSION,
        namespace,
        VMS,
        label_selector=names.MANAGED_SELECTOR,
    )
    return list(payload.get("items") or [])


# ---- Secrets ---------------------------------------------------------------------------------------------------


def secret_create(body: Mapping[str, Any]) -> bool:
    """Create the Secret; False when one of that name exists already (its content is the same attempt's)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        client.core_v1().create_namespaced_secret(
            namespace, dict(body), field_validation=STRICT, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
        return True
    except Exception as exc:
        if has_status(exc, 409):
            return False
        raise cluster_error(exc, doing=f"creating Secret {namespace}/{name}") from exc


def secret_set_owner(*, namespace: str, name: str, owner: Mapping[str, Any]) -> None:
    """Make the VM own its Secret, so the Secret goes when the VM goes, whoever deletes it."""
    patch = [{"op": "add", "path": "/metadata/ownerReferences", "value": [dict(owner)]}]
    try:
        client.core_v1().patch_namespaced_secret(
            name, namespace, patch, field_validation=STRICT, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
    except Exception as exc:
        if has_status(exc, 404):  # the VM was deleted and took the Secret with it already
            return
        raise cluster_error(exc, doing=f"setting the owner of Secret {namespace}/{name}") from exc


def secret_delete(*, namespace: str, name: str) -> bool:
    try:
        client.core_v1().delete_namespaced_secret(
            name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
        return True
    except Exception as exc:
        if has_status(exc, 404):
            return False
        raise cluster_error(exc, doing=f"deleting Secret {namespace}/{name}") from exc


def secrets_list(*, namespace: str) -> list[dict[str, Any]]:
    """The portal's Secrets in a namespace, metadata only: each holds a VM's whole cloud-init (the lab agent
    included, about 50 KB), and the sweep reads names and labels. 200 of them were 10 MB per list."""
    payload = api_call(
        f"listing Secrets in {namespace}",
        client.metadata_core_v1().list_namespaced_secret,
        namespace,
        label_selector=names.MANAGED_SELECTOR,
    )
    return list(payload.get("items") or [])


# ---- Namespaces ------------------------------------------------------------------------------------------------


def namespace_bootstrap(
    *, namespace: Mapping[str, Any], policies: Sequence[Mapping[str, Any]], quota: Mapping[str, Any]
) -> None:
    """Create the tenant's namespace, its NetworkPolicies and its ResourceQuota; bring the quota's limits up to
    date when it exists. Existing objects are left as they are otherwise (an operator may have added to them)."""
    name = namespace["metadata"]["name"]
    core = client.core_v1()
    try:
        core.create_namespace(
            dict(namespace), field_validation=STRICT, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
    except Exception as exc:
        if not has_status(exc, 409):
            raise cluster_error(exc, doing=f"creating namespace {name}") from exc
    networking = client.networking_v1()
    for policy in policies:
        try:
            networking.create_namespaced_network_policy(
                name, dict(policy), field_validation=STRICT, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:
            if not has_status(exc, 409):
                raise cluster_error(exc, doing=f"creating NetworkPolicy {name}/{policy['metadata']['name']}") from exc
    try:
        core.create_namespaced_resource_quota(
            name, dict(quota), field_validation=STRICT, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
    except Exception as exc:
        if not has_status(exc, 409):
            raise cluster_error(exc, doing=f"creating ResourceQuota {name}/{quota['metadata']['name']}") from exc
        patch = [{"op": "replace", "path": "/spec/hard", "value": dict(quota["spec"]["hard"])}]
        try:
            core.patch_namespaced_resource_quota(
                quota["metadata"]["name"],
                name,
                patch,
                field_validation=STRICT,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except Exception as patch_exc:
            raise cluster_error(patch_exc, doing=f"updating ResourceQuota {name}") from patch_exc


# ---- Events ----------------------------------------------------------------------------------------------------


def events_for(*, namespace: str, name: str) -> list[dict[str, Any]]:
    """Events about the objects named ``name`` in the namespace (the VM and the VMI share the attempt's name)."""
    payload = api_call(
        f"listing events for {namespace}/{name}",
        client.core_v1().list_namespaced_event,
        namespace,
        field_selector=f"involvedObject.name={name}",
    )
    return list(payload.get("items") or [])


def node_cordoned(name: str) -> bool:
    """Whether the node is cordoned (``spec.unschedulable``: a drain under way or done); False for a node gone."""
    try:
        node = api_call(f"reading node {name}", client.core_v1().read_node, name)
    except ClusterError as error:
        if error.status == 404:
            return False
        raise
    return bool((node.get("spec") or {}).get("unschedulable"))
