"""Putting an attempt's VM on the cluster and taking it off again; the system's own attempt transitions.

Every function here is safe to run twice or to rerun after a crash at any line (Celery delivers at least once):
work is claimed with conditional updates (``filter(state=...).update(...) == 1``), names are deterministic, and
the cluster calls treat "already exists" and "not found" as done (``labs.kubevirt.operations``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Case, Value, When
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from labs.kubevirt import manifests, names, operations
from labs.kubevirt.operations import ClusterError
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt, AttemptState
from labs.services.namespaces import tenant_namespace_ensure
from labs.services.stopping import StopReason, enqueue_teardown
from labs.signals import attempt_final_grading
from labs.states import attempt_transition
from labs.wording import in_every_language

logger = logging.getLogger(__name__)

# How long the worker keeps an attempt's ``provisioning`` update back (labs.services.events): creating the Secret and
# the VM usually takes a fraction of that, and the page then gets ``starting`` alone.
PROVISIONING_PUSH_HOLD_SECONDS = 1.0

# Set once a teardown's final grading has returned, so that its own retry (after a failed delete) is not taken for
# a second delivery still grading.
FINAL_GRADING_DONE_KEY = "labs:final-grading-done:{attempt_id}"


# ---- the system's transitions -------------------------------------------------------------------------------


def attempt_language(language: str):
    """Work in ``language``, an attempt's ``Attempt.language`` (the default language when it has none): the
    language of its text fields. Its messages are also written in every language (``labs.wording``)."""
    return translation.override(language or settings.LANGUAGE_CODE)


def attempt_fail(*, attempt_id: int, reason: Callable[[], str], from_states: tuple[str, ...] = ACTIVE_STATES) -> bool:
    """Mark the attempt failed and queue the clean-up of its VM. ``reason`` returns why, in plain words for the
    student; it is called once per language (``labs.wording``), so it only translates and formats. False when the
    attempt had already left ``from_states``."""
    texts = {code: text[:4000] for code, text in in_every_language(reason).items()}
    default = texts.get(settings.LANGUAGE_CODE) or next(iter(texts.values()))
    # The text field keeps the student's own language (Attempt.language), picked in the update itself.
    in_attempt_language = Case(
        *(When(language=code, then=Value(text)) for code, text in texts.items()), default=Value(default)
    )
    with transaction.atomic():
        failed = attempt_transition(
            attempt=attempt_id,
            to=AttemptState.FAILED,
            from_states=from_states,
            failure_reason=in_attempt_language,
            failure_reason_texts=texts,
            status_message="",
            status_message_texts={},
        )
        if failed is None:
            return False
        enqueue_teardown(attempt_id)
    logger.info("attempt %s failed: %s", attempt_id, default)
    return True


def attempt_end(*, attempt_id: int) -> bool:
    """A stopping attempt whose VM is gone ends: ``expired`` if its time ran out, ``stopped`` otherwise."""
    attempt = Attempt.objects.filter(id=attempt_id, state=AttemptState.STOPPING).first()
    if attempt is None:
        return False
    final = AttemptState.EXPIRED if attempt.stop_reason == StopReason.EXPIRED else AttemptState.STOPPED
    return (
        attempt_transition(
            attempt=attempt, to=final, from_states=(AttemptState.STOPPING,), status_message="", status_message_texts={}
        )
        is not None
    )


def attempt_mark_running(*, attempt_id: int, now: datetime | None = None) -> bool:
    """The guest agent answered: the attempt is ``running`` and its time limit starts now."""
    now = now or timezone.now()
    attempt = Attempt.objects.select_related("lab").filter(id=attempt_id, state=AttemptState.STARTING).first()
    if attempt is None:
        return False
    return (
        attempt_transition(
            attempt=attempt,
            to=AttemptState.RUNNING,
            from_states=(AttemptState.STARTING,),
            now=now,
            expires_at=now + timedelta(minutes=attempt.lab.time_limit_minutes),
            status_message="",
            status_message_texts={},
        )
        is not None
    )


# ---- provisioning -------------------------------------------------------------------------------------------


class ProvisionOutcome:
    CREATED = "created"
    SKIPPED = "skipped"
    FAILED = "failed"
    ABANDONED = "abandoned"


def attempt_provision(*, attempt_id: int) -> str:
    """Create the attempt's cloud-init Secret and VM (and the namespace first if needed); the attempt becomes
    ``starting``. Raises ``ClusterError`` for the caller to retry or give up on."""
    attempt = Attempt.objects.select_related("lab", "tenant").filter(id=attempt_id).first()
    if (
        attempt is not None
        and attempt.state == AttemptState.REQUESTED
        and names.pool_vm_id_from_vm_name(attempt.vm_name)
    ):
        # It claimed a warm pool's VM (a lost claim task, queued again by the sweep): finish that claim instead.
        from labs.services.pool_claim import pool_claim_finish

        pool_claim_finish(attempt_id=attempt_id)
        return ProvisionOutcome.SKIPPED
    if attempt is not None and attempt.state == AttemptState.REQUESTED:
        # The claim's push is held back: news only if making the VM takes a while (``starting``, or a failure,
        # from here replaces it sooner).
        if (
            attempt_transition(
                attempt=attempt,
                to=AttemptState.PROVISIONING,
                from_states=(AttemptState.REQUESTED,),
                hold=PROVISIONING_PUSH_HOLD_SECONDS,
            )
            is None
        ):
            attempt.refresh_from_db(fields=["state"])
    if attempt is None or attempt.state != AttemptState.PROVISIONING:
        return ProvisionOutcome.SKIPPED  # done by an earlier delivery, or stopped before it began

    from guest.cloud_init import render_user_data

    lab = attempt.lab
    try:
        user_data = render_user_data(token=attempt.agent_token, extra_cloud_config=lab.extra_cloud_init)
    except ValueError as exc:
        error = str(exc)
        attempt_fail(
            attempt_id=attempt_id,
            reason=lambda: (
                _("The lab's cloud-init settings are invalid (%(error)s). Tell your instructor.") % {"error": error}
            ),
        )
        return ProvisionOutcome.FAILED

    tenant_namespace_ensure(tenant=attempt.tenant)
    labels = names.attempt_labels(
        tenant_id=attempt.tenant_id, course_id=lab.course_id, lab_id=lab.id, attempt_id=attempt.id
    )
    secret_name = names.cloud_init_secret_name(attempt.vm_name)
    secret = manifests.cloud_init_secret(
        name=secret_name, namespace=attempt.namespace, labels=labels, user_data=user_data
    )
    vm = manifests.virtual_machine(
        name=attempt.vm_name,
        namespace=attempt.namespace,
        labels=labels,
        image=lab.image,
        vcpus=attempt.vcpus,
        memory_mib=attempt.memory_mib,
        host_passthrough=lab.nested_virtualization,
        cloud_init_secret=secret_name,
    )
    try:
        operations.secret_create(secret)
        created_vm, _created = operations.vm_create(vm)
    except ClusterError as error:
        if error.status == 404:  # the namespace was deleted behind our back: set it up again, then retry
            tenant_namespace_ensure(tenant=attempt.tenant, force=True)
            error.transient = True
        raise
    vm_labels = (created_vm.get("metadata") or {}).get("labels") or {}
    if names.attempt_id_from_labels(vm_labels) != attempt.id:
        attempt_fail(
            attempt_id=attempt_id,
            reason=lambda: (
                _("A VM named %(name)s that belongs to something else is in the way; an operator must remove it.")
                % {"name": attempt.vm_name}
            ),
        )
        return ProvisionOutcome.FAILED
    operations.secret_set_owner(
        namespace=attempt.namespace, name=secret_name, owner=manifests.owner_reference(created_vm)
    )

    # Every other write to a provisioning attempt (a sync that saw its VMI, a stop) moves it out of provisioning,
    # and then this transition matches nothing.
    if attempt_transition(attempt=attempt, to=AttemptState.STARTING, from_states=(AttemptState.PROVISIONING,)) is None:
        return _after_lost_claim(attempt_id=attempt_id)
    _watch_new_vm(attempt.namespace)
    return ProvisionOutcome.CREATED


def _after_lost_claim(*, attempt_id: int) -> str:
    """The attempt left ``provisioning`` while its VM was being created (a stop, say). If its teardown already
    ran, the VM just made would outlive it: delete it here rather than wait for the sweep."""
    attempt = Attempt.objects.get(id=attempt_id)
    if attempt.state in FINAL_STATES or (attempt.state == AttemptState.STOPPING and attempt.vm_deleted_at):
        operations.vm_delete(namespace=attempt.namespace, name=attempt.vm_name)
        operations.secret_delete(namespace=attempt.namespace, name=names.cloud_init_secret_name(attempt.vm_name))
    return ProvisionOutcome.ABANDONED


FOLLOW_UP_KEY = "labs:follow-up:{namespace}:{delay}"
# A queued follow-up that has not begun this long after it was due (its worker lost, say) no longer holds back the
# next; the beat's sync lists the namespace meanwhile.
FOLLOW_UP_PENDING_GRACE_SECONDS = 10


def _watch_new_vm(namespace: str) -> None:
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


# ---- teardown -----------------------------------------------------------------------------------------------


def grade_final(*, attempt: Attempt, trigger: str) -> None:
    """The grading app's last run before the VM goes (its receiver of ``attempt_final_grading``). Never raises:
    a grading failure must not keep a VM alive."""
    for _receiver, outcome in attempt_final_grading.send_robust(sender=Attempt, attempt=attempt, trigger=trigger):
        if isinstance(outcome, Exception):
            logger.error(
                "attempt %s: the final grading run failed; deleting its VM anyway", attempt.id, exc_info=outcome
            )


def attempt_teardown(*, attempt_id: int) -> str:
    """For a stopping attempt: grade once more if its agent ever answered, then delete the VM and Secret. For a
    failed one: delete what is left. Ends the attempt at once if the VM was already gone."""
    attempt = Attempt.objects.select_related("lab").filter(id=attempt_id).first()
    if attempt is None:
        return "missing"
    if attempt.state == AttemptState.STOPPING:
        if attempt.agent_ready_at is not None and attempt.vm_deleted_at is None:
            claimed = Attempt.objects.filter(id=attempt_id, final_grading_at__isnull=True).update(
                final_grading_at=timezone.now()
            )
            if claimed:
                trigger = "expiry" if attempt.stop_reason == StopReason.EXPIRED else "stop"
                grade_final(attempt=attempt, trigger=trigger)
                cache.set(
                    FINAL_GRADING_DONE_KEY.format(attempt_id=attempt_id),
                    "1",
                    timeout=settings.CELERY_TASK_TIME_LIMIT + 60,
                )
            elif _final_grading_elsewhere(attempt_id):
                # A second delivery of this teardown while the first grades: deleting the VM now would cut that
                # final run off. The first deletes it; if it died, the sweep queues the teardown again later.
                return "grading_elsewhere"
        existed = _delete_vm_and_secret(attempt)
        if not existed:
            attempt_end(attempt_id=attempt_id)
        return "deleted" if existed else "ended"
    if attempt.state in FINAL_STATES and attempt.vm_deleted_at is None and attempt.vm_name:
        _delete_vm_and_secret(attempt)
        return "cleaned"
    return "skipped"


def teardowns_resume(*, namespace: str) -> int:
    """The namespace answers a list again after failing: queue the teardown of each of its stopping attempts whose
    VM is still there now, rather than at its next backed-off retry (up to a minute away) or at the sweep."""
    ids = list(
        Attempt.objects.filter(
            namespace=namespace, state=AttemptState.STOPPING, vm_deleted_at__isnull=True
        ).values_list("id", flat=True)
    )
    for attempt_id in ids:
        enqueue_teardown(attempt_id)
    if ids:
        logger.info("cluster answers again in %s: teardown of %s resumed", namespace, ids)
    return len(ids)


def _final_grading_elsewhere(attempt_id: int) -> bool:
    """Whether another teardown is running the final grading right now: it claimed it recently (a claim older than
    the task time limit belongs to a worker that died) and has not said it finished. A retry of the teardown that
    did the grading (its delete failed) finds it finished and goes on to delete the VM."""
    since = timezone.now() - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT)
    if not Attempt.objects.filter(id=attempt_id, vm_deleted_at__isnull=True, final_grading_at__gt=since).exists():
        return False
    return cache.get(FINAL_GRADING_DONE_KEY.format(attempt_id=attempt_id)) is None


def _delete_vm_and_secret(attempt: Attempt) -> bool:
    existed = operations.vm_delete(namespace=attempt.namespace, name=attempt.vm_name)
    operations.secret_delete(namespace=attempt.namespace, name=names.cloud_init_secret_name(attempt.vm_name))
    Attempt.objects.filter(id=attempt.id, vm_deleted_at__isnull=True).update(vm_deleted_at=timezone.now())
    return existed
