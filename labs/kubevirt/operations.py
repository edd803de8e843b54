"""The portal's calls to the cluster API, each safe to repeat: "already exists" on create and "not found" on delete
are the success they mean, which keeps the Celery tasks idempotent. Lists carry the portal's label selector; other
failures raise ``ClusterError`` (``transient`` for 5xx, 429, a quota an old VM still holds, the connection failing)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kubernetes
import orjson
import urllib3
from kubernetes.client.exceptions import ApiException

from labs.kubevirt import client, names, status

logger = logging.getLogger(__name__)

# (connect, read) seconds for ordinary requests.
REQUEST_TIMEOUT = (5, 20)
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
# Celery redelivers a task whose countdown outlasts the broker's visibility timeout, so a Retry-After is capped.
MAX_RETRY_AFTER_SECONDS = 60.0
# RBAC's refusal in a tenant namespace means its Role is not applied yet: the portal holds no RBAC rights to fix
# that, so the message says what to apply.
RBAC_SIGNATURE = 'is forbidden: User "'
RBAC_HINT = (
    " (the portal's Role is not applied in this namespace: a cluster admin applies the tenant's manifests, "
    'python manage.py tenant_manifests "<tenant name>" | kubectl apply -f -)'
)
# How a refusal found by review begins, in the namespace's recorded error (next to RBAC's own 403 text).
REVIEW_REFUSAL = "SelfSubjectAccessReview: the cluster does not allow the portal to "
# Writes ask the API server to refuse unknown fields (400) rather than drop them: a misspelt field is a bug to see.
STRICT = "Strict"
VMS = "virtualmachines"
VMIS = "virtualmachineinstances"


class ClusterError(Exception):
    """The cluster refused or failed a request. ``transient`` errors are retried with backoff."""

    def __init__(
        self, message: str, *, status: int | None = None, transient: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.transient = transient
        self.retry_after = retry_after


def _count_error(*, doing: str, reason: str) -> None:
    """Count the failure for /metrics by the first two words of ``doing`` ("creating VM"), never the object's name."""
    from portal.metrics import record_cluster_api_error

    record_cluster_api_error(operation="_".join(doing.split()[:2]).lower(), reason=reason)


def cluster_error(exc: BaseException, *, doing: str) -> ClusterError:
    """The portal's view of a failed request: what was being done, what the cluster said, retry or not."""
    if isinstance(exc, ApiException):
        try:
            body = json.loads(exc.body) if exc.body else {}
        except (TypeError, ValueError):
            body = {}
        has_message = isinstance(body, dict) and body.get("message")
        message = str(body["message"]) if has_message else f"{exc.status} {exc.reason}".strip()
        code = exc.status or None
        # A ResourceQuota refusal (403 "exceeded quota") while a stopped VM is still terminating clears by itself.
        quota = code == 403 and "exceeded quota" in message
        if code == 403 and RBAC_SIGNATURE in message:
            message += RBAC_HINT
        try:
            retry_after = min(max(float((exc.headers or {})["Retry-After"]), 0.0), MAX_RETRY_AFTER_SECONDS)
        except (KeyError, ValueError):
            retry_after = None
        transient = code in TRANSIENT_STATUSES or code is None or quota
        _count_error(doing=doing, reason=str(code or "unknown"))
        return ClusterError(f"{doing}: {message}", status=code, transient=transient, retry_after=retry_after)
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError, TimeoutError)):
        _count_error(doing=doing, reason="connection")
        return ClusterError(f"{doing}: cannot reach the cluster API ({exc.__class__.__name__}: {exc})", transient=True)
    if isinstance(exc, client.ClusterNotConfigured):
        return ClusterError(f"{doing}: {exc}", transient=False)
    raise exc


