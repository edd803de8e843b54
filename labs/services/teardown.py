"""Taking an attempt's VM off the cluster: the final grading run first when its agent ever answered, then the VM
and its Secret. Safe to run twice, like every write of ``labs.services.provisioning``."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from labs.kubevirt import operations
from labs.models import FINAL_STATES, Attempt, AttemptState
from labs.services.provisioning import attempt_end
from labs.services.stopping import StopReason, enqueue_teardown
from labs.signals import attempt_final_grading

logger = logging.getLogger(__name__)

# Set once a teardown's final grading has returned, so that its own retry (after a failed delete) is not taken for
# a second delivery still grading.
FINAL_GRADING_DONE_KEY = "labs:final-grading-done:{attempt_id}"


def grade_final(*, attempt: Attempt, trigger: str) -> None:
    """The grading app's last run before the VM goes; never raises (a grading failure must not keep a VM alive)."""
    for _receiver, outcome in attempt_final_grading.send_robust(sender=Attempt, attempt=attempt, trigger=trigger):
        if isinstance(outcome, Exception):
            logger.error(
                "attempt %s: the final grading run failed; deleting its VM anyway", attempt.id, exc_info=outcome
            )


def attempt_teardown(*, attempt_id: int) -> str:
    """For a stopping attempt: grade once more if its agent ever answered, then delete the VM (ending the attempt if
    it was gone already). For a failed one: delete what is left."""
    attempt = Attempt.objects.select_related("lab").filter(id=attempt_id).first()
    if attempt is None:
        return "missing"
    if attempt.state == AttemptState.STOPPING:
        if attempt.agent_ready_at is not None and attempt.vm_deleted_at is None:
            claimed = Attempt.objects.filter(id=attempt_id, final_grading_at__isnull=True).update(
                final_grading_at=timezone.now()
            )
            if claimed:
                trigger = "expiry" if attempt.stop_reason == StopReason.EXPIRED else "stop"
                grade_final(attempt=attempt, trigger=trigger)
                cache.set(
                    FINAL_GRADING_DONE_KEY.format(attempt_id=attempt_id),
                    "1",
                    timeout=settings.CELERY_TASK_TIME_LIMIT + 60,
                )
            elif _final_grading_elsewhere(attempt_id):
                # A second delivery of this teardown while the first grades: deleting the VM now would cut that
                # final run off. The first deletes it; if it died, the sweep queues the teardown again later.
                return "grading_elsewhere"
        existed = _delete_vm_and_secret(attempt)
        if not existed:
            attempt_end(attempt_id=attempt_id)
        return "deleted" if existed else "ended"
    if attempt.state in FINAL_STATES and attempt.vm_deleted_at is None and attempt.vm_name:
        _delete_vm_and_secret(attempt)
        return "cleaned"
    return "skipped"


def teardowns_resume(*, namespace: str) -> int:
    """The namespace answers again after failing: queue its stopping attempts' teardowns now, not at their retry."""
    ids = list(
        Attempt.objects.filter(
            namespace=namespace, state=AttemptState.STOPPING, vm_deleted_at__isnull=True
        ).values_list("id", flat=True)
    )
    for attempt_id in ids:
        enqueue_teardown(attempt_id)
    if ids:
        logger.info("cluster answers again in %s: teardown of %s resumed", namespace, ids)
    return len(ids)


def _final_grading_elsewhere(attempt_id: int) -> bool:
    """Whether another teardown is running the final grading now: claimed within the task time limit, not finished."""
    since = timezone.now() - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT)
    if not Attempt.objects.filter(id=attempt_id, vm_deleted_at__isnull=True, final_grading_at__gt=since).exists():
        return False
    return cache.get(FINAL_GRADING_DONE_KEY.format(attempt_id=attempt_id)) is None


def _delete_vm_and_secret(attempt: Attempt) -> bool:
    existed = operations.vm_and_secret_delete(namespace=attempt.namespace, name=attempt.vm_name)
    Attempt.objects.filter(id=attempt.id, vm_deleted_at__isnull=True).update(vm_deleted_at=timezone.now())
    return existed
