"""RBAC as the API server evaluates it: rule matching (wildcards, subresources, resourceNames), which bindings apply
to whom, the refusal's exact text, SelfSubjectAccessReview answers, and kubectl applying a tenant's Role."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubesim import rbac
from kubesim.apiserver import ApiServer
from kubesim.faults import rbac_refusal
from kubesim.resources import BY_KEY
from kubesim.store import Store
from kubesim.testing import KubesimServer
from kubesim.tests.support import GROUP, VERSION, vm_manifest

REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl") or "kubectl"
PORTAL = rbac.PORTAL


def _ask(verb: str, resource: str, *, group: str = "", sub: str = "", namespace: str = "ns", name: str = ""):
    return rbac.Attributes(verb, group, resource, sub, namespace=namespace, name=name)


# ---- rules -------------------------------------------------------------------------------------------------------
def test_a_rule_matches_verbs_groups_and_resources_exactly_or_by_wildcard():
    rule = {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"], "verbs": ["create", "get"]}
    assert rbac.rule_allows(rule, _ask("create", "virtualmachines", group="kubevirt.io"))
    assert not rbac.rule_allows(rule, _ask("delete", "virtualmachines", group="kubevirt.io"))
    assert not rbac.rule_allows(rule, _ask("create", "virtualmachines", group=""))
    assert not rbac.rule_allows(rule, _ask("create", "virtualmachineinstances", group="kubevirt.io"))
    everything = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
    assert rbac.rule_allows(everything, _ask("deletecollection", "secrets"))
    assert rbac.rule_allows(everything, _ask("get", "virtualmachineinstances", group="x", sub="console"))


def test_a_resource_does_not_cover_its_subresources_but_star_slash_does():
    plain = {"apiGroups": ["subresources.kubevirt.io"], "resources": ["virtualmachineinstances"], "verbs": ["get"]}
    console = _ask("get", "virtualmachineinstances", group="subresources.kubevirt.io", sub="console")
    assert not rbac.rule_allows(plain, console)
    assert rbac.rule_allows({**plain, "resources": ["virtualmachineinstances/console"]}, console)
    assert rbac.rule_allows({**plain, "resources": ["*/console"]}, console)
    assert not rbac.rule_allows({**plain, "resources": ["*/vnc"]}, console)
    assert not rbac.rule_allows({**plain, "resources": ["*/console"]}, _ask("get", "virtualmachineinstances"))


def test_resource_names_narrow_to_named_requests_so_never_a_create_or_a_list():
    rule = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "list"], "resourceNames": ["a"]}
    assert rbac.rule_allows(rule, _ask("get", "secrets", name="a"))
    assert not rbac.rule_allows(rule, _ask("get", "secrets", name="b"))
    assert not rbac.rule_allows(rule, _ask("create", "secrets"))
    assert not rbac.rule_allows(rule, _ask("list", "secrets"))


# ---- bindings ----------------------------------------------------------------------------------------------------
@pytest.fixture
def authorizer():
    api = ApiServer(Store())
    for namespace in ("ns", "other"):
        api.create(BY_KEY["namespaces"], "", {"metadata": {"name": namespace}}, internal=True)
    rbac.load(api, rbac.BOOTSTRAP)
    return api, rbac.Authorizer(api.store, enabled=True)


def _binding(kind: str, name: str, role_kind: str, role: str, subjects: list, namespace: str = "") -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"kind": kind, "metadata": meta, "roleRef": {"kind": role_kind, "name": role}, "subjects": subjects}


def test_a_role_binding_grants_in_its_namespace_only_and_a_service_account_defaults_to_it(authorizer):
    api, authz = authorizer
    rules = [{"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"], "verbs": ["create"]}]
    rbac.load(api, [{"kind": "Role", "metadata": {"name": "r", "namespace": "ns"}, "rules": rules}])
    create_vm = _ask("create", "virtualmachines", group="kubevirt.io")
    assert authz.decide(PORTAL, create_vm) == (False, "")
    # A ServiceAccount subject without a namespace means the binding's own: not lab-portal's account here.
    rbac.load(
        api, [_binding("RoleBinding", "b1", "Role", "r", [{"kind": "ServiceAccount", "name": "lab-portal"}], "ns")]
    )
    assert not authz.decide(PORTAL, create_vm)[0]
    subject = {"kind": "ServiceAccount", "name": "lab-portal", "namespace": "lab-portal"}
    rbac.load(api, [_binding("RoleBinding", "b2", "Role", "r", [subject], "ns")])
    assert authz.decide(PORTAL, create_vm) == (
        True,
        'RBAC: allowed by RoleBinding "b2/ns" of Role "r" to ServiceAccount "lab-portal/lab-portal"',
    )
    assert not authz.decide(PORTAL, _ask("create", "virtualmachines", group="kubevirt.io", namespace="other"))[0]
    assert not authz.decide(PORTAL, _ask("create", "virtualmachines", group="kubevirt.io", namespace=""))[0]


def test_a_cluster_role_bound_in_a_namespace_grants_there_and_groups_and_users_match(authorizer):
    api, authz = authorizer
    rules = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    rbac.load(api, [{"kind": "ClusterRole", "metadata": {"name": "reader"}, "rules": rules}])
    group = {"kind": "Group", "name": "system:serviceaccounts:lab-portal"}
    rbac.load(api, [_binding("RoleBinding", "b", "ClusterRole", "reader", [group], "ns")])
    assert authz.decide(PORTAL, _ask("get", "secrets", name="s"))[0]
    assert not authz.decide(PORTAL, _ask("get", "secrets", name="s", namespace="other"))[0]
    someone = rbac.User("alice", ("system:authenticated",))
    assert not authz.decide(someone, _ask("get", "secrets", name="s"))[0]
    rbac.load(
        api, [_binding("ClusterRoleBinding", "alice", "ClusterRole", "reader", [{"kind": "User", "name": "alice"}])]
    )
    assert authz.decide(someone, _ask("get", "secrets", name="s", namespace="other"))[0]


def test_masters_may_do_anything_and_everyone_may_review_their_own_access(authorizer):
    _api, authz = authorizer
    assert authz.decide(rbac.ADMIN, _ask("delete", "nodes", namespace="")) == (True, "")
    review = _ask("create", "selfsubjectaccessreviews", group="authorization.k8s.io", namespace="")
    allowed, reason = authz.decide(PORTAL, review)
    assert allowed and 'ClusterRole "system:basic-user" to Group "system:authenticated"' in reason
    assert rbac.Authorizer(authz.store, enabled=False).decide(PORTAL, _ask("delete", "nodes")) == (True, "")


# ---- over HTTP ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rbac_sim(tmp_path_factory):
    manifest = str(REPO / "deploy" / "rbac.yaml")
    with KubesimServer(tmp_path_factory.mktemp("rbac"), rbac=True, extra_args=["--rbac-manifest", manifest]) as sim:
        yield sim


@pytest.fixture(scope="module")
def portal(rbac_sim):
    api_client = rbac_sim.api_client()
    yield api_client
    api_client.close()


@pytest.fixture(scope="module")
def admin(rbac_sim):
    api_client = rbac_sim.admin_api_client()
    yield api_client
    api_client.close()


def _status(raised: pytest.ExceptionInfo) -> tuple[int, dict]:
    return raised.value.status, json.loads(raised.value.body)


def _can(api_client, verb: str, resource: str, namespace: str, *, group: str = "", sub: str = "") -> dict:
    attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": resource, "subresource": sub}
    answer = client.AuthorizationV1Api(api_client).create_self_subject_access_review(
        {"spec": {"resourceAttributes": attributes}}, _preload_content=False
    )
    return json.loads(answer.data)["status"]


def test_the_portal_gets_rbacs_refusal_word_for_word_and_the_admin_does_not(rbac_sim, portal, admin):
    core_admin = client.CoreV1Api(admin)
    core_admin.create_namespace({"metadata": {"name": "lab-refused"}})
    with pytest.raises(ApiException) as raised:
        client.CoreV1Api(portal).create_namespaced_secret("lab-refused", {"metadata": {"name": "s"}})
    status, body = _status(raised)
    assert status == 403 and body["reason"] == "Forbidden"
    assert body["message"] == rbac_refusal("create", "secrets", group="", namespace="lab-refused", name="")
    assert body["message"] == (
        'secrets is forbidden: User "system:serviceaccount:lab-portal:lab-portal" cannot create resource "secrets" '
        'in API group "" in the namespace "lab-refused"'
    )
    with pytest.raises(ApiException) as raised:
        client.CustomObjectsApi(portal).get_namespaced_custom_object(
            GROUP, VERSION, "lab-refused", "virtualmachines", "x"
        )
    assert _status(raised)[1]["message"].startswith(
        'virtualmachines.kubevirt.io "x" is forbidden: User "system:serviceaccount:lab-portal:lab-portal" cannot get '
        'resource "virtualmachines" in API group "kubevirt.io" in the namespace "lab-refused"'
    )
    core_admin.create_namespaced_secret("lab-refused", {"metadata": {"name": "s"}})  # the admin may
    # The ClusterRole of deploy/rbac.yaml: nodes and namespaces, nothing namespaced.
    assert client.CoreV1Api(portal).list_node().items
    assert client.CoreV1Api(portal).read_namespace("lab-refused").metadata.name == "lab-refused"
    with pytest.raises(ApiException) as raised:
        client.CoreV1Api(portal).delete_namespace("lab-refused")
    assert _status(raised)[1]["message"].endswith(
        'cannot delete resource "namespaces" in API group "" in the namespace "lab-refused"'
    )


def test_a_subresource_stream_is_judged_as_its_own_resource(rbac_sim):
    path = "/apis/subresources.kubevirt.io/v1/namespaces/lab-x/virtualmachineinstances/vm/console"
    answer = urllib3.request("GET", rbac_sim.url + path, headers=rbac_sim.auth_header())
    assert answer.status == 403
    assert answer.json()["message"] == (
        'virtualmachineinstances.subresources.kubevirt.io "vm" is forbidden: User '
        '"system:serviceaccount:lab-portal:lab-portal" cannot get resource "virtualmachineinstances/console" in API '
        'group "subresources.kubevirt.io" in the namespace "lab-x"'
    )


def test_a_token_sent_as_a_websocket_subprotocol_is_the_same_identity(rbac_sim):
    path = "/apis/subresources.kubevirt.io/v1/namespaces/lab-x/virtualmachineinstances/vm/console"

    def console(token: str) -> urllib3.BaseHTTPResponse:
        encoded = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")
        protocol = f"base64url.bearer.authorization.k8s.io.{encoded}, v4.channel.k8s.io"
        return urllib3.request("GET", rbac_sim.url + path, headers={"Sec-WebSocket-Protocol": protocol})

    assert console(rbac_sim.token).status == 403  # the portal, refused by RBAC
    assert console(rbac_sim.admin_token).status != 403  # the admin gets past RBAC (to "no such VMI")
    assert console("not-a-token").status == 401


def test_only_an_admin_may_impersonate(rbac_sim):
    as_admin = {"Authorization": f"Bearer {rbac_sim.token}", "Impersonate-User": "kubesim-admin"}
    answer = urllib3.request("GET", rbac_sim.url + "/api/v1/namespaces/default/secrets", headers=as_admin)
    assert answer.status == 403
    assert answer.json()["message"] == (
        'users "kubesim-admin" is forbidden: User "system:serviceaccount:lab-portal:lab-portal" cannot impersonate '
        'resource "users" in API group "" at the cluster scope'
    )


def test_access_reviews_answer_from_the_same_rules_before_and_after_the_tenants_role(rbac_sim, portal, admin):
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": "lab-review"}})
    assert _can(portal, "create", "virtualmachines", "lab-review", group="kubevirt.io") == {"allowed": False}
    assert _can(admin, "create", "virtualmachines", "lab-review", group="kubevirt.io") == {"allowed": True}
    assert _can(portal, "list", "nodes", "")["allowed"]
    rbacv1 = client.RbacAuthorizationV1Api(admin)
    rules = [
        {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"], "verbs": ["create"]},
        {"apiGroups": ["subresources.kubevirt.io"], "resources": ["virtualmachineinstances/console"], "verbs": ["get"]},
    ]
    rbacv1.create_namespaced_role("lab-review", {"metadata": {"name": "lab-portal"}, "rules": rules})
    rbacv1.create_namespaced_role_binding(
        "lab-review",
        {
            "metadata": {"name": "lab-portal"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lab-portal"},
            "subjects": [{"kind": "ServiceAccount", "name": "lab-portal", "namespace": "lab-portal"}],
        },
    )
    assert _can(portal, "create", "virtualmachines", "lab-review", group="kubevirt.io") == {
        "allowed": True,
        "reason": 'RBAC: allowed by RoleBinding "lab-portal/lab-review" of Role "lab-portal" to ServiceAccount '
        '"lab-portal/lab-portal"',
    }
    assert _can(
        portal, "get", "virtualmachineinstances", "lab-review", group="subresources.kubevirt.io", sub="console"
    )["allowed"]
    assert not _can(
        portal, "get", "virtualmachineinstances", "lab-review", group="subresources.kubevirt.io", sub="vnc"
    )["allowed"]
    created = client.CustomObjectsApi(portal).create_namespaced_custom_object(
        GROUP,
        VERSION,
        "lab-review",
        "virtualmachines",
        vm_manifest("vm", namespace="lab-review", run_strategy="Halted"),
    )
    assert created["metadata"]["name"] == "vm"
    rbacv1.delete_namespaced_role_binding("lab-portal", "lab-review")
    assert _can(portal, "create", "virtualmachines", "lab-review", group="kubevirt.io") == {"allowed": False}


def test_an_access_review_needs_exactly_one_kind_of_attributes(rbac_sim, portal):
    with pytest.raises(ApiException) as raised:
        client.AuthorizationV1Api(portal).create_self_subject_access_review({"spec": {}})
    assert raised.value.status == 422


def test_without_rbac_every_review_is_allowed(sim, api):
    assert _can(api, "create", "virtualmachines", "anywhere", group="kubevirt.io") == {"allowed": True}


def test_kubectl_applies_a_tenants_manifests_and_answers_can_i_for_the_portal(rbac_sim, tmp_path):
    values = {
        "TENANT_NAMESPACE": "lab-kubectl",
        "TENANT_ID": "7",
        "QUOTA_VMS": "5",
        "QUOTA_REQUESTS_CPU": "1",
        "QUOTA_REQUESTS_MEMORY": "4Gi",
        "PORTAL_NAMESPACE": "lab-portal",
        "KUBEVIRT_NAMESPACE": "kubevirt",
    }
    text = (REPO / "deploy" / "tenant-namespace.yaml").read_text()
    for key, value in values.items():
        text = text.replace("${" + key + "}", value)
    env = {**os.environ, "KUBECONFIG": str(rbac_sim.tls_kubeconfig)}  # the admin's

    def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        command = [KUBECTL, "--cache-dir", str(tmp_path / "cache"), *args]
        return subprocess.run(command, input=stdin, env=env, capture_output=True, text=True, timeout=60)

    as_portal = "--as=system:serviceaccount:lab-portal:lab-portal"
    can_i = ("auth", "can-i", "create", "virtualmachines.kubevirt.io", "-n", "lab-kubectl", as_portal)
    assert kubectl(*can_i).stdout.strip() == "no"
    applied = kubectl("apply", "-f", "-", stdin=text)
    assert applied.returncode == 0, applied.stderr
    assert "role.rbac.authorization.k8s.io/lab-portal created" in applied.stdout
    assert "rolebinding.rbac.authorization.k8s.io/lab-portal created" in applied.stdout
    assert "serviceaccount/default created" in applied.stdout
    again = kubectl("apply", "-f", "-", stdin=text)
    assert "role.rbac.authorization.k8s.io/lab-portal unchanged" in again.stdout, again.stderr
    assert kubectl(*can_i).stdout.strip() == "yes"
    assert kubectl("auth", "can-i", "create", "pods", "-n", "lab-kubectl", as_portal).stdout.strip() == "no"
    listed = kubectl("get", "clusterroles", "-o", "name").stdout.split()
    assert {
        "clusterrole.rbac.authorization.k8s.io/lab-portal",
        "clusterrole.rbac.authorization.k8s.io/cluster-admin",
    } <= set(listed)


def test_kubectl_creates_rbac_objects_as_operators_type_them(rbac_sim, tmp_path):
    env = {**os.environ, "KUBECONFIG": str(rbac_sim.tls_kubeconfig)}

    def kubectl(*args: str) -> subprocess.CompletedProcess:
        command = [KUBECTL, "--cache-dir", str(tmp_path / "cache"), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    assert kubectl("create", "namespace", "lab-typed").returncode == 0
    as_portal = "--as=system:serviceaccount:lab-portal:lab-portal"
    assert kubectl("auth", "can-i", "get", "secrets/s", "-n", "lab-typed", as_portal).stdout.strip() == "no"
    created = kubectl(
        "create", "role", "reader", "--verb=get", "--resource=secrets", "--resource-name=s", "-n", "lab-typed"
    )
    assert created.returncode == 0, created.stderr
    bound = kubectl(
        "create", "rolebinding", "reader", "--role=reader", "--serviceaccount=lab-portal:lab-portal", "-n", "lab-typed"
    )
    assert bound.returncode == 0, bound.stderr
    assert kubectl("create", "serviceaccount", "robot", "-n", "lab-typed").returncode == 0
    assert kubectl("auth", "can-i", "get", "secrets/s", "-n", "lab-typed", as_portal).stdout.strip() == "yes"
    assert kubectl("auth", "can-i", "get", "secrets/t", "-n", "lab-typed", as_portal).stdout.strip() == "no"
    assert kubectl("auth", "can-i", "list", "secrets", "-n", "lab-typed", as_portal).stdout.strip() == "no"
