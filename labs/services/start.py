"""Starting an attempt: the checks, the quota under the tenant's row lock, the row, and the provisioning or the warm
pool's claim queued on commit."""

from __future__ import annotations

import logging
import secrets
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import Count, F, Max, Q
from django.utils import formats, timezone, translation
from django.utils.translation import gettext as _

from labs.kubevirt import names
from labs.models import ACTIVE_STATES, Attempt, AttemptState, Lab, extra_cloud_init_problem
from labs.pool_models import LabPool
from labs.selectors import STARTING_STATES
from labs.services.events import on_commit_logged
from labs.services.namespaces import tenant_namespace_ready
from labs.services.pool_claim import pool_give_way, pool_vm_claim
from labs.services.provisioning import attempt_fail
from labs.services.quota import TenantTotals, per_student_refusal, quota_refusal, retry_after_seconds, tenant_totals
from labs.sizes import guest_resources, launcher_requests
from portal.errors import ApplicationError, Conflict, NotFound, PermissionDenied, Unavailable, database_busy
from portal.models import Role, Tenant, User
from portal.ratelimit import rate_limit_hit, rate_limit_refund
from portal.selectors import course_role
from portal.services import audit_record
from portal.timezones import person_time_zone

logger = logging.getLogger(__name__)


def _already_active(*, attempt_id: int | None) -> Conflict:
    return Conflict(
        _("You already have an attempt of this lab in progress."),
        code="attempt_active",
        extra={"attempt_id": attempt_id} if attempt_id is not None else None,
    )


def lab_closed_message(*, lab: Lab, actor: User, now: datetime) -> str:
    """Why ``lab`` takes no Start at ``now`` ('' when it does): the date it opens, else that it has closed."""
    if lab.is_open(now):
        return ""
    if lab.opens_at and now < lab.opens_at:
        # In the student's clock (their own, else the tenant's), even for an API client, whose requests are in UTC.
        opens_at = timezone.localtime(lab.opens_at, person_time_zone(actor, lab.course.tenant))
        return _("This lab opens on %(when)s.") % {"when": formats.date_format(opens_at, "DATETIME_FORMAT")}
    return _("This lab is closed.")


