"""``KubesimServer``: start kubesim as a subprocess for tests and benchmarks (plain-HTTP kubeconfig for the Python
client, a TLS one for kubectl), and ``AdminClient`` for its admin API; options and an example: kubesim/README.md,
"From tests and benchmarks"."""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
_DELAY_OPTIONS = {
    "pending_delay",
    "scheduling_delay",
    "scheduled_delay",
    "agent_delay",
    "stop_delay",
    "jitter",
    "phase_delay",
    "profile",
}


class KubesimError(RuntimeError):
    """kubesim did not start, or an admin call failed (the message carries the server's answer)."""


class AdminClient:
    """The ``/kubesim/`` admin endpoints, over plain urllib."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float = 30) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - kubesim's own http:// URL
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - our own http URL
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise KubesimError(f"{method} {path}: HTTP {exc.code}: {exc.read().decode(errors='replace')}") from exc
        return json.loads(raw) if raw else None

    # counters
    def counters(self) -> dict[str, Any]:
        """``{"total", "by_verb", "by_resource", "by_verb_resource": {"list virtualmachineinstances": n}, ...}``."""
        return self.request("GET", "/kubesim/counters")

    def reset_counters(self) -> None:
        self.request("POST", "/kubesim/counters/reset")

    # faults
    def inject_fault(
        self,
        *,
        latency: dict[str, float] | None = None,
        code: int | None = None,
        rate: float = 1.0,
        verbs: list[str] | None = None,
        resources: list[str] | None = None,
        retry_after: int | None = None,
        count: int | None = None,
        namespaces: list[str] | None = None,
        watch_drop_after: float | None = None,
        console_drop_after: float | None = None,
    ) -> dict[str, Any]:
        """Add faults. ``latency`` maps ``verb``, ``verb:resource`` or ``*`` to seconds; ``code`` (403 worded as
        RBAC's refusal, 500, 503 or 429 with Retry-After, 1 s unless ``retry_after`` says otherwise; 503 carries
        Retry-After only when ``retry_after`` is given) answers ``rate`` of the matching requests, at most
        ``count`` times, in ``namespaces`` only if given.
        Note that urllib3, under the kubernetes client, honours Retry-After on 429 and 503 by retrying."""
        spec: dict[str, Any] = {}
        if latency:
            spec["latency"] = latency
        if code is not None:
            spec["errors"] = [
                {
                    "code": code,
                    "rate": rate,
                    "verbs": verbs,
                    "resources": resources,
                    "retry_after": retry_after,
                    "count": count,
                    "namespaces": namespaces,
                }
            ]
        if watch_drop_after is not None:
            spec["watch_drop_after"] = watch_drop_after
        if console_drop_after is not None:
            spec["console_drop_after"] = console_drop_after
        return self.request("POST", "/kubesim/faults", spec)

    def faults(self) -> dict[str, Any]:
        return self.request("GET", "/kubesim/faults")

    def clear_faults(self) -> None:
        self.request("DELETE", "/kubesim/faults")

    def drop_watches(self, *, mode: str = "reset", resource: str | None = None) -> int:
        """End every open watch now: ``reset`` cuts the connection, ``close`` ends the stream cleanly."""
        return self.request("POST", "/kubesim/watches/drop", {"mode": mode, "resource": resource})["dropped"]

    def disconnect_consoles(
        self, *, namespace: str | None = None, name: str | None = None, portforwards: bool = False
    ) -> int:
        """Cut console sessions without a close frame (clients see 1006)."""
        return self.request(
            "POST", "/kubesim/consoles/disconnect", {"namespace": namespace, "name": name, "portforwards": portforwards}
        )["disconnected"]

    # cluster events
    def fail_vmi(self, namespace: str, name: str, *, reason: str = "Crashed", message: str = "") -> dict[str, Any]:
        return self.request("POST", f"/kubesim/vmis/{namespace}/{name}/fail", {"reason": reason, "message": message})

    def remove_node(self, name: str) -> None:
        self.request("DELETE", f"/kubesim/nodes/{name}")

    def drain_node(self, name: str) -> dict[str, Any]:
        """Cordon the node and evict its pods as ``kubectl drain`` does: ``{"evicted": [...], "refused": [...]}``."""
        return self.request("POST", f"/kubesim/nodes/{name}/drain")

    def uncordon_node(self, name: str) -> dict[str, Any]:
        return self.request("POST", f"/kubesim/nodes/{name}/uncordon")

    def add_node(self, name: str | None = None) -> dict[str, Any]:
        return self.request("POST", "/kubesim/nodes", {"name": name} if name else {})

    def set_kubevirt(
        self,
        *,
        version: str | None = None,
        feature_gates: list[str] | None = None,
        disabled_feature_gates: list[str] | None = None,
        image_volume_supported: bool | None = None,
    ) -> dict[str, Any]:
        """Change the KubeVirt CR (version, gates) and whether the container runtime mounts image volumes."""
        body: dict[str, Any] = {}
        if version is not None:
            body["version"] = version
        if feature_gates is not None:
            body["feature_gates"] = feature_gates
        if disabled_feature_gates is not None:
            body["disabled_feature_gates"] = disabled_feature_gates
        if image_volume_supported is not None:
            body["image_volume_supported"] = image_volume_supported
        return self.request("POST", "/kubesim/kubevirt", body)

    def configure(self, **settings: Any) -> dict[str, Any]:
        """Change delays (``pending_delay``, ``agent_delay``, ...) or ``bad_image_pattern`` at run time."""
        return self.request("POST", "/kubesim/config", settings)

    def plans(self) -> list[dict[str, Any]]:
        """The delays the timing profile drew per VMI (``pending``, ``scheduling``, ``scheduled``, ``agent``)."""
        return self.request("GET", "/kubesim/plans")["plans"]

    def guests(self) -> list[dict[str, Any]]:
        return self.request("GET", "/kubesim/guests")["guests"]

    def guest(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((g for g in self.guests() if g["namespace"] == namespace and g["name"] == name), None)

    def state(self) -> dict[str, Any]:
        return self.request("GET", "/kubesim/state")


def _flags(options: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in options.items():
        if value is None:
            continue
        if key == "image_volume_supported":
            if not value:
                args.append("--no-image-volume-support")
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            continue
        elif isinstance(value, (list, tuple)):
            args.append(f"{flag}={','.join(str(v) for v in value)}")
        else:
            args.append(f"{flag}={value}")  # one argument, even when the value starts with "-"
    return args


class KubesimServer:
    """A kubesim subprocess on a free loopback port, with a kubeconfig in ``directory``."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        token: str | None = None,
        admin_token: str | None = None,
        tls: bool = True,
        extra_args: list[str] | tuple[str, ...] = (),
        startup_timeout: float = 60.0,
        python: str = sys.executable,
        **options: Any,
    ) -> None:
        self._tempdir = None
        if directory is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="kubesim-")
            directory = self._tempdir.name
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.token = token or secrets.token_urlsafe(24)
        # The admin's token (kubeconfig-tls): the same as the portal's unless RBAC tells them apart.
        self.admin_token = admin_token or (secrets.token_urlsafe(24) if options.get("rbac") else self.token)
        self.kubeconfig = self.directory / "kubeconfig"
        self.tls_kubeconfig = self.directory / "kubeconfig-tls" if tls else None
        # The same HTTPS cluster with a client certificate and tls-server-name instead of a token (kind, k3s).
        self.cert_kubeconfig = self.directory / "kubeconfig-tls-cert" if tls else None
        self.log_path = self.directory / "kubesim.log"
        if not _DELAY_OPTIONS & options.keys():
            options["zero_delays"] = True
        self.options = options
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.python = python
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.admin = AdminClient("http://127.0.0.1", self.token)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> KubesimServer:
        command = [
            self.python,
            "-m",
            "kubesim",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--kubeconfig",
            str(self.kubeconfig),
            f"--token={self.token}",
            f"--admin-token={self.admin_token}",
            *_flags(self.options),
        ]
        if self.tls_kubeconfig is not None:
            command += ["--tls-kubeconfig", str(self.tls_kubeconfig)]
        command += self.extra_args
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, cwd=str(REPO_ROOT), env=env
            )
        finally:
            log.close()
        assert self.process.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        ready, _, _ = select.select([self.process.stdout], [], [], self.startup_timeout)
        line = self.process.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("http"):
            self.stop()
            raise KubesimError(f"kubesim did not start (first line {line!r}); log:\n{self._log_tail()}")
        self.url = line
        self.admin = AdminClient(self.url, self.token)
        while True:
            try:
                self.admin.request("GET", "/kubesim/state", timeout=2)
                break
            except (KubesimError, OSError) as exc:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise KubesimError(f"kubesim is not answering: {exc}; log:\n{self._log_tail()}") from exc
                time.sleep(0.05)
        return self

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if process is not None and process.stdout is not None:
            process.stdout.close()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    def __enter__(self) -> KubesimServer:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ---- clients -----------------------------------------------------------------------------------------
    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` configured from the written kubeconfig (the production path)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def admin_api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` as the cluster admin (system:masters), as kubectl is with
        ``tls_kubeconfig``; over plain HTTP."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"authorization": f"Bearer {self.admin_token}"}
        return client.ApiClient(configuration)

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    def auth_header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}
