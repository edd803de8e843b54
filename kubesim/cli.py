"""``python -m kubesim serve``: start the simulated cluster, print its URL, write a kubeconfig."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import json
import logging
import os
import secrets
import signal
import sys
import tempfile
from pathlib import Path

import yaml
from aiohttp import web

from kubesim.config import SimConfig
from kubesim.errors import ApiError
from kubesim.profiles import PROFILES

LOOPBACK = ("127.0.0.1", "::1", "localhost")
# The collector's thresholds once serving (young, middle, old). Every stored object lives until it is deleted and
# every request allocates thousands that reference counting frees: with Python's defaults (700, 10, 10) a burst of
# VM starts spent a fifth of kubesim's CPU collecting, walking the ever larger store again and again.
SERVER_GC_THRESHOLDS = (50_000, 20, 100)


def _gates(text: str) -> list[str]:
    return [gate.strip() for gate in text.split(",") if gate.strip()]


def build_parser() -> argparse.ArgumentParser:
    defaults = SimConfig()
    parser = argparse.ArgumentParser(prog="python -m kubesim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the API server")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default 0)")
    serve.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host (guests are real shells on this machine)",
    )
    serve.add_argument("--kubeconfig", required=True, help="path of the kubeconfig to write")
    serve.add_argument("--token", default=None, help="bearer token clients must send (default: random)")
    serve.add_argument(
        "--admin-token",
        default=None,
        help="the admin's bearer token, written into --tls-kubeconfig (default: --token, or random with --rbac)",
    )
    serve.add_argument(
        "--rbac",
        action="store_true",
        help="authorize --token as the portal's service account (system:serviceaccount:lab-portal:lab-portal) "
        "by the Roles and bindings stored; the admin token and client certificates stay cluster-admin",
    )
    serve.add_argument(
        "--rbac-manifest",
        dest="rbac_manifests",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML objects to create at start, as a cluster admin (e.g. deploy/rbac.yaml; repeatable)",
    )
    serve.add_argument(
        "--tls-kubeconfig",
        default=None,
        help="also serve HTTPS (self-signed) on --tls-port and write a kubeconfig for it here; "
        "kubectl sends bearer tokens only over TLS",
    )
    serve.add_argument("--tls-port", type=int, default=0, help="HTTPS port with --tls-kubeconfig (0: free one)")
    serve.add_argument("--context", default="kubesim", help="context, cluster and user name in the kubeconfig")
    serve.add_argument("--namespace", default="default", help="namespace of the kubeconfig context")
    for name, help_text in (
        ("pending-delay", "seconds a VMI stays Pending"),
        ("scheduling-delay", "seconds a VMI stays Scheduling (image pull, launcher start)"),
        ("scheduled-delay", "seconds a VMI stays Scheduled (domain boot)"),
        ("agent-delay", "seconds from Running to AgentConnected"),
        ("stop-delay", "seconds a deleted running VMI takes to shut down"),
        ("jitter", "up to this many seconds added at random to each delay"),
        ("restart-backoff", "first CrashLoopBackOff delay (doubles, max 300 s)"),
        ("image-pull-backoff", "first ImagePullBackOff delay (doubles, max 300 s)"),
    ):
        attribute = name.replace("-", "_")
        serve.add_argument(
            f"--{name}",
            type=float,
            default=getattr(defaults, attribute),
            help=f"{help_text} (default {getattr(defaults, attribute)})",
        )
    serve.add_argument(
        "--phase-delay",
        type=float,
        default=None,
        help="shorthand: Pending, Scheduling and Scheduled each last this many seconds",
    )
    serve.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="",
        help="draw each VMI's phase delays and its guest's boot from real timings (README: timing profiles); "
        "replaces the delays above but --stop-delay; --zero-delays wins over it",
    )
    serve.add_argument(
        "--zero-delays", action="store_true", help="set every phase delay and the jitter to 0 (and no --profile)"
    )
    serve.add_argument("--nodes", type=int, default=defaults.nodes, help="number of nodes")
    serve.add_argument("--node-cpu", default=defaults.node_cpu, help="allocatable CPU per node")
    serve.add_argument("--node-memory", default=defaults.node_memory, help="allocatable memory per node")
    serve.add_argument("--node-pods", type=int, default=defaults.node_pods, help="allocatable pods per node")
    serve.add_argument(
        "--guest",
        choices=("shell", "vm", "none"),
        default=defaults.guest,
        help="shell: bash on a pty, cloud-init and the lab agent per VMI; vm: a QEMU VM per VMI; "
        "none: loopback console",
    )
    serve.add_argument(
        "--guest-image",
        dest="guest_images",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="vm: a guest image directory (guest/image/build), for every containerDisk or for NAME",
    )
    serve.add_argument(
        "--guest-max-cpus",
        type=int,
        default=defaults.guest_max_cpus,
        help="vm: at most this many vCPUs per guest, whatever the VMI asks (0: no cap)",
    )
    serve.add_argument(
        "--guest-max-memory-mib",
        type=int,
        default=defaults.guest_max_memory_mib,
        help="vm: at most this much guest memory per guest, in MiB (0: no cap)",
    )
    serve.add_argument(
        "--guest-python", default=defaults.guest_python, help="python3 the guests run the lab agent with"
    )
    serve.add_argument("--kubernetes-version", default=defaults.kubernetes_version)
    serve.add_argument("--kubevirt-version", default=defaults.kubevirt_version)
    serve.add_argument("--feature-gates", type=_gates, default=[], help="comma-separated gates to enable")
    serve.add_argument("--disabled-feature-gates", type=_gates, default=[], help="comma-separated gates to disable")
    serve.add_argument(
        "--no-image-volume-support",
        dest="image_volume_supported",
        action="store_false",
        help="the container runtime cannot mount image volumes (containerd < 2.3)",
    )
    serve.add_argument(
        "--bad-image-pattern",
        default=defaults.bad_image_pattern,
        help="regular expression of containerDisk images that fail to pull",
    )
    serve.add_argument(
        "--watch-history",
        type=int,
        default=defaults.watch_history,
        help="events kept per resource for watches; older resourceVersions get 410",
    )
    serve.add_argument("--bookmark-interval", type=float, default=defaults.bookmark_interval)
    serve.add_argument(
        "--watch-timeout",
        type=float,
        default=defaults.watch_timeout,
        help="longest watch when the client sets no timeoutSeconds",
    )
    serve.add_argument(
        "--launcher-fixed-overhead",
        default=defaults.launcher_fixed_overhead,
        help="fixed part of the virt-launcher memory overhead",
    )
    serve.add_argument("--seed", type=int, default=None, help="random seed (names, IPs, jitter)")
    faults = serve.add_argument_group("faults", "injected from the start; the admin API can add and clear more")
    faults.add_argument("--faults", default=None, help="JSON fault specification (as POST /kubesim/faults)")
    faults.add_argument(
        "--latency",
        action="append",
        default=[],
        metavar="VERB[:RESOURCE]=SECONDS",
        help="added latency, e.g. list=0.2 or create:virtualmachines=1 (repeatable)",
    )
    faults.add_argument(
        "--error",
        action="append",
        default=[],
        metavar="CODE:RATE[:VERBS[:RESOURCES]]",
        help="answer CODE (500, 503, 429) to RATE of requests, e.g. 503:0.1:list,watch (repeatable)",
    )
    faults.add_argument("--watch-drop-after", type=float, default=None, help="cut every watch after S seconds")
    faults.add_argument(
        "--console-drop-after", type=float, default=None, help="cut every console session after S seconds"
    )
    serve.add_argument("--log-level", default="INFO")
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    config = SimConfig()
    for field in (
        "pending_delay",
        "scheduling_delay",
        "scheduled_delay",
        "agent_delay",
        "stop_delay",
        "jitter",
        "profile",
        "restart_backoff",
        "image_pull_backoff",
        "nodes",
        "node_cpu",
        "node_memory",
        "node_pods",
        "guest",
        "guest_python",
        "guest_images",
        "guest_max_cpus",
        "guest_max_memory_mib",
        "kubernetes_version",
        "kubevirt_version",
        "feature_gates",
        "disabled_feature_gates",
        "image_volume_supported",
        "bad_image_pattern",
        "watch_history",
        "bookmark_interval",
        "watch_timeout",
        "launcher_fixed_overhead",
        "seed",
        "rbac",
        "rbac_manifests",
    ):
        setattr(config, field, getattr(args, field))
    if args.phase_delay is not None:
        config.pending_delay = config.scheduling_delay = config.scheduled_delay = args.phase_delay
    if args.zero_delays:
        for field in ("pending_delay", "scheduling_delay", "scheduled_delay", "agent_delay", "stop_delay", "jitter"):
            setattr(config, field, 0.0)
        config.profile = ""
    both = set(config.feature_gates) & set(config.disabled_feature_gates)
    if both:
        raise SystemExit(
            f'feature gate "{sorted(both)[0]}" exists on both --feature-gates and --disabled-feature-gates'
        )
    return config


def fault_spec(args: argparse.Namespace) -> dict:
    """The fault flags as one admin-API fault specification; a malformed flag stops the server with a reason."""
    spec: dict = json.loads(args.faults) if args.faults else {}
    if not isinstance(spec, dict):
        raise SystemExit("--faults must be a JSON object")
    latency = spec.setdefault("latency", {})
    for item in args.latency:
        key, _, seconds = item.partition("=")
        if not key or not seconds:
            raise SystemExit(f"--latency {item!r}: expected VERB[:RESOURCE]=SECONDS")
        latency[key] = seconds
    errors = spec.setdefault("errors", [])
    for item in args.error:
        parts = item.split(":")
        if len(parts) < 2:
            raise SystemExit(f"--error {item!r}: expected CODE:RATE[:VERBS[:RESOURCES]]")
        errors.append(
            {
                "code": parts[0],
                "rate": parts[1],
                "verbs": parts[2] if len(parts) > 2 else None,
                "resources": parts[3] if len(parts) > 3 else None,
            }
        )
    for key in ("watch_drop_after", "console_drop_after"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    return spec


def write_kubeconfig(
    path: Path,
    *,
    url: str,
    token: str | None,
    context: str,
    namespace: str,
    ca_pem: bytes | None = None,
    client_pair: tuple[bytes, bytes] | None = None,
    server_name: str | None = None,
) -> None:
    cluster: dict[str, str] = {"server": url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    if server_name:
        cluster["tls-server-name"] = server_name
    user: dict[str, str] = {"token": token} if token else {}
    if client_pair is not None:
        user["client-certificate-data"] = base64.b64encode(client_pair[0]).decode()
        user["client-key-data"] = base64.b64encode(client_pair[1]).decode()
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": user}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context, "namespace": namespace}}],
        "current-context": context,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        yaml.safe_dump(document, handle, sort_keys=False)
    os.replace(temporary, path)


def settle_heap() -> None:
    """Collect what startup left, move everything still alive out of the collector's sight (modules, schemas, the
    bootstrapped cluster) and set the serving thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVER_GC_THRESHOLDS)


