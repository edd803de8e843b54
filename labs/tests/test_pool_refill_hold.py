"""A warm pool's class goes first: the refill waits while the class is arriving (bounded, so a trickle of Starts
never starves it), and a claim's finish has a Celery queue of its own that every worker consumes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from labs.models import AttemptState, PoolVm, PoolVmState
from labs.services import pools
from labs.tests.test_pools import start, warm_pool
from portal.celery import app

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]


def test_a_refill_waits_while_the_class_is_claiming_and_resumes_after(
    lifecycle, settings, student_a, lab_a, django_capture_on_commit_callbacks
):
    settings.POOL_REFILL_HOLD_SECONDS = 5
    settings.POOL_REFILL_HOLD_MAX_SECONDS = 30
    pool = warm_pool(lab_a, 2)
    attempt = start(student_a, lab_a, django_capture_on_commit_callbacks)
    assert attempt.state == AttemptState.RUNNING and PoolVm.objects.filter(pool=pool, attempt=attempt).exists()

    held = pools.pools_refill()
    assert (held.created, held.held) == ([], [pool.id])
    assert PoolVm.objects.filter(pool=pool, state__in=[PoolVmState.BOOTING, PoolVmState.READY]).count() == 1
    # Five seconds after the claim nobody else came: the pool makes up for it.
    resumed = pools.pools_refill(now=timezone.now() + timedelta(seconds=6))
    assert len(resumed.created) == 1 and resumed.held == []


def claimed_at(pool_vm: PoolVm, when) -> None:
    PoolVm.objects.filter(id=pool_vm.id).update(state=PoolVmState.CLAIMED, claimed_at=when)


def test_starts_trickling_in_hold_the_refill_at_most_its_maximum(lifecycle, settings, lab_a):
    settings.POOL_REFILL_HOLD_SECONDS = 5
    settings.POOL_REFILL_HOLD_MAX_SECONDS = 30
    pool = warm_pool(lab_a, 3)
    first, second, third = PoolVm.objects.filter(pool=pool).order_by("id")
    now = timezone.now()
    PoolVm.objects.filter(pool=pool).update(created_at=now - timedelta(minutes=5))  # filled before the class
    # A claim every few seconds for 20 s: the class is still arriving.
    claimed_at(first, now - timedelta(seconds=20))
    claimed_at(second, now - timedelta(seconds=2))
    assert pools.pools_refill(now=now).held == [pool.id]
    # The same claims seen 15 s later, with one more just now: the first came 35 s ago, past the maximum.
    later = now + timedelta(seconds=15)
    claimed_at(third, later - timedelta(seconds=1))
    report = pools.pools_refill(now=later)
    assert report.held == [] and len(report.created) == 3
    # The run of claims counts from the refill's newest VM: right after it, a new claim holds it again.
    newest = PoolVm.objects.filter(pool=pool, state=PoolVmState.BOOTING).order_by("-id").first()
    PoolVm.objects.filter(id=newest.id).update(created_at=later - timedelta(seconds=1))
    claimed_at(newest, later)
    assert pools.pools_refill(now=later + timedelta(seconds=1)).held == [pool.id]


def test_no_hold_when_the_setting_is_zero(lifecycle, settings, student_a, lab_a, django_capture_on_commit_callbacks):
    settings.POOL_REFILL_HOLD_SECONDS = 0
    pool = warm_pool(lab_a, 1)
    start(student_a, lab_a, django_capture_on_commit_callbacks)
    report = pools.pools_refill()
    assert report.held == [] and len(report.created) == 1
    assert PoolVm.objects.filter(pool=pool, state=PoolVmState.BOOTING).count() == 1


def test_a_claim_finish_goes_to_the_claims_queue_which_every_worker_consumes():
    route = app.amqp.router.route({}, "labs.tasks.finish_pool_claim")
    assert route["queue"].name == "claims"
    assert app.amqp.router.route({}, "labs.tasks.provision_attempt")["queue"].name == "celery"
    # A worker started without -Q consumes every declared queue; none of the shipped worker commands narrows them.
    assert {"celery", "periodic", "claims"} <= set(app.amqp.queues)
    for manifest in ("docker-compose.yml", "deploy/portal.yaml"):
        workers = [line for line in (REPO / manifest).read_text().splitlines() if '"worker"' in line]
        assert workers and not any("-Q" in line or "--queues" in line for line in workers), manifest
