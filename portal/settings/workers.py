"""Celery: serialisation, acknowledgement, time limits, queues and the beat's periodic passes."""

from __future__ import annotations

from typing import Any

from kombu import Queue

from portal.settings.base import TIME_ZONE
from portal.settings.env import env_int
from portal.settings.lifecycle import ATTEMPT_SWEEP_INTERVAL_SECONDS, ATTEMPT_SYNC_INTERVAL_SECONDS, POOL_PASS_SECONDS
from portal.settings.stores import REDIS_KEY_PREFIX, REDIS_URL

CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Socket timeouts (above the worker's 1 s BRPOP): a broker that never answers must not hang a student's Start.
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
    "visibility_timeout": 3600,
    "socket_timeout": 5,
    "socket_connect_timeout": 5,
}
if REDIS_URL:
    CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = REDIS_KEY_PREFIX
else:
    # The in-memory transport polls its queues; its default of 1 s would add up to a second to every start.
    CELERY_BROKER_TRANSPORT_OPTIONS["polling_interval"] = 0.05
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 300)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 240)
CELERY_TIMEZONE = TIME_ZONE

# The beat's passes, and a warm Start's claim finish, have queues of their own that every worker also consumes, so
# they run as soon as a process is free rather than behind a backlog of starts; a pass stays valid a few periods.
CELERY_TASK_QUEUES = [Queue("celery"), Queue("periodic"), Queue("claims")]
CELERY_TASK_ROUTES = {"labs.tasks.finish_pool_claim": {"queue": "claims"}}


def periodic_options(interval: float) -> dict:
    return {"queue": "periodic", "expires": max(10.0, 3.0 * interval)}


CELERY_BEAT_SCHEDULE = {
    "labs-sync-attempts": {
        "task": "labs.tasks.sync_attempts",
        "schedule": float(ATTEMPT_SYNC_INTERVAL_SECONDS),
        "options": periodic_options(float(ATTEMPT_SYNC_INTERVAL_SECONDS)),
    },
    "labs-sweep-attempts": {
        "task": "labs.tasks.sweep_attempts",
        "schedule": float(ATTEMPT_SWEEP_INTERVAL_SECONDS),
        "options": periodic_options(float(ATTEMPT_SWEEP_INTERVAL_SECONDS)),
    },
    "labs-tend-pools": {
        "task": "labs.tasks.tend_pools",
        "schedule": float(POOL_PASS_SECONDS),
        "options": periodic_options(float(POOL_PASS_SECONDS)),
    },
    # Grading runs whose worker never came or died, so they stop showing as in progress.
    "grading-sweep-runs": {
        "task": "grading.tasks.grading_runs_sweep",
        "schedule": float(ATTEMPT_SWEEP_INTERVAL_SECONDS),
        "options": periodic_options(float(ATTEMPT_SWEEP_INTERVAL_SECONDS)),
    },
}
