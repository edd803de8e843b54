"""Follow-up listings after a VM is created: shared by VMs created close together, yet every VM is listed within
each follow-up delay of its creation."""

from __future__ import annotations

import random
import secrets
from unittest import mock

import pytest

from labs.services import provisioning

DELAYS = (0.05, 0.3, 1.0, 2.5)


@pytest.fixture
def queued(settings):
    """Follow-ups queued (delay, when) by ``_schedule_follow_ups`` called at the clock values the test sets."""
    settings.ATTEMPT_FOLLOW_UP_SECONDS = DELAYS
    clock = {"now": 1_000_000.0}
    calls: list[tuple[float, float]] = []

    def apply_async(*, args, countdown, expires):
        calls.append((countdown, clock["now"] + countdown))

    with mock.patch("labs.tasks.sync_namespace.apply_async", side_effect=apply_async), \
            mock.patch.object(provisioning.time, "time", side_effect=lambda: clock["now"]):
        yield clock, calls


def test_vms_created_together_share_their_follow_ups(queued):
    clock, calls = queued
    namespace = f"lab-{secrets.token_hex(4)}"
    clock["now"] = 1_000_000.01
    for _ in range(100):  # a hundred VMs created within the same few milliseconds
        provisioning._schedule_follow_ups(namespace)
        clock["now"] += 0.0001
    assert sorted(delay for delay, _when in calls) == sorted(DELAYS)
    # Another namespace has follow-ups of its own.
    provisioning._schedule_follow_ups(f"{namespace}-other")
    assert len(calls) == 2 * len(DELAYS)


def test_every_vm_is_listed_within_each_delay_of_its_creation(queued):
    clock, calls = queued
    namespace = f"lab-{secrets.token_hex(4)}"
    rng = random.Random(7)
    created = sorted(1_000_000 + rng.uniform(0, 5) for _ in range(300))  # a burst spread over five seconds
    for when in created:
        clock["now"] = when
        provisioning._schedule_follow_ups(namespace)
    runs = {delay: [run for d, run in calls if d == delay] for delay in DELAYS}
    for when in created:
        for delay in DELAYS:
            assert any(when < run <= when + delay + 1e-9 for run in runs[delay]), (when, delay)
    # Far fewer listings than six per VM: at most one per slot of each delay over the burst, plus the edges.
    assert len(calls) <= sum(5 / delay + 2 for delay in DELAYS)
    assert len(calls) < len(created)
