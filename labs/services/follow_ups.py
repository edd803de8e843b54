"""Follow-up lists of a namespace after a VM is made there, shared by the VMs made close together, so a VM that
starts fast is seen running without waiting for the beat's sync."""

from __future__ import annotations

import logging
import math

from django.conf import settings
from django.core.cache import cache

logger = logging.getLogger(__name__)

FOLLOW_UP_KEY = "labs:follow-up:{namespace}:{delay}"
# A queued follow-up that has not begun this long after it was due (its worker lost) no longer holds back the next.
FOLLOW_UP_PENDING_GRACE_SECONDS = 10


def watch_new_vm(namespace: str) -> None:
    """A VM was just made in ``namespace``: follow-up lists of it, and its chain of agent checks, unless under way
    (read in one round trip)."""
    from labs.services.agents import agent_wait_key, agent_wait_start

    agent_key = agent_wait_key(namespace)
    waiting = _waiting([*_follow_up_keys(namespace), agent_key])
    _schedule_follow_ups(namespace, waiting=waiting)
    if agent_key not in waiting:
        agent_wait_start(namespace=namespace)


def _waiting(keys: list[str]) -> dict:
    """Which of these markers are set; none when the cache does not answer (each add that follows tries again)."""
    try:
        return cache.get_many(keys)
    except Exception:
        return {}


def _follow_up_keys(namespace: str) -> list[str]:
    return [_follow_up_key(namespace, delay) for delay in settings.ATTEMPT_FOLLOW_UP_SECONDS]


def _schedule_follow_ups(namespace: str, *, waiting: dict | None = None) -> None:
    """For each delay ``d`` in ``ATTEMPT_FOLLOW_UP_SECONDS``, a list of the namespace within ``d``, shared: while one
    is waiting to run, it covers every VM made meanwhile, so a burst of starts costs a few lists, not four per VM."""
    if waiting is None:
        waiting = _waiting(_follow_up_keys(namespace))
    for delay in settings.ATTEMPT_FOLLOW_UP_SECONDS:
        if _follow_up_key(namespace, delay) in waiting:
            continue  # it lists after this VM was made, within its delay
        if not _schedule_follow_up(namespace, delay):
            return


def namespace_list_soon(namespace: str) -> None:
    """List the namespace at the first follow-up delay (for an agent that answered before a list showed its VMI
    Running: the page gets the phase times now)."""
    if settings.ATTEMPT_FOLLOW_UP_SECONDS:
        _schedule_follow_up(namespace, settings.ATTEMPT_FOLLOW_UP_SECONDS[0])


def _follow_up_key(namespace: str, delay: float) -> str:
    return FOLLOW_UP_KEY.format(namespace=namespace, delay=delay)


def _schedule_follow_up(namespace: str, delay: float) -> bool:
    """Queue a list ``delay`` seconds from now unless one of that delay is waiting; False when the broker refused."""
    from labs.tasks import sync_namespace

    key = _follow_up_key(namespace, delay)
    try:
        if cache.add(key, "1", timeout=math.ceil(delay) + FOLLOW_UP_PENDING_GRACE_SECONDS):
            try:
                sync_namespace.apply_async(
                    args=[namespace], kwargs={"follow_up": delay}, countdown=delay, expires=delay + 30
                )
            except Exception:
                cache.delete(key)
                raise
    except Exception:
        logger.warning("could not queue a follow-up sync of %s; the beat sync will see it", namespace, exc_info=True)
        return False
    return True


def follow_up_begins(*, namespace: str, delay: float) -> None:
    """A follow-up of ``delay`` begins, before it lists: a VM made from now on needs one of its own."""
    cache.delete(_follow_up_key(namespace, delay))
