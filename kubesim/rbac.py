"""RBAC as kube-apiserver evaluates it (``plugin/pkg/auth/authorizer/rbac``, ``pkg/apis/rbac/v1/evaluation_helpers.go``,
``pkg/registry/rbac/validation/rule.go``): who is asking, which bindings apply to them, whether a rule allows the
request; and the ``SelfSubjectAccessReview`` answered from the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubesim.errors import ApiError, invalid
from kubesim.faults import rbac_refusal
from kubesim.resources import BY_KEY, BY_KIND, SUBRESOURCE_GROUP
from kubesim.store import Store

RBAC_GROUP = "rbac.authorization.k8s.io"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"


@dataclass(frozen=True)
class User:
    """An authenticated identity: a user name and its groups (``k8s.io/apiserver/pkg/authentication/user.Info``)."""

    name: str
    groups: tuple[str, ...]


def service_account(namespace: str, name: str) -> User:
    """The identity of a service account's token, with the groups the token authenticator adds."""
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
    )


# The admin kubeconfig's user: in system:masters, which kube-apiserver's privileged-groups authorizer lets do anything.
ADMIN = User("kubesim-admin", (MASTERS, AUTHENTICATED))
# The portal's identity in deploy/rbac.yaml.
PORTAL = service_account("lab-portal", "lab-portal")


def impersonate(user: User, name: str, groups: list[str]) -> User:
    """The identity ``Impersonate-User``/``-Group`` ask for (``kubectl --as``), for an admin only here: a service
    account's name brings its groups, and every impersonated user is in system:authenticated."""
    if MASTERS not in user.groups:
        raise ApiError(
            403,
            f'users "{name}" is forbidden: User "{user.name}" cannot impersonate resource "users" in API group "" '
            "at the cluster scope",
        )
    if not groups and name.startswith("system:serviceaccount:"):
        namespace = name.split(":")[2]
        return service_account(namespace, name.split(":", 3)[-1])
    return User(name, (*groups, AUTHENTICATED))


