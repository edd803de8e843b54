"""Server processes freeze what their startup allocated, so that full collections skip it (portal.heap)."""

import os
import subprocess
import sys

from django.conf import settings


def frozen_after(statement: str) -> int:
    """gc.get_freeze_count() in a fresh interpreter after ``statement`` (a process's startup)."""
    program = f"import gc\n{statement}\nprint(gc.get_freeze_count())"
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"}
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=settings.BASE_DIR,
        env=environment,
        check=True,
    )
    return int(result.stdout.strip().splitlines()[-1])


def test_daphnes_application_freezes_its_startup_objects():
    # Hundreds of thousands: modules, the app registry, URL resolvers.
    assert frozen_after("import ops.asgi") > 100_000
    assert frozen_after("import django; django.setup()") == 0  # freezing is the server's, not every script's


def thresholds_after(statement: str) -> tuple[int, ...]:
    """gc.get_threshold() in a fresh interpreter after ``statement``."""
    program = f"import gc\n{statement}\nprint(*gc.get_threshold())"
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"}
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=settings.BASE_DIR,
        env=environment,
        check=True,
    )
    return tuple(int(n) for n in result.stdout.strip().splitlines()[-1].split())


def test_serving_processes_collect_young_objects_less_often_and_scripts_keep_the_default():
    from portal.heap import SERVER_GC_THRESHOLDS

    assert thresholds_after("import ops.asgi") == SERVER_GC_THRESHOLDS
    assert thresholds_after("import django; django.setup()") == (700, 10, 10)


def test_each_celery_pool_process_freezes_once_it_is_set_up():
    assert (
        frozen_after(
            "import django; django.setup()\n"
            "from celery.signals import worker_process_init\n"
            "import portal.celery\n"
            "worker_process_init.send(sender=None)"
        )
        > 100_000
    )


def test_the_celery_worker_process_freezes_once_ready_for_thread_and_solo_pools():
    # With --pool threads or solo no pool process is forked, and the tasks run in the worker's own process.
    assert (
        frozen_after(
            "import django; django.setup()\n"
            "from celery.signals import worker_ready\n"
            "import portal.celery\n"
            "worker_ready.send(sender=None)"
        )
        > 100_000
    )
