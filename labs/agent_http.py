"""HTTP/1.1 to the grading agent as bytes: the request, the response parser, and the errors the client raises."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

# 100 checks with 64 KiB of stdout and of stderr each come to about 13 MiB; anything past this is not the agent.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


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


def handshake_error(*, status: int, body: bytes | str | None, fallback: str) -> AgentError:
    """The error for a portforward WebSocket the cluster refused with ``status``."""
    message = _status_message(body) or fallback
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


def expect_ok_json(response: AgentResponse) -> Any:
    """The answer's JSON when the agent answered 200, else the error its status stands for."""
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
