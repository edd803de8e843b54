"""Putting an attempt's VM on the cluster, and failing an attempt; each safe to rerun after a crash at any line."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Value, When
from django.utils.translation import gettext as _

from labs.kubevirt import manifests, names, operations
from labs.kubevirt.operations import ClusterError
from labs.models import ACTIVE_STATES, FINAL_STATES, Attempt, AttemptState
from labs.pool_models import PoolVm
from labs.services.agents import watch_new_vm
from labs.services.namespaces import tenant_namespace_ensure
from labs.services.stopping import enqueue_teardown
from labs.states import attempt_transition
from labs.wording import in_every_language

logger = logging.getLogger(__name__)

# The ``provisioning`` push is held this long: making the VM usually takes less, and the page gets ``starting`` alone.
PROVISIONING_PUSH_HOLD_SECONDS = 1.0


def attempt_fail(
    *, attempt_id: int, reason: Callable[[], str], from_states: tuple[str, ...] = ACTIVE_STATES, teardown: bool = True
) -> bool:
    """Fail the attempt and queue its clean-up unless nothing was made for it (``reason`` is called per language);
    False if it left ``from_states``."""
    texts = {code: text[:4000] for code, text in in_every_language(reason).items()}
    default = texts.get(settings.LANGUAGE_CODE) or next(iter(texts.values()))
    # The text field keeps the attempt's own language, picked in the update itself.
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
        if teardown:
            enqueue_teardown(attempt_id)
    logger.info("attempt %s failed: %s", attempt_id, default)
    return True


def attempt_provision(*, attempt_id: int) -> str:
    """Create the attempt's cloud-init Secret and VM; the attempt becomes ``starting``. Raises ``ClusterError``."""
    attempt = Attempt.objects.select_related("lab", "tenant").filter(id=attempt_id).first()
    if attempt is not None and attempt.state == AttemptState.REQUESTED:
        if names.pool_vm_id_from_vm_name(attempt.vm_name):
            # It claimed a warm pool's VM (a lost claim task, queued again by the sweep): finish that claim instead.
            from labs.services.pool_claim import pool_claim_finish

            pool_claim_finish(attempt_id=attempt_id)
            return "skipped"
        moved = attempt_transition(
            attempt=attempt,
            to=AttemptState.PROVISIONING,
            from_states=(AttemptState.REQUESTED,),
            hold=PROVISIONING_PUSH_HOLD_SECONDS,
        )
        if moved is None:
            attempt.refresh_from_db(fields=["state"])
    if attempt is None or attempt.state != AttemptState.PROVISIONING:
        return "skipped"  # done by an earlier delivery, or stopped before it began

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
        return "failed"

    if not lab_vm_create(owner=attempt, user_data=user_data):
        attempt_fail(
            attempt_id=attempt_id,
            reason=lambda: (
                _("A VM named %(name)s that belongs to something else is in the way; an operator must remove it.")
                % {"name": attempt.vm_name}
            ),
        )
        return "failed"

    # Any other write to a provisioning attempt (a sync, a stop) moves it on, and then this matches nothing.
    if attempt_transition(attempt=attempt, to=AttemptState.STARTING, from_states=(AttemptState.PROVISIONING,)) is None:
        # It left ``provisioning`` while its VM was made (a stop): if its teardown ran already, delete the VM.
        attempt.refresh_from_db(fields=["state", "vm_deleted_at"])
        if attempt.state in FINAL_STATES or (attempt.state == AttemptState.STOPPING and attempt.vm_deleted_at):
            operations.vm_and_secret_delete(namespace=attempt.namespace, name=attempt.vm_name)
        return "abandoned"
    watch_new_vm(attempt.namespace)
    return "created"


def lab_vm_create(*, owner: Attempt | PoolVm, user_data: str) -> bool:
    """Create the VM of an attempt or a pool VM and its cloud-init Secret (owned by the VM) in the tenant's
    namespace; False when a VM of that name with other labels is in the way."""
    lab, namespace = owner.lab, owner.namespace
    ids = {"tenant_id": owner.tenant_id, "course_id": lab.course_id, "lab_id": lab.id}
    if isinstance(owner, Attempt):
        labels = names.attempt_labels(**ids, attempt_id=owner.id)
    else:
        labels = names.pool_vm_labels(**ids, pool_vm_id=owner.id)
    tenant_namespace_ensure(tenant=owner.tenant)
    secret_name = names.cloud_init_secret_name(owner.vm_name)
    try:
        operations.secret_create(
            manifests.cloud_init_secret(name=secret_name, namespace=namespace, labels=labels, user_data=user_data)
        )
        created_vm, _created = operations.vm_create(
            manifests.virtual_machine(
                name=owner.vm_name,
                namespace=namespace,
                labels=labels,
                image=lab.image,
                vcpus=owner.vcpus,
                memory_mib=owner.memory_mib,
                host_passthrough=lab.nested_virtualization,
                cloud_init_secret=secret_name,
            )
        )
    except ClusterError as error:
        if error.status == 404:
            tenant_namespace_ensure(tenant=owner.tenant, force=True)
            error.transient = True
        raise
    if not labels.items() <= ((created_vm.get("metadata") or {}).get("labels") or {}).items():
        return False
    operations.secret_set_owner(namespace=namespace, name=secret_name, owner=manifests.owner_reference(created_vm))
    return True
