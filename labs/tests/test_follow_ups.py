"""Follow-up listings after a VM is created: shared by VMs created close together (one waiting per delay at a
time), yet every VM is listed within each follow-up delay of its creation."""

from __future__ import annotations

import random
import secrets
from unittest import mock

import pytest

from labs import tasks
from labs.services import agents

DELAYS = (0.05, 0.3, 1.0, 2.5)


class Broker:
    """Follow-ups queued by ``watch_new_vm``, run (their ``follow_up_begins``) when the test's clock
    reaches them, ``lag`` seconds late (a busy worker)."""

    def __init__(self, lag: float = 0.0) -> None:
        self.lag = lag
        self.queued: list[dict] = []
        self.runs: list[tuple[float, float]] = []  # (delay, when it began)

    def apply_async(self, *, args, kwargs, countdown, expires) -> None:
        assert countdown == kwargs["follow_up"] and expires > countdown
        self.queued.append({"namespace": args[0], "delay": countdown, "due": self.now + countdown + self.lag})

    def advance(self, now: float) -> None:
        """Run every follow-up due by ``now``, in order."""
        for item in sorted((q for q in self.queued if q["due"] <= now), key=lambda q: q["due"]):
            self.queued.remove(item)
            self.runs.append((item["delay"], item["due"]))
            agents.follow_up_begins(namespace=item["namespace"], delay=item["delay"])
        self.now = now


@pytest.fixture
def broker(settings, monkeypatch):
    settings.ATTEMPT_FOLLOW_UP_SECONDS = DELAYS
    monkeypatch.setattr(agents, "agent_wait_start", lambda namespace: None)  # the agent checks are not the subject
    broker = Broker()
    broker.now = 1_000_000.0
    with mock.patch("labs.tasks.sync_namespace.apply_async", side_effect=broker.apply_async):
        yield broker


def test_vms_created_together_share_their_follow_ups(broker):
    namespace = f"lab-{secrets.token_hex(4)}"
    for _ in range(100):  # a hundred VMs created before any follow-up ran
        agents.watch_new_vm(namespace)
    assert sorted(item["delay"] for item in broker.queued) == sorted(DELAYS)
    # Another namespace has follow-ups of its own.
    agents.watch_new_vm(f"{namespace}-other")
    assert len(broker.queued) == 2 * len(DELAYS)
    # Once the shortest has begun, the next VM queues another of that delay only.
    broker.advance(broker.now + 0.06)
    agents.watch_new_vm(namespace)
    assert sorted(item["delay"] for item in broker.queued if item["namespace"] == namespace) == sorted(DELAYS)
    assert len(broker.queued) == 2 * len(DELAYS) - 1  # the other namespace's shortest has run, and no VM came


@pytest.mark.parametrize("lag", [0.0, 0.4])
def test_every_vm_is_listed_within_each_delay_of_its_creation(broker, lag):
    """Within its delay of the moment it was queued, or of its creation: a worker ``lag`` seconds behind runs every
    follow-up that late, the ones this VM's creation would have queued included."""
    broker.lag = lag
    namespace = f"lab-{secrets.token_hex(4)}"
    rng = random.Random(7)
    created = sorted(1_000_000 + rng.uniform(0, 5) for _ in range(300))  # a burst spread over five seconds
    for when in created:
        broker.advance(when)
        agents.watch_new_vm(namespace)
    broker.advance(created[-1] + 10)
    for when in created:
        for delay in DELAYS:
            assert any(when < began <= when + delay + lag + 1e-9 for d, began in broker.runs if d == delay), (
                when,
                delay,
            )
    # Far fewer listings than four per VM; fewer still when the worker is behind.
    assert len(broker.runs) <= sum(5 / (delay + lag) + 2 for delay in DELAYS)
    assert len(broker.runs) < len(created)


def test_a_follow_up_lets_the_next_one_be_queued_as_it_begins(broker, monkeypatch):
    namespace = f"lab-{secrets.token_hex(4)}"
    agents.watch_new_vm(namespace)
    assert len(broker.queued) == len(DELAYS)
    monkeypatch.setattr(
        tasks.tracking,
        "namespace_sync",
        lambda namespace: tasks.tracking.SyncReport(namespaces=[namespace]),
    )
    tasks.sync_namespace(namespace, follow_up=0.3)  # as the worker runs it
    agents.watch_new_vm(namespace)
    assert sorted(item["delay"] for item in broker.queued) == sorted([*DELAYS, 0.3])
    tasks.sync_namespace(namespace)  # a list not queued as a follow-up frees none
    agents.watch_new_vm(namespace)
    assert len(broker.queued) == len(DELAYS) + 1


def test_a_vm_made_while_every_follow_up_waits_asks_the_cache_once(broker):
    from django.core.cache import cache

    namespace = f"lab-{secrets.token_hex(4)}"
    agents.watch_new_vm(namespace)
    with (
        mock.patch.object(cache, "add", wraps=cache.add) as add,
        mock.patch.object(cache, "get_many", wraps=cache.get_many) as get_many,
    ):
        agents.watch_new_vm(namespace)
        assert (get_many.call_count, add.call_count) == (1, 0)
        broker.advance(broker.now + 0.06)  # the shortest began: only it is queued again
        agents.watch_new_vm(namespace)
        assert (get_many.call_count, add.call_count) == (2, 1)
    assert sorted(item["delay"] for item in broker.queued) == sorted(DELAYS)


def test_a_vm_made_while_its_namespaces_lists_and_agent_checks_are_under_way_asks_the_cache_once(broker, monkeypatch):
    from django.core.cache import cache

    from labs.services import agents

    started = []
    monkeypatch.setattr(agents, "agent_wait_start", lambda namespace: started.append(namespace) or True)
    namespace = f"lab-{secrets.token_hex(4)}"
    agents.watch_new_vm(namespace)  # the first VM: everything is queued
    assert started == [namespace] and len(broker.queued) == len(DELAYS)
    cache.set(agents.agent_wait_key(namespace), "1")  # the agent checks are under way (agent_wait_start's key)
    with (
        mock.patch.object(cache, "add", wraps=cache.add) as add,
        mock.patch.object(cache, "get_many", wraps=cache.get_many) as get_many,
    ):
        agents.watch_new_vm(namespace)
        assert (get_many.call_count, add.call_count) == (1, 0)
    assert started == [namespace] and len(broker.queued) == len(DELAYS)
    cache.delete(agents.agent_wait_key(namespace))  # the checks ended: the next VM starts them again
    agents.watch_new_vm(namespace)
    assert started == [namespace, namespace]
