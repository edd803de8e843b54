"""Celery tasks of the warm pools: the claim's second half (queued by a Start that took a pool VM) and the beat's
pass that tends the pools (agents asked, failed VMs replaced, pools refilled or drained, long-ended rows pruned)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.core.cache import cache

from labs.kubevirt.operations import ClusterError
from labs.services import pool_claim, pools
from labs.tasks import HARD_LIMIT, MAX_RETRIES, SOFT_LIMIT, _retry_or_raise

logger = logging.getLogger(__name__)

TEND_LOCK_KEY = "labs:pools:lock"
PRUNE_KEY = "labs:pools:pruned"
PRUNE_EVERY_SECONDS = 3600


@shared_task(bind=True, acks_late=True, max_retries=MAX_RETRIES, soft_time_limit=SOFT_LIMIT, time_limit=HARD_LIMIT)
def finish_pool_claim(self, attempt_id: int) -> str:
    try:
        return pool_claim.pool_claim_finish(attempt_id=attempt_id)
    except ClusterError as error:
        _retry_or_raise(self, error)
        # Given up: the attempt stays requested until the sweep queues it again (its start timeout fails it).
        logger.error("finishing the pool claim of attempt %s failed: %s", attempt_id, error.message)
        return "error"


@shared_task(acks_late=False, soft_time_limit=SOFT_LIMIT, time_limit=HARD_LIMIT)
def tend_pools() -> dict:
    # One pass at a time across workers: two would make the same VMs' worth twice.
    if not cache.add(TEND_LOCK_KEY, "1", timeout=HARD_LIMIT):
        return {"skipped": True}
    try:
        checked = pools.pool_vms_check()
        refilled = pools.pools_refill()
        # Long-ended rows go hourly: the pass runs every few seconds, and they pile up over days.
        if cache.add(PRUNE_KEY, "1", timeout=PRUNE_EVERY_SECONDS):
            pools.pool_vms_prune()
    finally:
        cache.delete(TEND_LOCK_KEY)
    return {
        "ready": checked.ready,
        "created": refilled.created,
        "deleted": checked.deleted + refilled.deleted,
        "errors": refilled.errors,
        "held": refilled.held,
    }