@dataclass(frozen=True)
class Attributes:
    """What a resource request asks (``authorizer.Attributes``); ``resource`` is the plural, without subresource."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def attributes(route: Any) -> Attributes | None:
    """What RBAC is asked about a request (``RequestInfo``), or None for what it does not judge here (discovery and
    the other paths every authenticated user may read, the admin API, unknown resources that answer 404)."""
    if route.kind == "subresource" and route.namespace:
        plural = route.resource.split("/")[0]
        return Attributes(
            route.verb, SUBRESOURCE_GROUP, plural, route.subresource, namespace=route.namespace, name=route.name
        )
    if route.kind != "resource" or route.rt is None:
        return None
    rt = route.rt
    # A request for a namespace object is judged in that namespace, as the API server's RequestInfo sets it.
    namespace = route.name if rt.key == "namespaces" else (route.namespace if rt.namespaced else "")
    return Attributes(route.verb, rt.group, rt.plural, route.subresource, namespace=namespace, name=route.name)


def _has(values: Any, wanted: str) -> bool:
    return "*" in (values or ()) or wanted in (values or ())


def resource_matches(rule: dict[str, Any], resource: str, subresource: str) -> bool:
    """``"*"``, the exact ``resource/subresource``, or ``"*/subresource"``: "pods" does not cover "pods/log"."""
    combined = f"{resource}/{subresource}" if subresource else resource
    for candidate in rule.get("resources") or ():
        if candidate in ("*", combined):
            return True
        if subresource and candidate == f"*/{subresource}":
            return True
    return False


def rule_allows(rule: dict[str, Any], request: Attributes) -> bool:
    """``RuleAllows`` for a resource request. resourceNames narrows to named objects, so it never matches a request
    without a name (a create, a list)."""
    names = rule.get("resourceNames") or ()
    return (
        _has(rule.get("verbs"), request.verb)
        and _has(rule.get("apiGroups"), request.group)
        and resource_matches(rule, request.resource, request.subresource)
        and (not names or request.name in names)
    )


def _applies(user: User, subject: dict[str, Any], binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return user.name == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace  # a RoleBinding's own namespace by default
        return bool(namespace) and user.name == f"system:serviceaccount:{namespace}:{name}"
    return False


def _describe_subject(subject: dict[str, Any], binding_namespace: str) -> str:
    if subject.get("kind") == "ServiceAccount":
        return f'ServiceAccount "{subject.get("name")}/{subject.get("namespace") or binding_namespace}"'
    return f'{subject.get("kind")} "{subject.get("name")}"'


class Authorizer:
    """Decisions from the Roles, ClusterRoles and bindings in the store, read at each request."""

    def __init__(self, store: Store, *, enabled: bool) -> None:
        self.store = store
        self.enabled = enabled

    def _role_rules(self, ref: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
        if ref.get("kind") == "Role" and namespace:
            role = self.store.get("roles", namespace, ref.get("name", ""))
        elif ref.get("kind") == "ClusterRole":
            role = self.store.get("clusterroles", "", ref.get("name", ""))
        else:
            role = None
        return list((role or {}).get("rules") or ())

    def allowed_by(self, user: User, request: Attributes) -> str | None:
        """The binding that allows the request, described as RBAC's reason says it, or None."""
        bindings = [("ClusterRoleBinding", "", b) for b in self.store.objects("clusterrolebindings")]
        if request.namespace:
            bindings += [
                ("RoleBinding", request.namespace, b) for b in self.store.objects("rolebindings", request.namespace)
            ]
        for kind, namespace, binding in bindings:
            subject = next((s for s in binding.get("subjects") or () if _applies(user, s, namespace)), None)
            if subject is None:
                continue
            ref = binding.get("roleRef") or {}
            if any(rule_allows(rule, request) for rule in self._role_rules(ref, namespace)):
                meta = binding["metadata"]
                where = f"{meta['name']}/{namespace}" if namespace else meta["name"]
                return (
                    f'RBAC: allowed by {kind} "{where}" of {ref.get("kind")} "{ref.get("name")}" to '
                    f"{_describe_subject(subject, namespace)}"
                )
        return None

    def decide(self, user: User, request: Attributes) -> tuple[bool, str]:
        """(allowed, reason). With RBAC off every request is allowed (``AlwaysAllow``); system:masters always is."""
        if not self.enabled or MASTERS in user.groups:
            return True, ""
        reason = self.allowed_by(user, request)
        return reason is not None, reason or ""

    def check(self, user: User, request: Attributes) -> None:
        """Raise the API server's 403 when RBAC allows nothing of the request."""
        allowed, _reason = self.decide(user, request)
        if not allowed:
            resource = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
            raise ApiError(
                403,
                rbac_refusal(
                    request.verb,
                    resource,
                    group=request.group,
                    namespace=request.namespace,
                    name=request.name,
                    user=user.name,
                ),
                details={k: v for k, v in (("name", request.name), ("group", request.group)) if v}
                | {"kind": request.resource},
            )

    def review(self, user: User, body: Any) -> dict[str, Any]:
        """A SelfSubjectAccessReview's answer: ``status.allowed`` (and RBAC's reason) for the caller."""
        spec = (body or {}).get("spec") if isinstance(body, dict) else None
        attributes = (spec or {}).get("resourceAttributes")
        non_resource = (spec or {}).get("nonResourceAttributes")
        if bool(attributes) == bool(non_resource):
            raise invalid(
                "SelfSubjectAccessReview",
                "authorization.k8s.io",
                "",
                [
                    {
                        "reason": "FieldValueInvalid",
                        "field": "spec.resourceAttributes",
                        "message": 'Invalid value: "null": exactly one of nonResourceAttributes or '
                        "resourceAttributes must be specified",
                    }
                ],
            )
        if non_resource:
            # kubesim serves only discovery, version, health and OpenAPI paths, which the bootstrap roles
            # system:discovery and system:public-info-viewer grant every authenticated user.
            allowed, reason = True, ""
        else:
            allowed, reason = self.decide(
                user,
                Attributes(
                    verb=str(attributes.get("verb", "")),
                    group=str(attributes.get("group", "")),
                    resource=str(attributes.get("resource", "")),
                    subresource=str(attributes.get("subresource", "")),
                    namespace=str(attributes.get("namespace", "")),
                    name=str(attributes.get("name", "")),
                ),
            )
        status: dict[str, Any] = {"allowed": allowed}
        if reason:
            status["reason"] = reason
        return {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }


# kube-apiserver's bootstrap policy (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go), the parts that
# matter here: cluster-admin for system:masters, and system:basic-user (access reviews of oneself) for everyone.
BOOTSTRAP: tuple[dict[str, Any], ...] = (
    {
        "kind": "ClusterRole",
        "metadata": {"name": "cluster-admin"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}],
    },
    {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "cluster-admin"},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": MASTERS}],
    },
    {
        "kind": "ClusterRole",
        "metadata": {"name": "system:basic-user"},
        "rules": [
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                "verbs": ["create"],
            }
        ],
    },
    {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:basic-user"},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "system:basic-user"},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": AUTHENTICATED}],
    },
)


def manifest_objects(path: str | Path) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML file (``--rbac-manifest``), as ``kubectl apply -f`` reads them."""
    try:
        documents = list(yaml.safe_load_all(Path(path).read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"kubesim: cannot read --rbac-manifest {path}: {exc}") from exc
    return [document for document in documents if isinstance(document, dict) and document.get("kind")]


def load(api: Any, objects: Any) -> None:
    """Create objects as the cluster's bootstrap does (no admission, no RBAC), with any namespace they name."""
    for obj in objects:
        rt = BY_KIND.get(obj.get("kind", ""))
        if rt is None:
            raise SystemExit(f"kubesim: no resource serves kind {obj.get('kind')!r} (in an --rbac-manifest)")
        namespace = (obj.get("metadata") or {}).get("namespace", "") if rt.namespaced else ""
        if rt.namespaced and api.store.get("namespaces", "", namespace) is None:
            api.create(BY_KEY["namespaces"], "", {"metadata": {"name": namespace}}, internal=True)
        if api.store.get(rt.key, namespace, obj["metadata"]["name"]) is None:
            api.create(rt, namespace, obj, internal=True)
