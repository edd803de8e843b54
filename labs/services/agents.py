"""After a VM is made: follow-up lists of its namespace, shared by the VMs made close together, and one chain of
``labs.tasks.await_agents`` per namespace asking each booting agent at a pace that slows with its boot time."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone

from labs.agent_client import AgentError, AgentTarget, healthz
from labs.models import Attempt, AttemptState
from labs.states import attempt_transition

logger = logging.getLogger(__name__)

AGENT_CHECK_TIMEOUT_SECONDS = 3.0
AGENT_CHECK_CONCURRENCY = 8
# The agent-wait key is set while a namespace's chain runs (each step renews it): a chain lost with its worker
# restarts once it expires.
AGENT_WAIT_TTL_SECONDS = 15
# How long after its VM is created an attempt's agent is asked without waiting for a list to show it Running.
AGENT_FAST_PATH_SECONDS = 5
# An agent is asked again after a quarter of the time it has had to come up, at least AGENT_ASK_MIN_SECONDS apart.
AGENT_ASK_MIN_SECONDS = 0.2
AGENT_ASK_FRACTION = 0.25
# At most about this many questions a second per namespace, so a class booting together costs few portforwards.
AGENT_ASK_RATE_PER_SECOND = 40
# A queued follow-up that has not begun this long after it was due (its worker lost) no longer holds back the next.
FOLLOW_UP_PENDING_GRACE_SECONDS = 10


def agent_wait_key(namespace: str) -> str:
    return f"labs:agent-wait:{namespace}"


def agent_wait_start(*, namespace: str) -> None:
    """Start the namespace's chain of agent checks unless it runs already."""
    if not cache.add(agent_wait_key(namespace), "1", timeout=AGENT_WAIT_TTL_SECONDS):
        return
    from labs.tasks import await_agents

    try:
        await_agents.delay(namespace, 0, 0)
    except Exception:
        cache.delete(agent_wait_key(namespace))
        logger.warning("could not queue the agent checks of %s; the next sync retries", namespace, exc_info=True)


def agent_wait_delay(step: int) -> float:
    """Seconds before the next round: quick while fast guests come up, then the sync's pace."""
    # 15 steps of 0.2 s: a simulated or pre-baked guest answers within about 3 s.
    for below, delay in ((15, 0.2), (21, 0.5), (27, 1.0)):
        if step < below:
            return delay
    return float(max(1, settings.ATTEMPT_SYNC_INTERVAL_SECONDS))


def agent_wait_max_steps() -> int:
    return 27 + settings.ATTEMPT_START_TIMEOUT_SECONDS // max(1, settings.ATTEMPT_SYNC_INTERVAL_SECONDS)


def _agent_answers(target: AgentTarget) -> bool:
    try:
        health = healthz(target, timeout_s=AGENT_CHECK_TIMEOUT_SECONDS)
    except AgentError as error:
        logger.debug("VM %s/%s: agent not ready yet (%s)", target.namespace, target.vm_name, error.code)
        return False
    # The agent starts before cloud-init has run the lab's own commands: the lab is ready once they have run.
    return health.get("setup_finished") is not False


def agents_answer(targets: Sequence[AgentTarget]) -> list[bool]:
    """Whether each agent answers ``/healthz`` with its guest's setup finished, asked in parallel."""
    if len(targets) == 1:
        return [_agent_answers(targets[0])]
    with ThreadPoolExecutor(max_workers=min(AGENT_CHECK_CONCURRENCY, len(targets))) as pool:
        return list(pool.map(_agent_answers, targets))


def agent_ask_gap(waiting: int) -> float:
    """The least time between two questions to one agent while ``waiting`` agents of its namespace boot."""
    return max(AGENT_ASK_MIN_SECONDS, waiting / AGENT_ASK_RATE_PER_SECOND)


