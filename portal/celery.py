"""The portal's Celery application, configured from Django settings (``CELERY_*``)."""

import os

from celery import Celery
from celery.signals import worker_process_init, worker_ready

from portal.heap import freeze_startup_objects

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
def _freeze_startup_objects(**kwargs) -> None:
    # Each pool process, once it has loaded the tasks and Django (portal.heap).
    freeze_startup_objects()


@worker_ready.connect
def _freeze_main_process(**kwargs) -> None:
    # The worker's own process, once it is ready: with the threads or solo pool the tasks run here, and prefork's
    # parent holds the consumer (its children froze themselves above).
    freeze_startup_objects()
