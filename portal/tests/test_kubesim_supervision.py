"""kubesim under run_portal: started again when it exits, with a note in the log; the portal stopped with a clear
message when it keeps exiting; never a defunct child left behind."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from portal.embedded import KubesimSupervisor, served_port


def child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_child_that_keeps_exiting_stops_the_portal_with_a_clear_message(tmp_path, caplog):
    started: list[subprocess.Popen] = []
    gave_up = threading.Event()

    def start(extra_args: list[str]) -> subprocess.Popen:
        started.append(child("raise SystemExit(3)"))
        return started[-1]

    supervisor = KubesimSupervisor(
        start=start,
        restarted=lambda: None,
        give_up=lambda message: gave_up.set(),
        kubeconfigs=(),
        log_path=tmp_path / "kubesim.log",
        max_restarts=2,
    )
    with caplog.at_level(logging.ERROR, logger="portal.embedded"):
        supervisor.run()
        assert gave_up.wait(20), "the supervisor never gave up"
    assert len(started) == 3  # the first start and two restarts
    assert all(process.returncode == 3 for process in started)  # every one reaped, none left defunct
    assert supervisor.gave_up.startswith(
        "kubesim, the portal's cluster, exited with status 3, 3 times within 60 s; "
        "stopping the portal rather than running without a cluster."
    )
    assert str(tmp_path / "kubesim.log") in supervisor.gave_up
    assert sum("starting it again" in record.getMessage() for record in caplog.records) == 2


def test_a_restart_reuses_the_ports_and_tells_the_portal(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters:\n- cluster: {server: 'http://127.0.0.1:41234'}\n  name: kubesim\n")
    calls: list[list[str]] = []
    restarted = threading.Event()

    def start(extra_args: list[str]) -> subprocess.Popen:
        calls.append(extra_args)
        # The first one dies at once; the one started again keeps running until stopped.
        return child("raise SystemExit(0)" if len(calls) == 1 else "import time; time.sleep(60)")

    supervisor = KubesimSupervisor(
        start=start,
        restarted=restarted.set,
        give_up=lambda message: None,
        kubeconfigs=(kubeconfig, Path(tmp_path / "missing")),
        log_path=tmp_path / "kubesim.log",
    )
    supervisor.run()
    try:
        assert restarted.wait(20)
        assert calls == [[], ["--port", "41234"]]
        assert supervisor.gave_up is None
    finally:
        supervisor.stop(timeout=5)
    assert served_port(kubeconfig) == 41234 and served_port(tmp_path / "missing") is None


def test_an_exit_while_the_portal_shuts_down_is_not_taken_for_a_crash(tmp_path):
    calls: list[list[str]] = []
    started: list[subprocess.Popen] = []

    def start(extra_args: list[str]) -> subprocess.Popen:
        calls.append(extra_args)
        started.append(child("pass"))  # a Ctrl-C in the terminal ends kubesim a moment before the portal hears of it
        return started[-1]

    supervisor = KubesimSupervisor(
        start=start,
        restarted=lambda: None,
        give_up=lambda message: None,
        kubeconfigs=(),
        log_path=tmp_path / "kubesim.log",
    )
    supervisor.run()
    # The shutdown is heard just after the exit, however long the child took to start on a loaded host.
    deadline = time.monotonic() + 20
    while not started or started[0].poll() is None:
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    supervisor.shutting_down()
    time.sleep(2)
    assert len(calls) == 1 and supervisor.gave_up is None
