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
