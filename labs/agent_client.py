"""Client for the in-guest grading agent: HTTP/1.1 (``http.client``) over a WebSocket to the VMI's
``portforward/<port>/tcp`` subresource (KubeVirt has no exec into a VM), one request per connection. Failures raise
an ``AgentError`` whose ``code`` names the cause."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import websocket
from django.conf import settings

from labs.kubevirt.client import StreamTarget, stream_target, vmi_subresource_path
from labs.models import Attempt, Check, PoolVm

# Per check, beyond its own timeout: the agent waits this long between SIGTERM and SIGKILL for a check that ran
# out of time, and drains the pipes briefly after the shell exits.
PER_CHECK_GRACE_S = 1.5
# Once per request: WebSocket handshake, TLS, the guest's TCP connect, JSON encoding on both sides.
REQUEST_MARGIN_S = 10.0
HEALTHZ_TIMEOUT_S = 5.0
TTY_SIZE_TIMEOUT_S = 3.0
CLOSE_TIMEOUT_S = 0.5
# 100 checks with 64 KiB of stdout and of stderr each come to about 13 MiB; anything past this is not the agent.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class AgentError(Exception):
    """The agent could not be asked or did not answer usefully; ``code`` is stable, the message for logs and staff."""

    code = "agent_error"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class VMNotRunning(AgentError):
    code = "vm_not_running"


class AgentNotAnswering(AgentError):
    code = "agent_not_answering"


class AgentTimeout(AgentError):
    code = "agent_timeout"


class AgentTokenRejected(AgentError):
    code = "agent_token_rejected"


class AgentBusy(AgentError):
    code = "agent_busy"


class AgentBadResponse(AgentError):
    code = "agent_bad_response"


class ClusterUnavailable(AgentError):
    code = "cluster_unavailable"


@dataclass(frozen=True)
class AgentResponse:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AgentBadResponse(f"the agent's answer is not JSON: {exc}", status=self.status) from None


# What has an agent: an attempt's VM, or a warm pool's before an attempt claims it.
AgentTarget = Attempt | PoolVm


def deadline_for_checks(checks: Sequence[Check]) -> float:
    """How long :func:`run_checks` waits for ``checks``: the agent runs them one after another, so the sum of their
    timeouts, a grace per check and a margin for the transport."""
    return float(sum(c.timeout_s for c in checks)) + PER_CHECK_GRACE_S * len(checks) + REQUEST_MARGIN_S


def _ask(target: AgentTarget, path: str, body: Mapping[str, Any] | None = None, *, timeout_s: float) -> Any:
    """POST ``body`` (GET without one) to the agent; its JSON answer, or the error its status stands for."""
    method = "GET" if body is None else "POST"
    response = agent_request(target, method=method, path=path, json_body=body, timeout_s=timeout_s)
    if response.status == 200:
        return response.json()
    try:
        payload = response.json()
    except AgentBadResponse:
        payload = response.body[:200].decode("utf-8", errors="replace")
    detail = payload["error"] if isinstance(payload, dict) and isinstance(payload.get("error"), str) else payload
    detail = str(detail)[:300]
    if response.status == 401:
        raise AgentTokenRejected(f"the agent rejected the attempt's token: {detail}", status=401)
    if response.status == 429:
        raise AgentBusy(f"the agent is busy: {detail}", status=429)
    raise AgentBadResponse(f"the agent answered {response.status}: {detail}", status=response.status)


def healthz(attempt: AgentTarget, *, timeout_s: float = HEALTHZ_TIMEOUT_S) -> dict[str, Any]:
    """Ask the attempt's agent whether it is up. Returns its JSON (``ready``, ``version``, ``setup_finished``)."""
    payload = _ask(attempt, "/healthz", timeout_s=timeout_s)
    if not isinstance(payload, dict) or payload.get("ready") is not True:
        raise AgentBadResponse(f"the agent's health answer is not ready: {payload!r}"[:500], status=200)
    return payload


def rotate_token(target: AgentTarget, *, new_token: str, timeout_s: float = HEALTHZ_TIMEOUT_S) -> None:
    """Make the agent take ``new_token`` instead of ``target.agent_token``, which it refuses from then on."""
    payload = _ask(target, "/v1/token", {"token": new_token}, timeout_s=timeout_s)
    if not isinstance(payload, dict) or payload.get("rotated") is not True:
        raise AgentBadResponse(f"the agent did not take the new token: {payload!r}"[:500], status=200)


def set_tty_size(attempt: AgentTarget, *, rows: int, cols: int, timeout_s: float = TTY_SIZE_TIMEOUT_S) -> None:
    _ask(attempt, "/v1/tty-size", {"rows": rows, "cols": cols}, timeout_s=timeout_s)


