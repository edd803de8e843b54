"""The tenant's capacity and the per-student limit as the Start checks them under the tenant lock, and the refusals."""

from __future__ import annotations

import secrets
from typing import NamedTuple

from django.db.models import Count, Q, Sum
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from labs.models import ACTIVE_STATES, Attempt, AttemptState
from labs.pool_models import POOL_HOLDING_STATES, PoolVm
from portal.errors import Conflict, Unavailable
from portal.models import Tenant, User

# Suggested wait when capacity is full, in seconds (JupyterHub's spawn_throttle_retry_range).
RETRY_AFTER_RANGE = (30, 60)


def retry_after_seconds() -> int:
    """A wait spread over the range so refused students do not all come back in the same second."""
    low, high = RETRY_AFTER_RANGE
    return low + secrets.randbelow(high - low + 1)


def per_student_refusal(*, running: int, stopping: int) -> Conflict:
    """The student has as many labs going as one person may: one must stop or end first (so no Retry-After)."""
    if stopping:
        message = ngettext(
            "You already have %(count)d lab going, as many as your institution allows one person at once, and it is "
            "stopping: try again once it has ended.",
            "You already have %(count)d labs going, as many as your institution allows one person at once, and one "
            "of them is stopping: try again once it has ended.",
            running,
        ) % {"count": running}
    else:
        message = ngettext(
            "You already have %(count)d lab going, as many as your institution allows one person at once. Stop it "
            "to start this one.",
            "You already have %(count)d labs going, as many as your institution allows one person at once. Stop one "
            "of them to start this one.",
            running,
        ) % {"count": running}
    return Conflict(message, code="too_many_running")


def per_student_cap_message(*, student: User, tenant: Tenant) -> str:
    """What the lab page says instead of offering Start to a student at the per-person limit, else ''."""
    if not tenant.max_vms_per_student:
        return ""
    going = Attempt.objects.filter(student=student, tenant=tenant, state__in=ACTIVE_STATES).aggregate(
        running=Count("id"), stopping=Count("id", filter=Q(state=AttemptState.STOPPING))
    )
    if going["running"] < tenant.max_vms_per_student:
        return ""
    return per_student_refusal(running=going["running"], stopping=going["stopping"]).message


class TenantTotals(NamedTuple):
    vms: int
    vcpus: int
    memory: int
    students: int  # the student's own active attempts
    stopping: int  # of which stopping


def quota_refusal(*, tenant: Tenant, used: TenantTotals, vcpus: int, memory_mib: int) -> Conflict | Unavailable | None:
    """The refusal when one more VM of this shape would pass any of the tenant's limits, else None."""
    # A VM that passes a limit on its own never fits, however long the student waits: no Retry-After then.
    too_small = []
    if not tenant.max_concurrent_vms:
        too_small.append(_("it allows no lab VMs"))
    if vcpus > tenant.max_vcpus:
        too_small.append(
            _("it allows %(limit)d vCPUs, this lab needs %(need)d") % {"limit": tenant.max_vcpus, "need": vcpus}
        )
    if memory_mib > tenant.max_memory_mib:
        too_small.append(
            _("it allows %(limit)d MiB of memory, this lab needs %(need)d MiB")
            % {"limit": tenant.max_memory_mib, "need": memory_mib}
        )
    if too_small:
        return Conflict(
            _("This lab does not fit in your institution's lab quota (%(reasons)s). Ask your instructor.")
            % {"reasons": "; ".join(too_small)},
            code="quota_too_small",
        )
    reasons = []
    if used.vms + 1 > tenant.max_concurrent_vms:
        limit = tenant.max_concurrent_vms
        reasons.append(
            ngettext("the %(limit)d lab VM is in use", "all %(limit)d lab VMs are in use", limit) % {"limit": limit}
        )
    if used.vcpus + vcpus > tenant.max_vcpus:
        reasons.append(_("%(used)d of %(limit)d vCPUs are in use") % {"used": used.vcpus, "limit": tenant.max_vcpus})
    if used.memory + memory_mib > tenant.max_memory_mib:
        reasons.append(
            _("%(used)d of %(limit)d MiB of memory are in use") % {"used": used.memory, "limit": tenant.max_memory_mib}
        )
    if not reasons:
        return None
    return Unavailable(
        _("Your institution's lab capacity is full (%(reasons)s). Try again in a minute or two.")
        % {"reasons": "; ".join(reasons)},
        code="quota_full",
        retry_after=retry_after_seconds(),
    )


def tenant_totals(*, tenant_id: int, student: User | None) -> TenantTotals:
    """The VMs, vCPUs and launcher memory of the tenant's active attempts and unclaimed pool VMs; the student's own."""
    totals = Attempt.objects.filter(tenant_id=tenant_id, state__in=ACTIVE_STATES).aggregate(
        vms=Count("id"),
        vcpus=Sum("vcpus"),
        memory=Sum("launcher_memory_mib"),
        students=Count("id", filter=Q(student=student)),
        stopping=Count("id", filter=Q(student=student, state=AttemptState.STOPPING)),
    )
    pool = PoolVm.objects.filter(tenant_id=tenant_id, state__in=POOL_HOLDING_STATES).aggregate(
        vms=Count("id"), vcpus=Sum("vcpus"), memory=Sum("launcher_memory_mib")
    )
    return TenantTotals(
        vms=totals["vms"] + pool["vms"],
        vcpus=(totals["vcpus"] or 0) + (pool["vcpus"] or 0),
        memory=(totals["memory"] or 0) + (pool["memory"] or 0),
        students=totals["students"],
        stopping=totals["stopping"],
    )


def tenant_over_quota(tenant: Tenant) -> bool:
    """Whether the tenant holds more than its quota allows, as it does once the quota is lowered below what runs."""
    used = tenant_totals(tenant_id=tenant.id, student=None)
    return used.vms > tenant.max_concurrent_vms or used.vcpus > tenant.max_vcpus or used.memory > tenant.max_memory_mib