def agent_ask_due(*, booting_for: float, since_last_round: float | None, min_gap: float) -> bool:
    """Whether an agent booting for ``booting_for`` seconds is due a question, the namespace's previous round
    having been ``since_last_round`` seconds ago (None: none): it is asked at age 0, then every quarter of its age
    (``min_gap`` to the sync interval apart), and is due when such a moment fell since the previous round."""
    if since_last_round is None or booting_for < since_last_round:  # new since the last round
        return True
    previous = booting_for - since_last_round
    longest = float(max(1, settings.ATTEMPT_SYNC_INTERVAL_SECONDS))
    slack = 1e-6  # the moments are sums of floats: one that lands on a round belongs to that round, not the next
    age = 0.0
    while age <= booting_for + slack:
        if age > previous + slack:
            return True
        age += min(longest, max(min_gap, age * AGENT_ASK_FRACTION))
    return False


def agents_check(*, namespace: str, since_last_round: float | None = None) -> tuple[int, int]:
    """Ask the due booting agents (a just-made VM's too), mark those that answer running; (running, waiting)."""
    now = timezone.now()
    just_made = now - timedelta(seconds=AGENT_FAST_PATH_SECONDS)
    # Only what deciding and asking need: a round runs every fraction of a second while a class boots.
    waiting = list(
        Attempt.objects.filter(namespace=namespace, state=AttemptState.STARTING)
        .filter(Q(phase="Running") | Q(provisioned_at__gte=just_made))
        .only("id", "provisioned_at", "vmi_running_at", "namespace", "vm_name", "agent_token")
    )
    min_gap = agent_ask_gap(len(waiting))
    attempts = [
        attempt
        for attempt in waiting
        # One whose VMI no list has shown Running is first asked AGENT_ASK_MIN_SECONDS after its VM was made.
        if (
            attempt.vmi_running_at is not None
            or attempt.provisioned_at is None
            or (now - attempt.provisioned_at).total_seconds() >= AGENT_ASK_MIN_SECONDS
        )
        and agent_ask_due(
            booting_for=(now - (attempt.vmi_running_at or attempt.provisioned_at or now)).total_seconds(),
            since_last_round=since_last_round,
            min_gap=min_gap,
        )
    ]
    if not attempts:
        return 0, len(waiting)
    answers = agents_answer(attempts)
    now_running = [
        attempt for attempt, ok in zip(attempts, answers, strict=True) if ok and _mark_running(attempt_id=attempt.id)
    ]
    if any(attempt.vmi_running_at is None for attempt in now_running) and settings.ATTEMPT_FOLLOW_UP_SECONDS:
        # Answered before a list showed the VMI Running (the fast path): a list soon gives the page its phase times.
        _schedule_follow_up(namespace, settings.ATTEMPT_FOLLOW_UP_SECONDS[0])
    return len(now_running), len(waiting) - sum(1 for ok in answers if ok)


def _mark_running(*, attempt_id: int) -> bool:
    """The guest agent answered: the attempt is ``running`` and its time limit starts now."""
    now = timezone.now()
    attempt = Attempt.objects.select_related("lab").filter(id=attempt_id, state=AttemptState.STARTING).first()
    if attempt is None:
        return False
    running = attempt_transition(
        attempt=attempt,
        to=AttemptState.RUNNING,
        from_states=(AttemptState.STARTING,),
        now=now,
        expires_at=now + timedelta(minutes=attempt.lab.time_limit_minutes),
        status_message="",
        status_message_texts={},
    )
    return running is not None


def watch_new_vm(namespace: str) -> None:
    """A VM was just made: a list of its namespace within each follow-up delay, shared by every VM made while one
    waits to run, and its agent checks, unless under way; the markers of both in one cache read."""
    agent_key = agent_wait_key(namespace)
    follow_up_keys = {delay: _follow_up_key(namespace, delay) for delay in settings.ATTEMPT_FOLLOW_UP_SECONDS}
    try:
        waiting = cache.get_many([*follow_up_keys.values(), agent_key])
    except Exception:
        waiting = {}  # the cache does not answer: each add that follows tries again
    for delay, key in follow_up_keys.items():
        # A waiting follow-up lists after this VM was made, within its delay.
        if key not in waiting and not _schedule_follow_up(namespace, delay):
            break
    if agent_key not in waiting:
        agent_wait_start(namespace=namespace)


def _follow_up_key(namespace: str, delay: float) -> str:
    return f"labs:follow-up:{namespace}:{delay}"


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
