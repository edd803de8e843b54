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
# Socket timeouts: a broker that accepts connections but never answers would otherwise hang the request that
# queues a task (a student's Start) for good. They stay above the worker's 1 s BRPOP.
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

# The beat's passes (expiry, crashes, vanished VMs, orphans, stuck runs) have a queue of their own, which every
# worker consumes by default alongside the main one (alternately): behind a backlog of starts or teardowns in the
# main queue one runs as soon as a worker process is free, instead of after the backlog. A pass waiting for a free
# process stays valid for a few periods (an expiry of one period discarded every pass that had to wait).
# A warm Start's claim finish (labs.tasks_pools.finish_pool_claim) has one too: a student holding a ready pool VM
# waits a second or two for it, not behind a class's cold provisioning or a pool's refill in the main queue.
CELERY_TASK_QUEUES = [Queue("celery"), Queue("periodic"), Queue("claims")]
CELERY_TASK_ROUTES = {"labs.tasks_pools.finish_pool_claim": {"queue": "claims"}}


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
        "task": "labs.tasks_pools.tend_pools",
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
