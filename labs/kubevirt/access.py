"""Whether the cluster lets the portal manage a tenant namespace's objects, asked as the API server answers it: a
SelfSubjectAccessReview per object provisioning creates there (the tenant's Role grants them all together)."""

from __future__ import annotations

import kubernetes

from labs.kubevirt import client
from labs.kubevirt.calls import RBAC_HINT, api_call, cluster_error

# What every attempt creates in its tenant's namespace (operations.secret_create, then vm_create).
PROVISIONING_NEEDS = (("create", "kubevirt.io", "virtualmachines"), ("create", "", "secrets"))

# How a refusal found by review begins, in the namespace's recorded error (next to RBAC's own 403 text).
REVIEW_REFUSAL = "SelfSubjectAccessReview: the cluster does not allow the portal to "


def refusal(namespace: str) -> str | None:
    """None when the portal may create what provisioning needs in ``namespace``; otherwise what to record and show,
    with what to apply. Raises ``ClusterError`` when the cluster cannot answer."""
    try:
        api = kubernetes.client.AuthorizationV1Api(client.api_client())
    except client.ClusterNotConfigured as exc:
        raise cluster_error(exc, doing=f"reviewing access in {namespace}") from exc
    for verb, group, resource in PROVISIONING_NEEDS:
        attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": resource}
        answer = api_call(
            f"reviewing access to {resource} in {namespace}",
            api,
            "create_self_subject_access_review",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes},
            },
        )
        status = answer.get("status") or {}
        if not status.get("allowed"):
            qualified = f"{resource}.{group}" if group else resource
            reason = f" ({status['reason']})" if status.get("reason") else ""
            return f'{REVIEW_REFUSAL}{verb} {qualified} in the namespace "{namespace}"{reason}{RBAC_HINT}'
    return None
