"""Client for the in-guest grading agent: HTTP/1.1 over a WebSocket to the VMI's ``portforward/<port>/tcp``
subresource (KubeVirt has no exec into a VM), one request per connection. ``healthz``, ``run_checks``,
``rotate_token`` and ``set_tty_size`` are synchronous; failures raise an ``AgentError`` whose ``code`` names the cause
(``labs.agent_http``)."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import websocket
from django.conf import settings

from labs.agent_http import (
    AgentBadResponse,
    AgentBusy,
    AgentError,
    AgentNotAnswering,
    AgentResponse,
    AgentTimeout,
    AgentTokenRejected,
    ClusterUnavailable,
    HTTPResponseParser,
    VMNotRunning,
    build_request,
    expect_ok_json,
    handshake_error,
)
from labs.kubevirt.client import StreamTarget, stream_target, vmi_subresource_path

# Per check, beyond its own timeout: the agent waits this long between SIGTERM and SIGKILL for a check that ran
# out of time, and drains the pipes briefly after the shell exits.
PER_CHECK_GRACE_S = 1.5
# Once per request: WebSocket handshake, TLS, the guest's TCP connect, JSON encoding on both sides.
REQUEST_MARGIN_S = 10.0
HEALTHZ_TIMEOUT_S = 5.0
TTY_SIZE_TIMEOUT_S = 3.0
CLOSE_TIMEOUT_S = 0.5


class AgentTarget(Protocol):
    """What the client needs to know about an attempt (``labs.models.Attempt`` fits)."""

    namespace: str
    vm_name: str
    agent_token: str


class CheckLike(Protocol):
    pk: Any
    command: str
    timeout_s: int


def run_deadline_s(timeouts_s: Sequence[float]) -> float:
    """How long a run of checks with these timeouts may take before the portal gives up on it: the agent runs
    checks one after another, so the sum of their timeouts, a grace per check and a margin for the transport."""
    return float(sum(timeouts_s)) + PER_CHECK_GRACE_S * len(timeouts_s) + REQUEST_MARGIN_S


def portforward_path(*, namespace: str, vmi_name: str, port: int | None = None) -> str:
    port = settings.AGENT_PORT if port is None else port
    return vmi_subresource_path(namespace=namespace, name=vmi_name, subresource=f"portforward/{port}/tcp")


def healthz(attempt: AgentTarget, *, timeout_s: float = HEALTHZ_TIMEOUT_S) -> dict[str, Any]:
    """Ask the attempt's agent whether it is up. Returns its JSON (``ready``, ``version``, ``setup_finished``)."""
    response = agent_request(attempt, method="GET", path="/healthz", timeout_s=timeout_s)
    payload = expect_ok_json(response)
    if not isinstance(payload, dict) or payload.get("ready") is not True:
        raise AgentBadResponse(f"the agent's health answer is not ready: {payload!r}"[:500], status=response.status)
    return payload


def rotate_token(target: AgentTarget, *, new_token: str, timeout_s: float = HEALTHZ_TIMEOUT_S) -> None:
    """Make the agent, reached with ``target.agent_token``, take ``new_token`` instead (a warm pool's VM claimed by
    an attempt): the old token is refused from then on."""
    response = agent_request(
        target, method="POST", path="/v1/token", json_body={"token": new_token}, timeout_s=timeout_s
    )
    payload = expect_ok_json(response)
    if not isinstance(payload, dict) or payload.get("rotated") is not True:
        raise AgentBadResponse(f"the agent did not take the new token: {payload!r}"[:500], status=response.status)


def set_tty_size(attempt: AgentTarget, *, rows: int, cols: int, timeout_s: float = TTY_SIZE_TIMEOUT_S) -> None:
    """Set the guest's serial console to ``rows`` x ``cols`` (the agent's ``/v1/tty-size``)."""
    body = {"rows": rows, "cols": cols}
    response = agent_request(attempt, method="POST", path="/v1/tty-size", json_body=body, timeout_s=timeout_s)
    expect_ok_json(response)


def run_checks(attempt: AgentTarget, checks: Sequence[CheckLike]) -> list[dict[str, Any]]:
    """Run ``checks`` in the guest; return the agent's result for each, in the same order.

    Ids sent to the agent are the checks' primary keys as strings. The overall deadline is
    :func:`run_deadline_s` of the checks' timeouts.
    """
    if not checks:
        return []
    body = {"checks": [{"id": str(c.pk), "command": c.command, "timeout_s": c.timeout_s} for c in checks]}
    deadline = run_deadline_s([c.timeout_s for c in checks])
    response = agent_request(attempt, method="POST", path="/v1/run", json_body=body, timeout_s=deadline)
    payload = expect_ok_json(response)
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, list):
        raise AgentBadResponse("the agent's answer has no list of results", status=response.status)
    by_id: dict[str, dict[str, Any]] = {}
    for result in results:
        if isinstance(result, dict) and isinstance(result.get("id"), str):
            by_id[result["id"]] = result
    missing = [str(c.pk) for c in checks if str(c.pk) not in by_id]
    if missing:
        raise AgentBadResponse(f"the agent returned no result for checks {', '.join(missing)}", status=200)
    return [by_id[str(c.pk)] for c in checks]


