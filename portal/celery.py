"""The portal's Celery application, configured from Django settings (``CELERY_*``)."""

import os

from celery import Celery
from celery.signals import worker_process_init, worker_ready

from portal.heap import freeze_startup_objects

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Each prefork pool process once it has loaded the tasks and Django, and the worker's own process once it is ready
# (the threads and solo pools run tasks there; prefork's parent holds the consumer).
@worker_process_init.connect
@worker_ready.connect
def _freeze_startup_objects(**kwargs) -> None:
    freeze_startup_objects()
