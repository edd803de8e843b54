"""Cluster client configuration, loaded once (in-cluster, then ``KUBECONFIG``, then the embedded kubesim): the address,
credentials and TLS of every REST call and WebSocket stream."""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import urllib3
from django.conf import settings
from kubernetes import client, config
from kubernetes.client.rest import should_bypass_proxies
from kubernetes.config.config_exception import ConfigException

KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"

# urllib3's default sleeps whatever Retry-After a 429 or 503 asks for, holding a task (and the sync's locks) for
# minutes: only a connection that fails to open is retried here; the callers' own retries back off with a cap.
REQUEST_RETRIES = urllib3.Retry(
    total=2,
    connect=2,
    read=0,
    redirect=0,
    status=0,
    other=0,
    backoff_factor=0.2,
    respect_retry_after_header=False,
    raise_on_status=False,
)

# Metadata only, as client-go's metadata informers list (a server without it answers whole objects, read the same).
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
_lock = threading.RLock()
_made: dict[str, Any] = {}
T = TypeVar("T")


class ClusterNotConfigured(RuntimeError):
    """No in-cluster service account, no KUBECONFIG, and no embedded kubesim kubeconfig."""


def _once(key: str, make: Callable[[], T]) -> T:
    """``make()``'s result, made once per loaded configuration (``reset`` forgets them all)."""
    with _lock:
        if key not in _made:
            _made[key] = make()
        return cast(T, _made[key])


def _load_configuration() -> client.Configuration:
    configuration = client.Configuration()
    configuration.retries = REQUEST_RETRIES
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not settings.KUBECONFIG:
        config.load_incluster_config(client_configuration=configuration)
        return configuration
    path = settings.KUBECONFIG or str(settings.EMBEDDED_KUBECONFIG)
    if not Path(path).exists() and settings.KUBECONFIG:
        raise ClusterNotConfigured(f"KUBECONFIG points at {path}, which does not exist.")
    if not Path(path).exists():
        raise ClusterNotConfigured(
            "No cluster configured: not running in a cluster, KUBECONFIG is unset, and the embedded kubesim has not "
            f"written {path} (start the portal with `python manage.py run_portal`)."
        )
    try:
        config.load_kube_config(config_file=path, context=settings.KUBE_CONTEXT, client_configuration=configuration)
    except ConfigException as exc:
        raise ClusterNotConfigured(f"Cannot read the kubeconfig at {path}: {exc}") from exc
    return configuration


def configuration() -> client.Configuration:
    return _once("configuration", _load_configuration)


def api_client() -> client.ApiClient:
    return _once("api_client", lambda: client.ApiClient(configuration=configuration()))


def metadata_api_client() -> client.ApiClient:
    """A client whose every request asks for metadata only (its default header replaces the methods' Accept)."""
    return _once("metadata_api_client", lambda: client.ApiClient(configuration(), "Accept", METADATA_LIST_ACCEPT))


def reset() -> None:
    """Forget the loaded configuration (tests point the portal at a fresh kubesim; settings changed)."""
    with _lock:
        _made.clear()


def custom_objects() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client())


def core_v1() -> client.CoreV1Api:
    return client.CoreV1Api(api_client())


def networking_v1() -> client.NetworkingV1Api:
    return client.NetworkingV1Api(api_client())


@dataclass(frozen=True)
class StreamTarget:
    """Where and how to open a WebSocket to a streaming subresource, with the client's auth and TLS."""

    url: str
    headers: dict[str, str]
    ssl: ssl.SSLContext | None
    # The kubeconfig's tls-server-name: the name the server's certificate is checked against, and sent as SNI.
    server_hostname: str | None = None
    # An HTTP(S) proxy the REST client also uses (HTTPS_PROXY, unless NO_PROXY exempts the server).
    proxy: str | None = None


def _new_ssl_context(cfg: client.Configuration) -> ssl.SSLContext | None:
    """The TLS context of the streams (console, portforward): made once, as building one reads the CA certificates."""
    if not cfg.host.startswith("https"):
        return None
    context = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
    if cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, cfg.key_file)
    if not cfg.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def auth_headers(cfg: client.Configuration) -> dict[str, str]:
    """The client's credentials as headers, a rotating (bound service-account) token refreshed first."""
    if cfg.refresh_api_key_hook is not None:
        cfg.refresh_api_key_hook(cfg)
    return {s["key"]: s["value"] for s in cfg.auth_settings().values() if s.get("in") == "header" and s.get("value")}


def stream_target(path: str) -> StreamTarget:
    """A WebSocket URL and headers for ``path`` (e.g. ``/apis/subresources.kubevirt.io/v1/...``)."""
    cfg = configuration()
    scheme, _sep, address = cfg.host.rstrip("/").partition("://")
    if scheme not in ("http", "https"):
        raise ClusterNotConfigured(f"Unsupported API server address {cfg.host!r}.")
    url = f"{'wss' if scheme == 'https' else 'ws'}://{address}{path}"
    proxy = cfg.proxy if cfg.proxy and not should_bypass_proxies(cfg.host, no_proxy=cfg.no_proxy or "") else None
    return StreamTarget(
        url=url,
        headers=auth_headers(cfg),
        # Made from the configuration current under the lock, so a concurrent reset() cannot cache an old one's.
        ssl=_once("stream_ssl", lambda: _new_ssl_context(configuration())),
        server_hostname=(cfg.tls_server_name or None) if url.startswith("wss://") else None,
        proxy=proxy,
    )


def vmi_subresource_path(*, namespace: str, name: str, subresource: str) -> str:
    return f"/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}/{subresource}"
