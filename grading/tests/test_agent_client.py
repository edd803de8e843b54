"""The agent client: HTTP parsing over the byte stream, and each failure type against kubesim's portforward."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import websocket

from grading.tests.guests import delete_vm, new_attempt_on_cluster
from labs import agent_client

pytestmark = pytest.mark.django_db


class FakePortforward:
    """The portforward stream of an agent that answers ``wire`` in frames of ``size`` bytes, then closes."""

    def __init__(self, wire: bytes, size: int) -> None:
        self.frames = [wire[i : i + size] for i in range(0, len(wire), size)]
        self.sent = b""

    def send_binary(self, data: bytes) -> None:
        self.sent += data

    def settimeout(self, timeout: float) -> None:
        pass

    def recv_data(self, control_frame: bool = False) -> tuple[int, bytes]:
        if not self.frames:
            return websocket.ABNF.OPCODE_CLOSE, b""
        return websocket.ABNF.OPCODE_BINARY, self.frames.pop(0)

    def close(self, timeout: float | None = None) -> None:
        pass


@pytest.fixture
def agent_answers(monkeypatch):
    """Make the agent answer the given bytes; returns the stream, which records what was sent."""

    def answer(wire: bytes, size: int = 7) -> FakePortforward:
        stream = FakePortforward(wire, size)
        monkeypatch.setattr(agent_client, "stream_target", lambda path: None)
        monkeypatch.setattr(agent_client, "_connect", lambda target, timeout_s: stream)
        return stream

    return answer


def ask(json_body=None):
    attempt = SimpleNamespace(namespace="ns", vm_name="attempt-1", agent_token="tok")
    method = "GET" if json_body is None else "POST"
    return agent_client.agent_request(attempt, method=method, path="/v1/run", json_body=json_body, timeout_s=5)


class TestHTTPParsing:
    def test_request_is_http_1_1_with_connection_close_and_length(self, agent_answers):
        stream = agent_answers(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        ask({"checks": ["é"]})
        head, _, body = stream.sent.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        assert lines[0] == "POST /v1/run HTTP/1.1"
        assert "Connection: close" in lines
        assert "Authorization: Bearer tok" in lines
        assert f"Content-Length: {len(body)}" in lines
        assert body.decode("utf-8") == '{"checks": ["é"]}'

    def test_response_split_across_frames(self, agent_answers):
        body = '{"ready": true, "name": "日本"}'.encode()
        agent_answers(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        response = ask()
        assert response.status == 200
        assert response.json() == {"ready": True, "name": "日本"}

    def test_body_delimited_by_close(self, agent_answers):
        agent_answers(b"HTTP/1.1 500 Oops\r\n\r\npartial")
        assert ask().body == b"partial"

    def test_chunked_body(self, agent_answers):
        agent_answers(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n")
        assert ask().body == b"abcdef"

    def test_nothing_before_close_means_not_answering(self, agent_answers):
        agent_answers(b"")
        with pytest.raises(agent_client.AgentNotAnswering):
            ask()

    def test_cut_off_answer(self, agent_answers):
        agent_answers(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
        with pytest.raises(agent_client.AgentBadResponse, match="cut off"):
            ask()

    def test_not_http(self, agent_answers):
        agent_answers(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        with pytest.raises(agent_client.AgentBadResponse):
            ask()

    def test_deadline_is_the_sum_of_timeouts_plus_grace_and_margin(self):
        checks = [SimpleNamespace(timeout_s=t) for t in (30, 30, 5)]
        assert (
            agent_client.deadline_for_checks(checks)
            == 65 + 3 * agent_client.PER_CHECK_GRACE_S + agent_client.REQUEST_MARGIN_S
        )


class TestAgainstKubesim:
    def test_healthz_through_portforward(self, running_attempt):
        health = agent_client.healthz(running_attempt)
        assert health["ready"] is True
        assert health["setup_finished"] is True

    def test_run_checks_returns_results_in_check_order(self, running_attempt):
        checks = list(running_attempt.lab.checks.order_by("-order"))  # any order the caller chooses
        results = agent_client.run_checks(running_attempt, checks)
        assert [r["id"] for r in results] == [str(c.pk) for c in checks]
        assert all(r["exit_code"] == 1 for r in results)  # no hello.txt yet: test -f and cat both fail

    def test_a_command_saved_with_a_textareas_crlf_line_breaks_runs_line_by_line(self, running_attempt):
        check = running_attempt.lab.checks.first()
        check.command = "cd /tmp\r\npwd"  # as admin's textarea posts a command of two lines
        [result] = agent_client.run_checks(running_attempt, [check])
        assert (result["exit_code"], result["stdout"], result["stderr"]) == (0, "/tmp\n", "")

    def test_bad_token(self, running_attempt):
        running_attempt.agent_token = "not-the-token-in-the-secret"
        with pytest.raises(agent_client.AgentTokenRejected) as caught:
            agent_client.healthz(running_attempt)
        assert caught.value.status == 401

    def test_vm_not_running(self, cluster, running_attempt):
        running_attempt.vm_name = "attempt-999999999"
        with pytest.raises(agent_client.VMNotRunning) as caught:
            agent_client.healthz(running_attempt)
        assert caught.value.status == 404

    def test_vm_still_starting(self, cluster, lab_a, student_a):
        cluster.admin.configure(pending_delay=30)
        try:
            attempt = new_attempt_on_cluster(lab=lab_a, student=student_a, wait=False)
            try:
                with pytest.raises(agent_client.VMNotRunning) as caught:
                    agent_client.healthz(attempt)
                assert caught.value.status == 400
            finally:
                delete_vm(attempt)
        finally:
            cluster.admin.configure(pending_delay=0)

    def test_guest_without_agent_is_not_answering(self, cluster, lab_a, student_a):
        attempt = new_attempt_on_cluster(lab=lab_a, student=student_a, user_data="#cloud-config\n{}\n", wait=False)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    agent_client.healthz(attempt)
                except agent_client.AgentNotAnswering as exc:
                    assert exc.status == 500
                    break
                except agent_client.VMNotRunning:
                    assert time.monotonic() < deadline, "the VMI never reached Running"
                    time.sleep(0.1)
        finally:
            delete_vm(attempt)

    def test_overall_deadline(self, running_attempt):
        started = time.monotonic()
        with pytest.raises(agent_client.AgentTimeout):
            agent_client.agent_request(
                running_attempt,
                method="POST",
                path="/v1/run",
                json_body={"checks": [{"id": "slow", "command": "sleep 5", "timeout_s": 10}]},
                timeout_s=1.0,
            )
        assert time.monotonic() - started < 4.5  # the check sleeps 5 s: only the deadline ends the request sooner

    def test_check_timeout_is_reported_by_the_agent(self, running_attempt):
        check = running_attempt.lab.checks.first()
        check.command = "sleep 30"
        check.timeout_s = 1
        results = agent_client.run_checks(running_attempt, [check])
        assert results[0]["timed_out"] is True
        assert results[0]["exit_code"] is None

    def test_cluster_unreachable(self, settings, tmp_path, monkeypatch, lab_a, student_a):
        from grading.tests.builders import make_attempt
        from labs.kubevirt import client as kube_client

        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

        broken = tmp_path / "kubeconfig"
        broken.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
            "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
        )
        settings.KUBECONFIG = str(broken)
        kube_client.reset()
        try:
            with pytest.raises(agent_client.ClusterUnavailable, match="cannot reach the cluster API"):
                agent_client.healthz(make_attempt(lab=lab_a, student=student_a))
        finally:
            kube_client.reset()
