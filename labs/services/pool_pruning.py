"""Pool VM rows pruned once long ended: deleted ones, and claimed ones whose attempt is over, more than
``POOL_VM_RETENTION_DAYS`` ago. Their hits and idle VM-seconds are added to their pool's counters first, so the
figures (``labs.pool_selectors.pool_stats``) do not change."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from labs.models import FINAL_STATES
from labs.pool_models import LabPool, PoolVm, PoolVmState

logger = logging.getLogger(__name__)

PRUNE_BATCH = 1000


def pool_vms_prune(*, now: datetime | None = None) -> int:
    """Delete up to ``PRUNE_BATCH`` long-ended pool VM rows, their figures kept on their pools; how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.POOL_VM_RETENTION_DAYS)
    ended = Q(state=PoolVmState.DELETED, ended_at__lt=cutoff) | Q(
        Q(attempt__isnull=True) | Q(attempt__state__in=FINAL_STATES),
        state=PoolVmState.CLAIMED,
        claimed_at__lt=cutoff,
    )
    with transaction.atomic():
        rows = list(
            PoolVm.objects.select_for_update(of=("self",))
            .filter(ended)
            .order_by("id")
            .only("id", "pool_id", "state", "created_at", "claimed_at", "ended_at", "attempt_id")[:PRUNE_BATCH]
        )
        if not rows:
            return 0
        figures: dict[int, tuple[int, float]] = {}
        for row in rows:
            hits, idle = figures.get(row.pool_id, (0, 0.0))
            figures[row.pool_id] = (hits + (row.state == PoolVmState.CLAIMED), idle + row.idle_seconds(now))
        for pool_id, (hits, idle) in figures.items():
            LabPool.objects.filter(id=pool_id).update(
                pruned_hits=F("pruned_hits") + hits, pruned_idle_seconds=F("pruned_idle_seconds") + idle
            )
        PoolVm.objects.filter(id__in=[row.id for row in rows]).delete()
    logger.info("pruned %d pool VM rows ended more than %d days ago", len(rows), settings.POOL_VM_RETENTION_DAYS)
    return len(rows)
