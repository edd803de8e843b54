"""Client for the in-guest grading agent, reached through the VMI ``portforward/<port>/tcp`` subresource.

KubeVirt has no exec into a VM: the portal opens a WebSocket to
``/apis/subresources.kubevirt.io/v1/namespaces/<ns>/virtualmachineinstances/<vmi>/portforward/8787/tcp`` with the
cluster client's own address, credentials and TLS settings, and speaks HTTP/1.1 to the agent over it. Each binary
frame carries raw TCP bytes in either direction; one WebSocket is one TCP connection, so every request is sent with
``Connection: close`` and the response is read up to its ``Content-Length``.

Public entry points (synchronous, safe to call from Celery tasks):

    healthz(attempt, *, timeout_s=...) -> dict      # {"ready": true, "version": ..., "setup_finished": ...}
    run_checks(attempt, checks) -> list[dict]       # one raw agent result per check, in the checks' order
    set_tty_size(attempt, rows=R, cols=C) -> None   # the guest's serial console size (no typing into it)

Failures raise a subclass of :class:`AgentError` whose ``code`` names the cause:

    VMNotRunning        "vm_not_running"       handshake answered 400, 404 or 409 (VMI missing, not Running, failed)
    AgentNotAnswering   "agent_not_answering"  nothing listens in the guest, or the connection closed early
    AgentTimeout        "agent_timeout"        no complete answer within the deadline
    AgentTokenRejected  "agent_token_rejected" the agent answered 401 (token in the Secret and attempt differ)
    AgentBusy           "agent_busy"           the agent answered 429 (too many runs at once)
    AgentBadResponse    "agent_bad_response"   any other status, or a response that is not the agent's JSON
    ClusterUnavailable  "cluster_unavailable"  the API server could not be reached or refused the portal
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import websocket
from django.conf import settings

from labs.kubevirt.client import StreamTarget, stream_target, vmi_subresource_path

# Per check, beyond its own timeout: the agent waits this long between SIGTERM and SIGKILL for a check that ran
# out of time, and drains the pipes briefly after the shell exits.
PER_CHECK_GRACE_S = 1.5
# Once per request: WebSocket handshake, TLS, the guest's TCP connect, JSON encoding on both sides.
REQUEST_MARGIN_S = 10.0
HEALTHZ_TIMEOUT_S = 5.0
TTY_SIZE_TIMEOUT_S = 3.0
# 100 checks with 64 KiB of stdout and of stderr each come to about 13 MiB; anything past this is not the agent.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
CLOSE_TIMEOUT_S = 0.5


class AgentError(Exception):
    """The agent could not be asked or did not answer usefully. ``code`` is stable; the message is for logs and
    for the run's error text shown to staff."""

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


class AgentTarget(Protocol):
    """What the client needs to know about an attempt (``labs.models.Attempt`` fits)."""

    namespace: str
    vm_name: str
    agent_token: str


class CheckLike(Protocol):
    pk: Any
    command: str
    timeout_s: int


@dataclass(frozen=True)
class AgentResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AgentBadResponse(f"the agent's answer is not JSON: {exc}", status=self.status) from None


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
    payload = _expect_ok_json(response)
    if not isinstance(payload, dict) or payload.get("ready") is not True:
        raise AgentBadResponse(f"the agent's health answer is not ready: {payload!r}"[:500], status=response.status)
    return payload


def set_tty_size(attempt: AgentTarget, *, rows: int, cols: int, timeout_s: float = TTY_SIZE_TIMEOUT_S) -> None:
    """Set the guest's serial console to ``rows`` x ``cols`` (the agent's ``/v1/tty-size``)."""
    body = {"rows": rows, "cols": cols}
    response = agent_request(attempt, method="POST", path="/v1/tty-size", json_body=body, timeout_s=timeout_s)
    _expect_ok_json(response)


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
    payload = _expect_ok_json(response)
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


def build_request(*, method: str, path: str, token: str, json_body: Mapping[str, Any] | None) -> bytes:
    body = b"" if json_body is None else json.dumps(json_body, ensure_ascii=False).encode("utf-8")
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: localhost:{settings.AGENT_PORT}",
        f"Authorization: Bearer {token}",
        "Accept: application/json",
        "Connection: close",
        f"Content-Length: {len(body)}",
    ]
    if json_body is not None:
        lines.append("Content-Type: application/json")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


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
        raise _handshake_error(exc) from None
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