def run_checks(attempt: AgentTarget, checks: Sequence[Check]) -> list[dict[str, Any]]:
    """Run ``checks`` in the guest (sent with their primary keys as ids); the agent's result for each, in order."""
    if not checks:
        return []
    # Admin's textarea saves line breaks as CRLF, and bash would take each CR as part of a command.
    checks_sent = [
        {"id": str(c.pk), "command": c.command.replace("\r\n", "\n"), "timeout_s": c.timeout_s} for c in checks
    ]
    body = {"checks": checks_sent}
    payload = _ask(attempt, "/v1/run", body, timeout_s=deadline_for_checks(checks))
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, list):
        raise AgentBadResponse("the agent's answer has no list of results", status=200)
    by_id = {r["id"]: r for r in results if isinstance(r, dict) and isinstance(r.get("id"), str)}
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
    port = f"portforward/{settings.AGENT_PORT}/tcp"
    portforward = vmi_subresource_path(namespace=attempt.namespace, name=attempt.vm_name, subresource=port)
    try:
        target = stream_target(portforward)
    except Exception as exc:  # ClusterNotConfigured, a kubeconfig that cannot be read, a token refresh failing
        raise ClusterUnavailable(f"cannot configure the cluster client: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    ws = _connect(target, timeout_s=min(timeout_s, REQUEST_MARGIN_S))
    stream = _Portforward(
        ws, deadline=deadline, late=f"the agent did not answer {method} {path} within {timeout_s:.0f} s"
    )
    headers = {"Authorization": f"Bearer {attempt.agent_token}", "Accept": "application/json", "Connection": "close"}
    body = None
    if json_body is not None:
        body = json.dumps(json_body, ensure_ascii=False).encode("utf-8")
        headers["Content-Type"] = "application/json"
    # http.client writes to and reads from the stream as if it were the connection's socket.
    connection = http.client.HTTPConnection("localhost", settings.AGENT_PORT)
    connection.sock = stream
    too_big = AgentBadResponse(f"the agent's answer exceeds {MAX_RESPONSE_BYTES} bytes")
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        length = response.getheader("Content-Length", "")
        if length.isdigit() and int(length) > MAX_RESPONSE_BYTES:
            raise too_big
        # With a Content-Length, http.client says when the answer is cut short; without, at most the cap is read.
        answer = response.read(None if length.isdigit() else MAX_RESPONSE_BYTES + 1)
    except http.client.RemoteDisconnected:
        raise AgentNotAnswering(f"the agent closed the connection without answering ({stream.ended})") from None
    except http.client.IncompleteRead as exc:
        raise AgentBadResponse(
            f"the agent's answer was cut off after {len(exc.partial)} bytes ({stream.ended})"
        ) from None
    except http.client.HTTPException as exc:
        raise AgentBadResponse(f"the agent's answer is not HTTP: {exc!r}"[:200]) from None
    finally:
        with contextlib.suppress(Exception):  # the answer is in hand: a failed close frame changes nothing
            ws.close(timeout=CLOSE_TIMEOUT_S)
    if len(answer) > MAX_RESPONSE_BYTES:
        raise too_big
    return AgentResponse(status=response.status, body=answer)


class _Portforward(io.RawIOBase):
    """An open portforward WebSocket as the socket ``http.client`` uses: the agent's bytes come in binary frames,
    and nothing more is waited for after ``deadline``. Closing it is ``agent_request``'s business."""

    def __init__(self, ws: websocket.WebSocket, *, deadline: float, late: str) -> None:
        super().__init__()
        self._ws = ws
        self._deadline = deadline
        self._late = late
        self._pending = b""
        self.ended = ""  # why the stream ended, once it has

    def sendall(self, data: bytes) -> None:
        self._ws.send_binary(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        """Nothing: ``http.client`` closes its socket before the body is read."""

    def readinto(self, buffer: Any) -> int:
        while not self._pending and not self.ended:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise AgentTimeout(self._late)
            self._ws.settimeout(remaining)
            try:
                opcode, data = self._ws.recv_data(control_frame=False)
            except websocket.WebSocketTimeoutException:
                raise AgentTimeout(self._late) from None
            except (websocket.WebSocketConnectionClosedException, OSError) as exc:
                self.ended = str(exc) or type(exc).__name__
            else:
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    self.ended = "the portforward stream was closed"
                elif opcode == websocket.ABNF.OPCODE_BINARY:
                    self._pending = data
                # Text frames carry nothing on a portforward stream; pings are answered by recv_data.
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


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
        status, body = exc.status_code, exc.resp_body
        text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body or ""
        try:
            said = json.loads(text)["message"]
        except (ValueError, TypeError, KeyError):
            said = text.strip()
        message = (said if isinstance(said, str) else text.strip())[:300] or str(exc)
        if status in (400, 404, 409):
            raise VMNotRunning(f"the virtual machine is not running ({status}: {message})", status=status) from None
        if status in (401, 403):
            refused = f"the cluster refused the portal's credentials ({status}: {message})"
            raise ClusterUnavailable(refused, status=status) from None
        if status in (500, 502, 503):
            # virt-api dials the guest before upgrading: nothing listening on the agent port shows up here.
            raise AgentNotAnswering(f"the agent is not answering ({status}: {message})", status=status) from None
        raise AgentBadResponse(f"the portforward stream was refused ({status}: {message})", status=status) from None
    except (websocket.WebSocketTimeoutException, TimeoutError):
        raise AgentTimeout(f"the cluster did not open the portforward stream within {timeout_s:.0f} s") from None
    except (ConnectionRefusedError, socket.gaierror) as exc:
        raise ClusterUnavailable(f"cannot reach the cluster API at {target.url.split('/apis/')[0]}: {exc}") from None
    except ssl.SSLError as exc:
        raise ClusterUnavailable(f"TLS with the cluster API failed: {exc}") from None
    except (websocket.WebSocketException, OSError) as exc:
        raise ClusterUnavailable(f"cannot open the portforward stream: {exc}") from None