def agent_request(
    attempt: AgentTarget,
    *,
    method: str,
    path: str,
    json_body: Mapping[str, Any] | None = None,
    timeout_s: float,
) -> AgentResponse:
    """One HTTP request to the attempt's agent through the portforward subresource."""
    if not attempt.vm_name or not attempt.namespace:
        raise VMNotRunning("the attempt has no virtual machine")
    try:
        target = stream_target(portforward_path(namespace=attempt.namespace, vmi_name=attempt.vm_name))
    except Exception as exc:  # ClusterNotConfigured, a kubeconfig that cannot be read, a token refresh failing
        raise ClusterUnavailable(f"cannot configure the cluster client: {exc}") from exc
    return http_over_websocket(
        target, method=method, path=path, token=attempt.agent_token, json_body=json_body, timeout_s=timeout_s
    )


def http_over_websocket(
    target: StreamTarget,
    *,
    method: str,
    path: str,
    token: str,
    json_body: Mapping[str, Any] | None = None,
    timeout_s: float,
) -> AgentResponse:
    """Open the portforward WebSocket at ``target``, send one HTTP request, read one response, close."""
    deadline = time.monotonic() + timeout_s
    ws = _connect(target, timeout_s=min(timeout_s, REQUEST_MARGIN_S))
    try:
        ws.send_binary(build_request(method=method, path=path, token=token, json_body=json_body))
        parser = HTTPResponseParser()
        while not parser.complete:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentTimeout(f"the agent did not answer {method} {path} within {timeout_s:.0f} s")
            ws.settimeout(remaining)
            try:
                opcode, data = ws.recv_data(control_frame=False)
            except websocket.WebSocketTimeoutException:
                raise AgentTimeout(f"the agent did not answer {method} {path} within {timeout_s:.0f} s") from None
            except (websocket.WebSocketConnectionClosedException, ConnectionError, OSError) as exc:
                parser.feed_eof(reason=str(exc) or type(exc).__name__)
                break
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                parser.feed_eof(reason="the portforward stream was closed")
                break
            if opcode == websocket.ABNF.OPCODE_BINARY:
                parser.feed(data)
            # Text frames carry nothing on a portforward stream; pings are answered by recv_data.
        return parser.response()
    finally:
        _close_quietly(ws)


def _connect(target: StreamTarget, *, timeout_s: float) -> websocket.WebSocket:
    header = [f"{name}: {value}" for name, value in target.headers.items()]
    # Sent as a raw header, as the kubernetes client does: KubeVirt echoes it, and a server that answers without
    # a subprotocol is still accepted.
    header.append("Sec-WebSocket-Protocol: plain.kubevirt.io")
    # The context carries the CA, client certificate and hostname checking from the kubeconfig.
    sslopt: dict[str, Any] = {"context": target.ssl} if target.ssl is not None else {}
    if target.server_hostname:
        sslopt["server_hostname"] = target.server_hostname
    proxy: dict[str, Any] = {}
    if target.proxy:
        parsed = urlsplit(target.proxy)
        proxy = {"http_proxy_host": parsed.hostname, "http_proxy_port": parsed.port or 80, "proxy_type": "http"}
        if parsed.username:
            proxy["http_proxy_auth"] = (unquote(parsed.username), unquote(parsed.password or ""))
    try:
        return websocket.create_connection(
            target.url,
            header=header,
            sslopt=sslopt,
            timeout=timeout_s,
            enable_multithread=False,
            skip_utf8_validation=True,
            **proxy,
        )
    except websocket.WebSocketBadStatusException as exc:
        raise handshake_error(status=exc.status_code, body=exc.resp_body, fallback=str(exc)) from None
    except websocket.WebSocketTimeoutException:
        raise AgentTimeout(f"the cluster did not open the portforward stream within {timeout_s:.0f} s") from None
    except (ConnectionRefusedError, socket.gaierror) as exc:
        raise ClusterUnavailable(f"cannot reach the cluster API at {target.url.split('/apis/')[0]}: {exc}") from None
    except ssl.SSLError as exc:
        raise ClusterUnavailable(f"TLS with the cluster API failed: {exc}") from None
    except TimeoutError:
        raise AgentTimeout(f"the cluster did not open the portforward stream within {timeout_s:.0f} s") from None
    except (websocket.WebSocketException, OSError) as exc:
        raise ClusterUnavailable(f"cannot open the portforward stream: {exc}") from None


def _close_quietly(ws: websocket.WebSocket) -> None:
    try:
        ws.close(timeout=CLOSE_TIMEOUT_S)
    except Exception:  # noqa: S110  the answer is already in hand; a failed close frame changes nothing
        pass


def deadline_for_checks(checks: Sequence[CheckLike]) -> float:
    """The deadline :func:`run_checks` applies to ``checks`` (used to judge when a run is stuck)."""
    return run_deadline_s([c.timeout_s for c in checks]) if checks else REQUEST_MARGIN_S


__all__ = [
    "AgentBadResponse",
    "AgentBusy",
    "AgentError",
    "AgentNotAnswering",
    "AgentResponse",
    "AgentTimeout",
    "AgentTokenRejected",
    "ClusterUnavailable",
    "VMNotRunning",
    "agent_request",
    "deadline_for_checks",
    "healthz",
    "http_over_websocket",
    "run_checks",
    "run_deadline_s",
]