def attempt_start(*, actor: User, lab: Lab, role: str | None = None) -> Attempt:
    """Start an attempt of ``lab`` for the student ``actor`` (``role``: theirs in its course, if the caller read it).
    The tenant's row lock is held for two round trips only: the rows are written first, then the lock is taken and
    one aggregate counts the tenant's active attempts (this one included); a start over the quota rolls back."""
    course = lab.course
    if role is None:
        role = course_role(user=actor, course=course)
    if role is None:
        raise NotFound(_("Lab not found."))
    if role != Role.STUDENT:
        raise PermissionDenied(_("Only students of the course can start this lab."))
    now = timezone.now()
    if message := lab_closed_message(lab=lab, actor=actor, now=now):
        raise Conflict(message, code="lab_closed")
    guest = guest_resources(lab.size)
    launcher = launcher_requests(vcpus=guest.vcpus, memory_mib=guest.memory_mib)
    # The instructor's mistake is theirs to read (in admin, on the lab's page, and in the log), not the student's.
    if problem := extra_cloud_init_problem(lab.extra_cloud_init):
        logger.error("lab %s cannot start: its extra cloud-init is invalid: %s", lab.pk, problem)
        raise Conflict(
            _(
                "This lab is misconfigured, so it cannot start. Your course staff see the problem on the lab's "
                "settings page."
            ),
            code="lab_misconfigured",
        )
    # Counted outside the lock: the one-active constraint lets no second start of the student past the limit.
    mine = Attempt.objects.filter(student=actor, lab=lab).aggregate(
        counted=Count("id", filter=~Q(state=AttemptState.FAILED)),
        number=Max("number"),
        active=Max("id", filter=Q(state__in=ACTIVE_STATES)),
    )
    if mine["active"] is not None:
        raise _already_active(attempt_id=mine["active"])
    if lab.attempt_limit and mine["counted"] >= lab.attempt_limit:
        raise Conflict(
            _("You have used all %(limit)d attempts for this lab.") % {"limit": lab.attempt_limit}, code="attempt_limit"
        )
    # After the refusals that need no cluster: for a tenant never set up, this asks the cluster.
    if not tenant_namespace_ready(tenant=course.tenant):
        # Nothing to fail: the cluster is known to refuse the portal here (the capacity page says what to apply).
        logger.error("start of lab %s refused: tenant %s's namespace refuses the portal", lab.pk, course.tenant_id)
        raise Conflict(_("This course is not ready yet; your instructor has been told."), code="course_not_ready")
    limit = settings.ATTEMPT_CONCURRENT_START_LIMIT
    if limit and Attempt.objects.filter(state__in=STARTING_STATES).count() >= limit:
        raise Unavailable(
            _("Many labs are starting right now. Try again in a minute."),
            code="too_many_starts",
            retry_after=retry_after_seconds(),
        )
    number = (mine["number"] or 0) + 1
    pooled = hasattr(lab, "pool")  # read with the lab by the lab page's Start, else one query

    try:
        with transaction.atomic():
            attempt = Attempt.objects.create(
                lab=lab,
                student=actor,
                tenant=course.tenant,
                number=number,  # ``requested``, the model's default
                namespace=course.tenant.namespace,
                agent_token=secrets.token_urlsafe(32),
                # The workers write their messages about this attempt in the page's language.
                language=translation.get_language() or "",
                vcpus=guest.vcpus,
                memory_mib=guest.memory_mib,
                launcher_cpu_millicores=launcher.cpu_millicores,
                launcher_memory_mib=launcher.memory_mib,
                requested_at=now,
            )
            # A ready VM of the lab's warm pool, when there is one; else the attempt's own VM, made on commit.
            claimed = pool_vm_claim(attempt=attempt, lab=lab, now=now) if pooled else None
            attempt.vm_name = names.vm_name(attempt.id) if claimed is None else claimed.vm_name
            Attempt.objects.filter(id=attempt.id).update(vm_name=attempt.vm_name)
            audit_record(
                actor=actor,
                action="attempt.start",
                target=attempt,
                tenant=course.tenant,
                course=course,
                data={"lab": lab.id, "size": lab.size, "number": number},
            )
            # Serialises the tenant's starts: the totals include every one that committed before.
            # FOR NO KEY UPDATE: rows that only reference the tenant need not wait.
            tenant = Tenant.objects.select_for_update(no_key=True).get(id=course.tenant_id)
            totals = tenant_totals(tenant_id=course.tenant_id, student=actor)
            if tenant.max_vms_per_student and totals.students > tenant.max_vms_per_student:
                raise per_student_refusal(running=totals.students - 1, stopping=totals.stopping)

            def refusal_at(totals: TenantTotals) -> ApplicationError | None:
                # The totals count this attempt already: the rest is what it would be added to.
                others = totals._replace(
                    vms=totals.vms - 1, vcpus=totals.vcpus - guest.vcpus, memory=totals.memory - launcher.memory_mib
                )
                return quota_refusal(tenant=tenant, used=others, vcpus=guest.vcpus, memory_mib=launcher.memory_mib)

            refusal = refusal_at(totals)
            if refusal is not None:
                # Idle pool VMs of the tenant give way to a student's Start.
                totals = pool_give_way(tenant_id=course.tenant_id, totals=totals, fits=lambda t: refusal_at(t) is None)
                refusal = refusal_at(totals)
                if refusal is not None:
                    raise refusal
    except IntegrityError as error:
        # Without the driver's diagnostics (not PostgreSQL), the attempt insert is the one statement that can clash.
        constraint = getattr(getattr(error.__cause__, "diag", None), "constraint_name", None)
        if constraint not in (None, "attempt_one_active_per_student_lab"):
            raise
        active = Attempt.objects.filter(student=actor, lab=lab, state__in=ACTIVE_STATES).values_list("id", flat=True)
        raise _already_active(attempt_id=active.first()) from None
    # No update is pushed: nobody listens to an attempt that did not exist, and the answer carries its status.
    if claimed is not None:
        from labs.tasks import finish_pool_claim

        # A broker that refuses leaves the attempt requested; the sweep queues its provisioning, which finishes it.
        on_commit_logged(lambda: finish_pool_claim.delay(attempt.id), what=f"queueing the claim of {attempt.id}")
        return attempt
    # A Start of a lab whose pool is meant to be warm found no ready VM: a miss.
    if pooled and lab.pool.target(now):  # the pool was read with the lab: no second query
        LabPool.objects.filter(id=lab.pool.id).update(misses=F("misses") + 1)
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(lambda: _provisioning_queued(attempt.id))
    elif not _provisioning_queued(attempt.id):
        # The provisioning could not be handed to the broker: the attempt was failed in words.
        attempt.refresh_from_db(fields=["state", "failure_reason", "ended_at", "updated_at"])
        if attempt.state == AttemptState.FAILED:
            raise Unavailable(attempt.failure_reason, code="queue_unavailable", retry_after=retry_after_seconds())
    return attempt


def attempt_start_limited(*, actor: User, lab: Lab, role: str | None = None) -> Attempt:
    """``attempt_start`` behind the per-person limit; a Retry-After refusal or a busy database is not counted."""
    counted = rate_limit_hit(
        scope="attempt_start",
        key=f"user:{actor.pk}",
        message=_("You have started too many labs in a short time. Wait a little before starting another."),
    )
    try:
        return attempt_start(actor=actor, lab=lab, role=role)
    except ApplicationError as error:
        if error.retry_after:
            rate_limit_refund(counted)
        raise
    except OperationalError as error:
        # No database connection came free in time: answered 503 with Retry-After, and nothing was started.
        if database_busy(error):
            rate_limit_refund(counted)
        raise


def _provisioning_queued(attempt_id: int) -> bool:
    """Queue the provisioning; a broker that refuses fails the attempt in words (False)."""
    from labs.tasks import provision_attempt

    try:
        provision_attempt.delay(attempt_id)
    except Exception:
        logger.exception("could not queue the provisioning of attempt %s", attempt_id)
        # It holds no VM yet; end it in words rather than leave it requested with nobody to serve it. No teardown:
        # there is nothing to delete, and its publish would keep the student waiting on the same broker once more.
        attempt_fail(
            attempt_id=attempt_id,
            from_states=(AttemptState.REQUESTED,),
            teardown=False,
            reason=lambda: _(
                "Your lab could not be queued for starting: the portal's task queue is not answering. Try again in "
                "a minute; this attempt does not count against your limit."
            ),
        )
        return False
    return True
