"""Follow-up lists of a namespace after a VM is made there, shared by the VMs made close together, so a VM that
starts fast is seen running without waiting for the beat's sync."""

from __future__ import annotations

import logging
import math

from django.conf import settings
from django.core.cache import cache

logger = logging.getLogger(__name__)

FOLLOW_UP_KEY = "labs:follow-up:{namespace}:{delay}"
# A queued follow-up that has not begun this long after it was due (its worker lost, say) no longer holds back the
# next; the beat's sync lists the namespace meanwhile.
FOLLOW_UP_PENDING_GRACE_SECONDS = 10


def watch_new_vm(namespace: str) -> None:
    """A VM was just made in ``namespace``: follow-up lists of the namespace, and the checks of its booting agents
    (``labs.services.agents.agent_wait_start``: one chain per namespace). Which are under way already is read in
    one round trip; in a burst of starts, usually all of them."""
    from labs.services.agents import agent_wait_key, agent_wait_start

    agent_key = agent_wait_key(namespace)
    waiting = _waiting([*_follow_up_keys(namespace), agent_key])
    _schedule_follow_ups(namespace, waiting=waiting)
    if agent_key not in waiting:
        agent_wait_start(namespace=namespace)


def _waiting(keys: list[str]) -> dict:
    """Which of these markers of work under way are set, in one round trip; none when the cache does not answer (each
    add that follows tries again, and says so)."""
    try:
        return cache.get_many(keys)
    except Exception:
        return {}


def _follow_up_keys(namespace: str) -> list[str]:
    return [_follow_up_key(namespace, delay) for delay in settings.ATTEMPT_FOLLOW_UP_SECONDS]


def _schedule_follow_ups(namespace: str, *, waiting: dict | None = None) -> None:
    """List the namespace again shortly, so a VM that starts fast is seen running without waiting for the beat.

    Follow-ups are shared by the VMs a namespace creates close together: for each delay ``d`` in
    ``ATTEMPT_FOLLOW_UP_SECONDS`` at most one follow-up is waiting to run at a time. A VM created while one is
    waiting is covered by it, since it lists the namespace after this VM was created and at most ``d`` later; once
    it begins (``follow_up_begins``), the next VM queues another. Every VM is still looked at within each delay of
    its creation, while a burst of 100 starts costs a few dozen lists rather than four per VM, each of them listing
    the whole namespace; and the busier the worker, the longer a follow-up waits and the fewer are queued. Which
    are waiting is read in one round trip (``waiting``, when the caller read them): in a burst, usually all."""
    if waiting is None:
        waiting = _waiting(_follow_up_keys(namespace))
    for delay in settings.ATTEMPT_FOLLOW_UP_SECONDS:
        if _follow_up_key(namespace, delay) in waiting:
            continue  # it lists after this VM was made, within its delay
        if not _schedule_follow_up(namespace, delay):
            return


def namespace_list_soon(namespace: str) -> None:
    """List the namespace at the first follow-up delay (shared, like every follow-up, with the VMs created while it
    waits): for an agent that answered before any list showed its VMI Running, so that the page's progress gets
    the VMI's phase times now rather than at the next resync. Nothing when follow-ups are switched off."""
    if settings.ATTEMPT_FOLLOW_UP_SECONDS:
        _schedule_follow_up(namespace, settings.ATTEMPT_FOLLOW_UP_SECONDS[0])


def _follow_up_key(namespace: str, delay: float) -> str:
    return FOLLOW_UP_KEY.format(namespace=namespace, delay=delay)


def _schedule_follow_up(namespace: str, delay: float) -> bool:
    """Queue a list of the namespace ``delay`` seconds from now unless one of that delay is waiting already. False
    when the broker refused it (the beat sync will see the namespace instead)."""
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
    """A follow-up of ``delay`` begins, before it lists: a VM created from now on needs one of its own."""
    cache.delete(_follow_up_key(namespace, delay))
