"""Celery tasks of the attempt lifecycle and the warm pools, each a thin call to a service; idempotent, and retrying
transient cluster errors with capped backoff."""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import asdict

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.utils.translation import gettext as _

from labs import sync_health, wording
from labs.kubevirt.operations import ClusterError
from labs.models import Attempt, TenantNamespace
from labs.selectors import namespaces_failing
from labs.services import agents, events, pool_claim, pools, provisioning, stopping, sweeping, tracking
from labs.services.namespaces import is_rbac_refusal, tenant_namespace_refused

logger = logging.getLogger(__name__)

BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 60.0
MAX_RETRIES = 8
SOFT_LIMIT = settings.ATTEMPT_TASK_SOFT_TIME_LIMIT_SECONDS
HARD_LIMIT = SOFT_LIMIT + 30
SYNC_LOCK_KEY = "labs:sync:lock"
SWEEP_LOCK_KEY = "labs:sweep:lock"
TEND_LOCK_KEY = "labs:pools:lock"
PRUNE_KEY = "labs:pools:pruned"
PRUNE_EVERY_SECONDS = 3600


@worker_ready.connect
def forget_pass_locks(**_kwargs) -> None:
    """Drop the pass locks a killed worker left, which would make every pass skip until they expire."""
    try:
        namespaces = TenantNamespace.objects.values_list("namespace", flat=True)
        locks = [tracking.NAMESPACE_LOCK_KEY.format(namespace=namespace) for namespace in namespaces]
        cache.delete_many([SYNC_LOCK_KEY, SWEEP_LOCK_KEY, *locks])
    except Exception:
        logger.warning("could not clear the sync and sweep locks; they expire by themselves", exc_info=True)
    finally:
        connection.close()  # this is the worker's parent process: no connection is kept for its future children


def backoff_seconds(retries: int, retry_after: float | None = None) -> float:
    """1, 2, 4 … seconds capped at a minute, with up to 25 % jitter; at least what the server asked for."""
    delay = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * (2**retries))
    delay += delay * secrets.randbelow(250) / 1000
    return max(delay, retry_after or 0.0)


def _retry_or_raise(task, error: ClusterError) -> None:
    if error.transient and task.request.retries < task.max_retries:
        raise task.retry(exc=error, countdown=backoff_seconds(task.request.retries, error.retry_after))


@shared_task(bind=True, acks_late=True, max_retries=MAX_RETRIES, soft_time_limit=SOFT_LIMIT, time_limit=HARD_LIMIT)
def provision_attempt(self, attempt_id: int) -> str:
    try:
        return provisioning.attempt_provision(attempt_id=attempt_id)
    except ClusterError as error:
        _retry_or_raise(self, error)
        logger.error("provisioning attempt %s failed for good: %s", attempt_id, error.message)
        said, refused = error.message, error.status == 403
        # RBAC: the tenant's Role is not applied yet; the next Starts are refused before they make an attempt.
        if is_rbac_refusal(error):
            tenant_namespace_refused(namespace=Attempt.objects.get(id=attempt_id).namespace, said=said)

        def reason() -> str:
            if refused:  # cluster_check says what to apply
                return wording.course_not_ready(said)
            return _("The cluster did not accept the lab's VM (%(error)s). Try again later.") % {"error": said}

        provisioning.attempt_fail(attempt_id=attempt_id, reason=reason)
        return "failed"


@shared_task(bind=True, acks_late=True, max_retries=MAX_RETRIES)
def teardown_attempt(self, attempt_id: int) -> str:
    try:
        return stopping.attempt_teardown(attempt_id=attempt_id)
    except ClusterError as error:
        _retry_or_raise(self, error)
        # Given up for now: the sweep sees the VM still there and tries again.
        logger.error("tearing down attempt %s failed: %s", attempt_id, error.message)
        return "error"


