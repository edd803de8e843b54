"""Server processes freeze what their startup allocated, so that full collections skip it (portal.heap)."""

import os
import subprocess
import sys

from django.conf import settings


def frozen_after(statement: str) -> int:
    """gc.get_freeze_count() in a fresh interpreter after ``statement`` (a process's startup)."""
    program = f"import gc\n{statement}\nprint(gc.get_freeze_count())"
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                            cwd=settings.BASE_DIR, env=environment, check=True)
    return int(result.stdout.strip().splitlines()[-1])


def test_daphnes_application_freezes_its_startup_objects():
    # Hundreds of thousands: modules, the app registry, URL resolvers.
    assert frozen_after("import portal.asgi") > 100_000
    assert frozen_after("import django; django.setup()") == 0  # freezing is the server's, not every script's


def test_each_celery_pool_process_freezes_once_it_is_set_up():
    assert frozen_after(
        "import django; django.setup()\n"
        "from celery.signals import worker_process_init\n"
        "import portal.celery\n"
        "worker_process_init.send(sender=None)"
    ) > 100_000