async def serve(args: argparse.Namespace) -> None:
    from kubesim.server import KubeSim

    config = config_from_args(args)
    token = args.token or secrets.token_urlsafe(32)
    admin_token = args.admin_token or (secrets.token_urlsafe(32) if config.rbac else token)
    sim = KubeSim(config=config, token=token, admin_token=admin_token)
    try:
        sim.faults.update(fault_spec(args))
    except (ApiError, ValueError) as exc:
        raise SystemExit(f"kubesim: invalid fault flags: {exc}") from exc
    # handler_cancellation: a watch whose client went away ends at once instead of at its next event.
    runner = web.AppRunner(
        sim.app(), access_log=None, handle_signals=False, shutdown_timeout=2.0, handler_cancellation=True
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=1024, reuse_address=True)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{port}"
    write_kubeconfig(Path(args.kubeconfig), url=url, token=token, context=args.context, namespace=args.namespace)
    if args.tls_kubeconfig:
        from kubesim.tls import SERVER_NAME, self_signed

        with tempfile.TemporaryDirectory(prefix="kubesim-tls-") as scratch:
            context, ca_pem, client_pair = self_signed(Path(scratch), args.host)
        tls_site = web.TCPSite(runner, args.host, args.tls_port, ssl_context=context, backlog=1024, reuse_address=True)
        await tls_site.start()
        tls_port = tls_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        write_kubeconfig(
            Path(args.tls_kubeconfig),
            url=f"https://{host}:{tls_port}",
            token=admin_token,
            context=args.context,
            namespace=args.namespace,
            ca_pem=ca_pem,
        )
        # Beside it, the same cluster as kind and k3s write it: a client certificate, and tls-server-name.
        write_kubeconfig(
            Path(args.tls_kubeconfig + "-cert"),
            url=f"https://{host}:{tls_port}",
            token=None,
            context=args.context,
            namespace=args.namespace,
            ca_pem=ca_pem,
            client_pair=client_pair,
            server_name=SERVER_NAME,
        )
        logging.getLogger("kubesim").info(
            "kubesim also serving https://%s:%s (kubeconfig %s)", host, tls_port, args.tls_kubeconfig
        )
    settle_heap()
    print(url, flush=True)
    logging.getLogger("kubesim").info(
        "kubesim serving %s (kubeconfig %s, guest %s)", url, args.kubeconfig, config.guest
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        sim.guests.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        if args.host not in LOOPBACK and not args.allow_remote:
            print(
                f"kubesim: refusing to bind {args.host}: guests are real shells on this machine; "
                "add --allow-remote to bind a non-loopback address",
                file=sys.stderr,
            )
            return 2
        logging.basicConfig(
            stream=sys.stderr,
            level=getattr(logging, args.log_level.upper(), logging.INFO),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args))
    return 0