def _handshake_error(exc: websocket.WebSocketBadStatusException) -> AgentError:
    status = exc.status_code
    message = _status_message(exc.resp_body) or str(exc)
    if status in (400, 404, 409):
        return VMNotRunning(f"the virtual machine is not running ({status}: {message})", status=status)
    if status in (401, 403):
        return ClusterUnavailable(f"the cluster refused the portal's credentials ({status}: {message})", status=status)
    if status in (500, 502, 503):
        # virt-api dials the guest before upgrading: nothing listening on the agent port shows up here.
        return AgentNotAnswering(f"the agent is not answering ({status}: {message})", status=status)
    return AgentBadResponse(f"the portforward stream was refused ({status}: {message})", status=status)


def _status_message(body: bytes | str | None) -> str:
    if not body:
        return ""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        status = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:300]
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return status["message"][:300]
    return text.strip()[:300]


def _close_quietly(ws: websocket.WebSocket) -> None:
    try:
        ws.close(timeout=CLOSE_TIMEOUT_S)
    except Exception:  # noqa: S110  the answer is already in hand; a failed close frame changes nothing
        pass


def _expect_ok_json(response: AgentResponse) -> Any:
    if response.status == 200:
        return response.json()
    detail = _agent_error_text(response)
    if response.status == 401:
        raise AgentTokenRejected(f"the agent rejected the attempt's token: {detail}", status=401)
    if response.status == 429:
        raise AgentBusy(f"the agent is busy: {detail}", status=429)
    raise AgentBadResponse(f"the agent answered {response.status}: {detail}", status=response.status)


def _agent_error_text(response: AgentResponse) -> str:
    try:
        payload = json.loads(response.body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return response.body[:200].decode("utf-8", errors="replace")
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        return payload["error"][:300]
    return str(payload)[:300]


class HTTPResponseParser:
    """An incremental parser for one HTTP/1.1 response (status line, headers, a Content-Length or
    read-to-close body; chunked bodies too, though the agent never sends them)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self._header_end: int | None = None
        self._length: int | None = None
        self._chunked = False
        self._eof = False
        self._eof_reason = ""
        self.complete = False

    def feed(self, data: bytes) -> None:
        self._buffer.extend(data)
        if len(self._buffer) > MAX_RESPONSE_BYTES:
            raise AgentBadResponse(f"the agent's answer exceeds {MAX_RESPONSE_BYTES} bytes")
        if self._header_end is None:
            self._parse_head()
        if self._header_end is not None:
            self._check_complete()

    def feed_eof(self, *, reason: str) -> None:
        self._eof = True
        self._eof_reason = reason
        if self._header_end is not None and self._length is None and not self._chunked:
            self.complete = True  # a body delimited by the end of the connection

    def response(self) -> AgentResponse:
        if not self.complete:
            if not self._buffer:
                raise AgentNotAnswering(f"the agent closed the connection without answering ({self._eof_reason})")
            raise AgentBadResponse(
                f"the agent's answer was cut off after {len(self._buffer)} bytes ({self._eof_reason})"
            )
        assert self.status is not None and self._header_end is not None
        body = bytes(self._buffer[self._header_end :])
        if self._chunked:
            body = _dechunk(body)
        elif self._length is not None:
            body = body[: self._length]
        return AgentResponse(status=self.status, headers=self.headers, body=body)

    def _parse_head(self) -> None:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > 64 * 1024:
                raise AgentBadResponse("the agent's answer has no end of headers")
            return
        head = bytes(self._buffer[:end]).decode("latin-1")
        status_line, *header_lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise AgentBadResponse(f"the agent's answer is not HTTP: {status_line[:80]!r}")
        self.status = int(parts[1])
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                self.headers[name.strip().lower()] = value.strip()
        self._header_end = end + 4
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._chunked = True
        elif "content-length" in self.headers:
            try:
                self._length = int(self.headers["content-length"])
            except ValueError:
                raise AgentBadResponse("the agent's answer has an invalid Content-Length") from None
            if self._length < 0 or self._length > MAX_RESPONSE_BYTES:
                raise AgentBadResponse(f"the agent's answer has an unusable Content-Length {self._length}")

    def _check_complete(self) -> None:
        assert self._header_end is not None
        received = len(self._buffer) - self._header_end
        if self._length is not None:
            self.complete = received >= self._length
        elif self._chunked:
            self.complete = bytes(self._buffer).endswith(b"0\r\n\r\n")


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    position = 0
    while True:
        line_end = body.find(b"\r\n", position)
        if line_end < 0:
            raise AgentBadResponse("the agent's chunked answer is malformed")
        size_text = body[position:line_end].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise AgentBadResponse("the agent's chunked answer is malformed") from None
        if size == 0:
            return bytes(out)
        start = line_end + 2
        out.extend(body[start : start + size])
        position = start + size + 2


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
