"""Manifests and waiting helpers shared by kubesim's tests."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

GROUP, VERSION = "kubevirt.io", "v1"


def vm_manifest(
    name: str,
    *,
    namespace: str = "default",
    run_strategy: str | None = "Always",
    running: bool | None = None,
    memory: str = "1Gi",
    cores: int | None = None,
    image: str = "quay.io/containerdisks/fedora:latest",
    labels: dict[str, str] | None = None,
    cloud_init_secret: str | None = None,
    user_data: str | None = None,
) -> dict[str, Any]:
    """A VM as the portal builds it: masquerade pod network, containerDisk, optional cloud-init."""
    spec: dict[str, Any] = {
        "domain": {
            "devices": {
                "disks": [{"name": "containerdisk", "disk": {"bus": "virtio"}}],
                "interfaces": [{"name": "default", "masquerade": {}}],
            },
            "resources": {"requests": {"memory": memory}},
        },
        "networks": [{"name": "default", "pod": {}}],
        "volumes": [{"name": "containerdisk", "containerDisk": {"image": image}}],
    }
    if cores:
        spec["domain"]["cpu"] = {"cores": cores}
    if cloud_init_secret or user_data:
        spec["domain"]["devices"]["disks"].append({"name": "cloudinit", "disk": {"bus": "virtio"}})
        source = {"secretRef": {"name": cloud_init_secret}} if cloud_init_secret else {"userData": user_data}
        spec["volumes"].append({"name": "cloudinit", "cloudInitNoCloud": source})
    vm_spec: dict[str, Any] = {"template": {"metadata": {"labels": labels or {"app": name}}, "spec": spec}}
    if run_strategy is not None:
        vm_spec["runStrategy"] = run_strategy
    if running is not None:
        vm_spec["running"] = running
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": name}},
        "spec": vm_spec,
    }


def secret_manifest(name: str, user_data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "data": {"userdata": base64.b64encode(user_data.encode()).decode()},
    }


def wait_for(
    predicate: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def get_or_none(custom: Any, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
    """A kubevirt.io object, or None when the API answers 404."""
    from kubernetes.client.rest import ApiException

    try:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for item in ((obj or {}).get("status") or {}).get("conditions") or ():
        if item.get("type") == type_:
            return item
    return None


# A stand-in lab agent for guests: stdlib HTTP with the agent's CLI, answering /healthz with the token check.
FAKE_AGENT = """
import argparse, http.server, json, os, socketserver
parser = argparse.ArgumentParser()
for flag in ("--host", "--port", "--port-file", "--token-file", "--home", "--setup-marker", "--unix-socket"):
    parser.add_argument(flag)
args = parser.parse_args()
token = open(args.token_file).read().strip()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer " + token:
            self.send_response(401); self.end_headers(); return
        body = json.dumps({"ready": True, "home": os.environ.get("HOME"), "cwd": os.getcwd()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

if args.unix_socket:
    server = socketserver.UnixStreamServer(args.unix_socket, Handler)
else:
    server = http.server.HTTPServer((args.host, int(args.port)), Handler)
    with open(args.port_file, "w") as handle:
        handle.write(str(server.server_address[1]))
server.serve_forever()
"""


def agent_user_data(
    *, token: str, agent_source: str = FAKE_AGENT, extra_files: list[dict[str, Any]] | None = None
) -> str:
    """A #cloud-config that installs an agent and its token, as the portal's cloud-init does."""
    import yaml

    files = [
        {
            "path": "/opt/lab-agent/agent.py",
            "permissions": "0755",
            "encoding": "b64",
            "content": base64.b64encode(agent_source.encode()).decode(),
        },
        {"path": "/etc/lab-agent/token", "permissions": "0600", "content": token + "\n"},
    ]
    files += extra_files or []
    return "#cloud-config\n" + yaml.safe_dump({"write_files": files})
