"""``manage.py run_portal``: the whole portal from one command. In the embedded default it also supervises kubesim
and runs the Celery worker and beat in-process; with ``REDIS_URL`` or a cluster configured those are separate.
A SIGTERM ends it within ``--shutdown-grace`` seconds (``portal.embedded``)."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from portal.embedded import BoundedShutdown, GuestUnavailable, KubesimSupervisor, guest_choice


def start_kubesim(*, kubeconfig: Path, log_path: Path, extra_args: list[str]) -> subprocess.Popen:
    """Start kubesim on a free loopback port; return once it has written its kubeconfig."""
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    if kubeconfig.exists():
        kubeconfig.unlink()
    log = log_path.open("ab")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubesim",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
            "--tls-kubeconfig",
            str(kubeconfig.with_name("kubeconfig-kubectl")),
            *extra_args,
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=settings.BASE_DIR,
    )
    atexit.register(stop_process, process)
    url_line = process.stdout.readline().decode().strip() if process.stdout else ""
    deadline = time.monotonic() + 30
    while not kubeconfig.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise CommandError(f"kubesim did not start; see {log_path}")
        time.sleep(0.1)
    sys.stdout.write(
        f"kubesim: {url_line} (log: {log_path}; for kubectl: KUBECONFIG={kubeconfig.with_name('kubeconfig-kubectl')})\n"
    )
    return process


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def start_embedded_celery() -> None:
    """Run a Celery worker and beat in threads of this process, on the in-memory transport."""
    from celery import beat

    from portal.celery import app

    worker = app.WorkController(
        pool_cls="threads",
        concurrency=4,
        loglevel="INFO",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    threading.Thread(target=worker.start, name="celery-worker", daemon=True).start()
    schedule = settings.VAR_DIR / "celerybeat-schedule"
    beat_service = beat.EmbeddedService(app, thread=True, schedule_filename=str(schedule))
    beat_service.start()


class Command(BaseCommand):
    help = "Serve the portal with daphne; in the embedded default also start kubesim, a Celery worker and beat."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=os.environ.get("PORTAL_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORTAL_PORT", "8000")))
        parser.add_argument(
            "--kubesim-arg",
            action="append",
            default=[],
            help="Extra argument for kubesim (repeatable), e.g. --kubesim-arg=--phase-delay=1",
        )
        parser.add_argument("--no-kubesim", action="store_true", help="Do not start kubesim.")
        parser.add_argument(
            "--shutdown-grace",
            type=float,
            default=float(os.environ.get("PORTAL_SHUTDOWN_GRACE_SECONDS", "10")),
            help="Seconds that requests and tasks in flight get after SIGTERM before the process exits anyway.",
        )

    def handle(
        self, *args, host: str, port: int, kubesim_arg: list[str], no_kubesim: bool, shutdown_grace: float, **options
    ) -> None:
        # First: importing daphne installs its asyncio Twisted reactor, which the supervisor and shutdown hook use.
        from daphne.cli import CommandLineInterface
        from twisted.internet import reactor as twisted_reactor

        # Twisted types its reactor through zope interfaces, which mypy reads as unbound methods.
        reactor: Any = twisted_reactor

        if shutdown_grace < 0:
            raise CommandError(f"--shutdown-grace must be 0 seconds or more, not {shutdown_grace:g}.")
        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        supervisor = None
        if not (no_kubesim or settings.KUBECONFIG or in_cluster):
            try:
                choice = guest_choice(kubesim_arg)
            except GuestUnavailable as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"kubesim guests: {choice.guest} ({choice.reason})")
            supervisor = self._supervise_kubesim([*choice.kubesim_args, *kubesim_arg])
        if settings.CELERY_EMBEDDED_WORKER:
            start_embedded_celery()
            self.stdout.write("celery: worker and beat running in this process (in-memory transport)")
        self.stdout.write(self.style.SUCCESS(f"Portal: http://{host}:{port}/  (admin: http://{host}:{port}/admin/)"))
        shutdown = BoundedShutdown(
            grace_seconds=shutdown_grace,
            cleanup=(lambda: supervisor.stop(timeout=3)) if supervisor is not None else (lambda: None),
        )
        reactor.addSystemEventTrigger("before", "shutdown", shutdown.begin)
        if supervisor is not None:
            reactor.addSystemEventTrigger("before", "shutdown", supervisor.shutting_down)
        CommandLineInterface().run(["--bind", host, "--port", str(port), "ops.asgi:application"])
        if supervisor is not None:
            supervisor.stop()
            if supervisor.gave_up:
                raise CommandError(supervisor.gave_up)

    def _supervise_kubesim(self, extra_args: list[str]) -> KubesimSupervisor:
        from twisted.internet import reactor as twisted_reactor

        # Twisted types its reactor through zope interfaces, which mypy reads as unbound methods.
        reactor: Any = twisted_reactor

        from labs.kubevirt import client as kube_client

        kubeconfig = Path(settings.EMBEDDED_KUBECONFIG)
        log_path = settings.VAR_DIR / "kubesim.log"
        supervisor = KubesimSupervisor(
            start=lambda more: start_kubesim(kubeconfig=kubeconfig, log_path=log_path, extra_args=[*extra_args, *more]),
            restarted=kube_client.reset,  # the new kubesim has a new token
            give_up=lambda _message: reactor.callFromThread(reactor.stop),
            kubeconfigs=(kubeconfig, kubeconfig.with_name("kubeconfig-kubectl")),
            log_path=log_path,
        )
        supervisor.run()
        return supervisor