@shared_task(acks_late=False, soft_time_limit=SOFT_LIMIT, time_limit=HARD_LIMIT)
def sync_attempts() -> dict:
    # One sync at a time across workers: an overlapping one would only repeat the same lists.
    if not cache.add(SYNC_LOCK_KEY, "1", timeout=HARD_LIMIT):
        return {"skipped": True}
    # The heartbeat tells the readiness probe (``ops.health``) whether the sync loop can see the cluster.
    behind = not sync_health.check_sync().ok
    try:
        report = tracking.attempts_sync()
    except Exception as exc:
        sync_health.record_sync_error(message=f"{exc.__class__.__name__}: {exc}")
        _tell_pages(failing=namespaces_failing(), failed=True, everyone=behind)
        raise
    finally:
        cache.delete(SYNC_LOCK_KEY)
    failing = namespaces_failing()
    # One tenant's failing namespace is its students' trouble, not the loop's (operators see it per namespace);
    # a pass where no namespace with an attempt answers tells of the cluster.
    if report.errors and all(failing.values()):
        sync_health.record_sync_error(message="; ".join(report.errors))
    else:
        sync_health.record_sync_success()
    _tell_pages(failing=failing, failed=bool(report.errors), everyone=behind)
    return {**asdict(report), "namespaces": len(report.namespaces)}


def _tell_pages(*, failing: dict[str, bool], failed: bool, everyone: bool) -> None:
    """Push the cluster notice to the open attempt pages of each namespace whose trouble changed since the last
    pass (of every namespace after a stall); only a failed pass asks the cluster."""
    shared = wording.cluster_trouble() if failed else ""
    troubles = {namespace: "cluster" if fails else shared for namespace, fails in failing.items()}
    if changed := sync_health.notices_changed(troubles=troubles, everyone=everyone):
        events.cluster_notice_push(troubles=changed)


@shared_task(acks_late=False, soft_time_limit=SOFT_LIMIT, time_limit=HARD_LIMIT)
def sync_namespace(namespace: str, follow_up: float | None = None) -> dict:
    """List one namespace now: a follow-up after VMs were made there (``follow_up``: its delay), or on request."""
    if follow_up is not None:
        agents.follow_up_begins(namespace=namespace, delay=follow_up)
    try:
        return asdict(tracking.namespace_sync(namespace=namespace))
    except ClusterError as error:
        logger.info("follow-up sync of %s failed (%s); the beat sync will retry", namespace, error.message)
        return {"error": error.message}


@shared_task(bind=True, acks_late=False, soft_time_limit=SOFT_LIMIT, time_limit=HARD_LIMIT)
def await_agents(self, namespace: str, step: int = 0, waiting_before: int = 0, asked_at: float | None = None) -> dict:
    """Ask the namespace's booting agents, again after a countdown while some wait; run eagerly, it asks once."""
    began = time.time()
    since = None if asked_at is None else max(0.0, began - asked_at)
    try:
        running, waiting = agents.agents_check(namespace=namespace, since_last_round=since)
    except Exception:
        cache.delete(agents.agent_wait_key(namespace))
        raise
    chained = not (self.request.is_eager or self.request.called_directly)
    if waiting and chained and step < agents.agent_wait_max_steps():
        step = 0 if waiting > waiting_before else step + 1
        cache.set(agents.agent_wait_key(namespace), "1", timeout=agents.AGENT_WAIT_TTL_SECONDS)
        delay = agents.agent_wait_delay(step)
        self.apply_async(args=[namespace, step, waiting, began], countdown=delay, expires=delay + 60)
    else:
        cache.delete(agents.agent_wait_key(namespace))
    return {"running": running, "waiting": waiting}


@shared_task(acks_late=False, soft_time_limit=SOFT_LIMIT, time_limit=HARD_LIMIT)
def sweep_namespace(namespace: str) -> dict:
    try:
        return asdict(sweeping.namespace_sweep_now(namespace=namespace))
    except ClusterError as error:
        logger.info("sweep of %s failed (%s); the periodic sweep will retry", namespace, error.message)
        return {"error": error.message}


@shared_task(acks_late=False, soft_time_limit=SOFT_LIMIT, time_limit=HARD_LIMIT)
def sweep_attempts() -> dict:
    if not cache.add(SWEEP_LOCK_KEY, "1", timeout=HARD_LIMIT):
        return {"skipped": True}
    try:
        report = sweeping.attempts_sweep()
    finally:
        cache.delete(SWEEP_LOCK_KEY)
    return asdict(report)


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
    return {**asdict(refilled), "ready": checked.ready, "deleted": checked.deleted + refilled.deleted}
