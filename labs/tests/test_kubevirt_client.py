"""The cluster client's streams (console, portforward): their TLS context is built once per configuration."""

from __future__ import annotations

import http.client
import json
import ssl
from urllib.parse import urlsplit

import pytest

from labs.kubevirt import client as kube_client


@pytest.fixture
def tls_cluster(kubesim_server, settings):
    """The session's kubesim over HTTPS (its own CA in the kubeconfig), as a real API server is spoken to."""
    settings.KUBECONFIG = str(kubesim_server.tls_kubeconfig)
    kube_client.reset()
    yield kubesim_server
    kube_client.reset()


def test_the_streams_tls_context_is_made_once_and_trusts_the_clusters_ca(tls_cluster):
    first = kube_client.stream_target("/version")
    second = kube_client.stream_target("/version")
    assert first.url.startswith("wss://") and first.ssl is not None
    assert second.ssl is first.ssl  # not rebuilt (reading CA certificates) for every console and agent check
    assert first.ssl.verify_mode == ssl.CERT_REQUIRED and first.ssl.check_hostname
    # It is the right context: the cluster's certificate verifies against it.
    address = urlsplit(first.url)
    connection = http.client.HTTPSConnection(address.hostname, address.port, context=first.ssl, timeout=10)
    try:
        connection.request("GET", address.path, headers=first.headers)
        assert "gitVersion" in json.loads(connection.getresponse().read())
    finally:
        connection.close()
    # A new configuration (the portal pointed elsewhere, or reloaded) gets a context of its own.
    kube_client.reset()
    assert kube_client.stream_target("/version").ssl is not first.ssl


def test_a_plain_http_cluster_has_no_tls_context(cluster):
    assert kube_client.stream_target("/version").ssl is None


def test_the_portal_uses_only_the_clients_public_signatures():
    # call_api's auth_settings and _return_http_data_only are the generator's internals: they changed shape with
    # the client's new generator, and a pinned client that cannot be upgraded is a security liability.
    import ast
    from pathlib import Path

    private = {"auth_settings", "_return_http_data_only", "response_types_map", "collection_formats"}
    for path in Path(__file__).resolve().parents[1].joinpath("kubevirt").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                assert name != "call_api", f"{path.name}:{node.lineno} calls ApiClient.call_api"
                used = {k.arg for k in node.keywords} & private
                assert not used, f"{path.name}:{node.lineno} passes {used}"


def test_metadata_lists_ask_for_partial_objects_through_the_public_api(cluster):
    from labs.kubevirt import operations

    namespace = "meta-lists"
    core = kube_client.core_v1()
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        core.create_namespaced_secret(
            namespace,
            {
                "metadata": {"name": "s", "labels": {"app.kubernetes.io/managed-by": "lab-portal"}},
                "stringData": {"userdata": "x" * 1000},
            },
        )
        (secret,) = operations.secrets_list(namespace=namespace)
        assert secret["kind"] == "PartialObjectMetadata" and "data" not in secret
        assert secret["metadata"]["name"] == "s"
        assert operations.vms_list(namespace=namespace) == []
    finally:
        core.delete_namespace(namespace)


def test_streams_follow_the_whole_kubeconfig_server_name_proxy_and_client_certificate(
    kubesim_server, settings, monkeypatch
):
    settings.KUBECONFIG = str(kubesim_server.cert_kubeconfig)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    kube_client.reset()
    try:
        target = kube_client.stream_target("/apis/subresources.kubevirt.io/v1/version")
    finally:
        kube_client.reset()
    assert target.url.startswith("wss://") and "Authorization" not in target.headers
    assert target.server_hostname == "kubesim.cluster.local"
    assert target.proxy == "http://proxy.example:3128"
    assert target.ssl is not None and target.ssl.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.django_db
def test_the_whole_flow_with_a_client_certificate_kubeconfig(
    kubesim_server, lifecycle, settings, student_a, lab_a, django_capture_on_commit_callbacks
):
    # kind and k3s write kubeconfigs with a client certificate and no token; the REST client and the portforward
    # stream to the grading agent (running means the agent answered through it) authenticate with it.
    from labs.models import AttemptState
    from labs.services import attempt_start
    from labs.tests.conftest import sync_until

    settings.KUBECONFIG = str(kubesim_server.cert_kubeconfig)
    kube_client.reset()
    try:
        with django_capture_on_commit_callbacks(execute=True):
            attempt = attempt_start(actor=student_a, lab=lab_a)
        sync_until(attempt, AttemptState.RUNNING)
        assert attempt.agent_ready_at is not None
    finally:
        kube_client.reset()