def api_call(doing: str, api: Any, method: str, *args: Any, tolerate: int | None = None, **kwargs: Any) -> Any:
    """``api.<method>(...)``'s JSON answer; None when the cluster answers ``tolerate`` (409 or 404, when repeated)."""
    try:
        response = getattr(api, method)(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
    except Exception as exc:
        if tolerate is not None and isinstance(exc, ApiException) and exc.status == tolerate:
            return None
        raise cluster_error(exc, doing=doing) from exc
    return orjson.loads(response.data) if response.data else {}


def _kubevirt(doing: str, method: str, *args: Any, metadata: bool = False, **kwargs: Any) -> Any:
    """A call of the custom objects API on KubeVirt's group (``metadata``: asking for metadata only)."""
    api = kubernetes.client.CustomObjectsApi(client.metadata_api_client()) if metadata else client.custom_objects()
    return api_call(doing, api, method, client.KUBEVIRT_GROUP, client.KUBEVIRT_VERSION, *args, **kwargs)


def _core(doing: str, method: str, *args: Any, metadata: bool = False, **kwargs: Any) -> Any:
    api = kubernetes.client.CoreV1Api(client.metadata_api_client()) if metadata else client.core_v1()
    return api_call(doing, api, method, *args, **kwargs)


def vm_create(body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create a VM; returns (the VM, created). A VM of that name already there is returned as it is."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    doing = f"creating VM {namespace}/{name}"
    created = _kubevirt(
        doing, "create_namespaced_custom_object", namespace, VMS, dict(body), field_validation=STRICT, tolerate=409
    )
    if created is not None:
        return created, True
    existing = vm_get(namespace=namespace, name=name)
    if existing is None:  # deleted between our create and get: let the caller's retry create it again
        raise ClusterError(f"VM {namespace}/{name} disappeared while being created", transient=True)
    return existing, False


def vm_get(*, namespace: str, name: str) -> dict[str, Any] | None:
    doing = f"reading VM {namespace}/{name}"
    return _kubevirt(doing, "get_namespaced_custom_object", namespace, VMS, name, tolerate=404)


def vm_delete(*, namespace: str, name: str) -> bool:
    """Delete a VM (its VMI, launcher pod and, by ownerReference, its Secret follow). False if already gone."""
    doing = f"deleting VM {namespace}/{name}"
    body = {"propagationPolicy": "Foreground"}
    return (
        _kubevirt(doing, "delete_namespaced_custom_object", namespace, VMS, name, body=body, tolerate=404) is not None
    )


def vm_and_secret_delete(*, namespace: str, name: str) -> bool:
    """Delete a VM and its cloud-init Secret (which its ownerReference may not name yet); False if the VM was gone."""
    existed = vm_delete(namespace=namespace, name=name)
    secret_delete(namespace=namespace, name=names.cloud_init_secret_name(name))
    return existed


def vm_label(*, namespace: str, name: str, labels: Mapping[str, str]) -> dict[str, Any] | None:
    """Merge ``labels`` into a VM, its VMI template (for a restarted VMI) and its VMI; the VMI as patched, or None if
    the VM or its VMI is gone."""
    vm_patch = {"metadata": {"labels": dict(labels)}, "spec": {"template": {"metadata": {"labels": dict(labels)}}}}
    vmi_patch = {"metadata": {"labels": dict(labels)}}
    patched = None
    for plural, patch in ((VMS, vm_patch), (VMIS, vmi_patch)):
        doing = f"labelling {plural} {namespace}/{name}"
        patched = _kubevirt(doing, "patch_namespaced_custom_object", namespace, plural, name, patch, tolerate=404)
        if patched is None:
            return None
    return patched


def vmis_list(*, namespace: str) -> list[dict[str, Any]]:
    """The portal's VMIs in a namespace: one request, whatever the number of attempts."""
    return _kubevirt_list(namespace, VMIS)


def vms_list(*, namespace: str) -> list[dict[str, Any]]:
    """The portal's VMs in a namespace, metadata only: the sweep reads names, labels and deletion marks."""
    return _kubevirt_list(namespace, VMS, metadata=True)


def _kubevirt_list(namespace: str, plural: str, *, metadata: bool = False) -> list[dict[str, Any]]:
    doing = f"listing {plural} in {namespace}"
    method = "list_namespaced_custom_object"
    payload = _kubevirt(doing, method, namespace, plural, label_selector=names.MANAGED_SELECTOR, metadata=metadata)
    return list(payload.get("items") or [])


def secret_create(body: Mapping[str, Any]) -> bool:
    """Create the Secret; False when one of that name exists already (its content is the same attempt's)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    doing = f"creating Secret {namespace}/{name}"
    created = _core(doing, "create_namespaced_secret", namespace, dict(body), field_validation=STRICT, tolerate=409)
    return created is not None


def secret_set_owner(*, namespace: str, name: str, owner: Mapping[str, Any]) -> None:
    """Make the VM own its Secret, so the Secret goes when the VM goes, whoever deletes it (404: it went already)."""
    patch = [{"op": "add", "path": "/metadata/ownerReferences", "value": [dict(owner)]}]
    doing = f"setting the owner of Secret {namespace}/{name}"
    _core(doing, "patch_namespaced_secret", name, namespace, patch, field_validation=STRICT, tolerate=404)


def secret_delete(*, namespace: str, name: str) -> bool:
    doing = f"deleting Secret {namespace}/{name}"
    return _core(doing, "delete_namespaced_secret", name, namespace, tolerate=404) is not None


def secrets_list(*, namespace: str) -> list[dict[str, Any]]:
    """The portal's Secrets in a namespace, metadata only: each holds a VM's whole cloud-init (about 50 KB)."""
    doing = f"listing Secrets in {namespace}"
    payload = _core(doing, "list_namespaced_secret", namespace, label_selector=names.MANAGED_SELECTOR, metadata=True)
    return list(payload.get("items") or [])


def namespace_bootstrap(
    *, namespace: Mapping[str, Any], policies: Sequence[Mapping[str, Any]], quota: Mapping[str, Any]
) -> None:
    """Create the tenant's namespace, NetworkPolicies and ResourceQuota; an operator may have added to those already
    there, so only the quota's limits are brought up to date."""
    name = namespace["metadata"]["name"]
    _core(f"creating namespace {name}", "create_namespace", dict(namespace), field_validation=STRICT, tolerate=409)
    networking = client.networking_v1()
    for policy in policies:
        doing = f"creating NetworkPolicy {name}/{policy['metadata']['name']}"
        create = "create_namespaced_network_policy"
        api_call(doing, networking, create, name, dict(policy), field_validation=STRICT, tolerate=409)
    quota_name = quota["metadata"]["name"]
    doing, create = f"creating ResourceQuota {name}/{quota_name}", "create_namespaced_resource_quota"
    if _core(doing, create, name, dict(quota), field_validation=STRICT, tolerate=409) is None:
        patch = [{"op": "replace", "path": "/spec/hard", "value": dict(quota["spec"]["hard"])}]
        doing = f"updating ResourceQuota {name}"
        _core(doing, "patch_namespaced_resource_quota", quota_name, name, patch, field_validation=STRICT)


def events_said(*, namespace: str, name: str) -> str:
    """The latest Warning events about the VM and VMI named ``name``, '' when the cluster cannot say: KubeVirt v1.9
    writes no ``status.reason`` for a failed launcher or guest."""
    doing = f"listing events for {namespace}/{name}"
    try:
        payload = _core(doing, "list_namespaced_event", namespace, field_selector=f"involvedObject.name={name}")
    except ClusterError as error:
        logger.info("events of %s/%s unavailable: %s", namespace, name, error.message)
        return ""
    return status.events_problem(payload.get("items") or [])


def failed_vmi_words(vmi: Mapping[str, Any]) -> Callable[[], str]:
    """A function giving the Failed VMI's reason in the active language (pure: call it under each language)."""
    metadata = vmi.get("metadata") or {}
    explained = status.failure_words(vmi)
    said = "" if explained else events_said(namespace=metadata.get("namespace", ""), name=metadata.get("name", ""))
    return lambda: status.failed_problem(vmi, said)


def node_cordoned(name: str) -> bool:
    """Whether the node is cordoned (``spec.unschedulable``: a drain under way or done); False for a node gone."""
    node = _core(f"reading node {name}", "read_node", name, tolerate=404)
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))


def access_refusal(namespace: str) -> str | None:
    """Why the portal may not create what provisioning needs in ``namespace``, with what to apply; None if it may."""
    try:
        api = kubernetes.client.AuthorizationV1Api(client.api_client())
    except client.ClusterNotConfigured as exc:
        raise cluster_error(exc, doing=f"reviewing access in {namespace}") from exc
    # What every attempt creates in its tenant's namespace (secret_create, then vm_create).
    for verb, group, resource in (("create", "kubevirt.io", "virtualmachines"), ("create", "", "secrets")):
        spec = {"resourceAttributes": {"namespace": namespace, "verb": verb, "group": group, "resource": resource}}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": spec}
        doing = f"reviewing access to {resource} in {namespace}"
        review = api_call(doing, api, "create_self_subject_access_review", body).get("status") or {}
        if not review.get("allowed"):
            qualified = f"{resource}.{group}" if group else resource
            reason = f" ({review['reason']})" if review.get("reason") else ""
            return f'{REVIEW_REFUSAL}{verb} {qualified} in the namespace "{namespace}"{reason}{RBAC_HINT}'
    return None
