"""Twenty students press Start at the same moment for the tenant's last free VM: exactly one gets it.

Each student is a thread with its own PostgreSQL connection; the start service locks the tenant row and counts
inside the transaction, so the starts are serialised and the quota cannot be double-booked.
"""

from __future__ import annotations

import pytest

from conftest import make_lab, make_person
from labs.models import Attempt, AttemptState
from labs.tests.conftest import start_together, vm_names
from portal.errors import Unavailable
from portal.models import Course, Role, Tenant

RACERS = 20


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_starts_for_the_last_slot_make_exactly_one_vm(lifecycle):
    tenant = Tenant.objects.create(name="Race University", max_concurrent_vms=10, max_vcpus=100)
    course = Course.objects.create(tenant=tenant, code="RACE1", title="Racing")
    lab = make_lab(course)
    other_lab = make_lab(course, title="Earlier lab")
    # Nine of the ten slots are held by attempts already running.
    for index in range(9):
        holder = make_person(username=f"holder{index}", tenant=tenant, course=course, role=Role.STUDENT)
        Attempt.objects.create(
            lab=other_lab,
            student=holder,
            tenant=tenant,
            state=AttemptState.RUNNING,
            namespace=tenant.namespace,
            vm_name=f"held-{index}",
        )
    racers = [make_person(username=f"racer{i}", tenant=tenant, course=course, role=Role.STUDENT) for i in range(RACERS)]

    outcomes = start_together([(student, lab) for student in racers])

    winners = [o for o in outcomes if isinstance(o, Attempt)]
    refusals = [o for o in outcomes if isinstance(o, Unavailable)]
    others = [o for o in outcomes if not isinstance(o, (Attempt, Unavailable))]
    assert others == [], others
    assert len(winners) == 1 and len(refusals) == RACERS - 1
    for refusal in refusals:
        assert refusal.code == "quota_full" and refusal.status_code == 503
        assert 30 <= refusal.retry_after <= 60
        assert "capacity is full" in refusal.message and "all 10 lab VMs are in use" in refusal.message

    assert Attempt.objects.filter(lab=lab).count() == 1
    assert Attempt.objects.filter(tenant=tenant, state__in=("requested", "provisioning", "starting")).count() == 1
    # Provisioning ran once, for the winner: one VM on the cluster.
    winner = Attempt.objects.get(lab=lab)
    assert winner.state == AttemptState.STARTING
    assert vm_names(tenant.namespace) == [winner.vm_name]
