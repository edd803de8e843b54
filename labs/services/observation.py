"""One attempt's VMI, as a list showed it, applied to the attempt: phase times, the node, a failure or a problem
that outlasted its grace (in the cluster's words), waiting for the agent, a restarted VMI."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from labs.kubevirt import explain, operations, status
from labs.kubevirt.operations import ClusterError
from labs.models import Attempt, AttemptState
from labs.services.events import attempt_push_on_commit
from labs.services.provisioning import attempt_fail
from labs.services.stopping import attempt_end
from labs.states import attempt_transition
from labs.wording import in_every_language, node_drained, with_cluster_words

logger = logging.getLogger(__name__)


def start_again_hint() -> str:
    return _("You can start the lab again; a failed attempt does not count against your attempt limit.")


class Outcome:
    UNCHANGED = "unchanged"
    CHANGED = "changed"
    FAILED = "failed"
    ENDED = "ended"
    AWAITING_AGENT = "awaiting_agent"


def _observed_changes(attempt: Attempt, observation: status.VmiObservation) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for phase, field_name in status.PHASE_FIELDS.items():
        when = observation.phase_times.get(phase)
        if when is not None and getattr(attempt, field_name) is None:
            changes[field_name] = when
    if observation.phase != attempt.phase:
        changes["phase"] = observation.phase
    if observation.node_name and observation.node_name != attempt.node_name:
        changes["node_name"] = observation.node_name
    if observation.uid and observation.uid != attempt.vmi_uid:
        changes["vmi_uid"] = observation.uid
    return changes


def _fail_restarted(attempt: Attempt) -> str:
    """KubeVirt replaced the VMI that ran with a new one from a fresh disk: the work is gone (the why is in Events)."""
    detail = explain.events_said(namespace=attempt.namespace, name=attempt.vm_name)
    try:  # a drain shuts down what cannot live-migrate (evictionStrategy None, or LiveMigrateIfPossible)
        drained = bool(attempt.node_name) and operations.node_cordoned(attempt.node_name)
    except ClusterError as error:
        logger.info("attempt %s: node %s unreadable (%s)", attempt.id, attempt.node_name, error.message)
        drained = False

    def reason() -> str:
        if drained:
            return node_drained(detail)
        return with_cluster_words(
            _(
                "The VM stopped unexpectedly (it crashed or was shut down from inside) and was restarted from a fresh "
                "disk, so the work in it is lost."
            ),
            detail,
        )

    return _fail(attempt, reason)


def _fail(attempt: Attempt, reason: Callable[[], str]) -> str:
    return Outcome.FAILED if attempt_fail(attempt_id=attempt.id, reason=reason) else Outcome.UNCHANGED


def attempt_observe(*, attempt: Attempt, vmi: dict[str, Any] | None, now: datetime) -> str:
    """Apply what the attempt's VMI (or its absence) says, in the attempt's language and in each; an ``Outcome``."""
    with translation.override(attempt.language or settings.LANGUAGE_CODE):
        if attempt.state == AttemptState.STOPPING:
            if vmi is None and attempt.vm_deleted_at is not None:
                return Outcome.ENDED if attempt_end(attempt_id=attempt.id) else Outcome.UNCHANGED
            return Outcome.UNCHANGED
        if vmi is None:
            return Outcome.UNCHANGED  # no VMI yet: still starting; a VM gone altogether is the sweep's to judge

        observation = status.observe_vmi(vmi)
        if attempt.vmi_uid and observation.uid and observation.uid != attempt.vmi_uid and attempt.vmi_running_at:
            return _fail_restarted(attempt)
        changes = _observed_changes(attempt, observation)
        to = None
        if attempt.state == AttemptState.PROVISIONING:
            # The VM exists but its provisioning never recorded it (a worker died after creating it).
            to = AttemptState.STARTING
            changes["provisioned_at"] = attempt.provisioned_at or now

        if observation.failed:
            _apply(attempt, changes, to=to)
            failure = explain.failed_vmi_words(vmi)
            if attempt.state == AttemptState.RUNNING:
                return _fail(attempt, lambda: _("The VM stopped unexpectedly.") + " " + failure())
            return _fail(attempt, lambda: failure() + " " + start_again_hint())

        if attempt.state != AttemptState.RUNNING:
            message: Callable[[dict[str, Any]], str] | None = None
            if observation.problem:
                since = observation.problem_since or now
                if observation.problem_final or (now - since).total_seconds() >= status.grace_seconds(observation):
                    _apply(attempt, changes, to=to)
                    return _fail(attempt, lambda: _problem(vmi) + " " + start_again_hint())
                message = _problem
            elif observation.running:
                message = _waiting_for_agent
            worded = message(vmi) if message else ""  # in the attempt's language, as the stored message is
            if worded != attempt.status_message:
                changes["status_message"] = worded
                changes["status_message_texts"] = in_every_language(lambda: message(vmi)) if message else {}

        changed = _apply(attempt, changes, to=to)
        if observation.running and (to or attempt.state) == AttemptState.STARTING:
            return Outcome.AWAITING_AGENT
        return Outcome.CHANGED if changed else Outcome.UNCHANGED


def _problem(vmi: dict[str, Any]) -> str:
    """The VMI's problem in the active language (the interpretation is pure: worded again per language)."""
    return status.observe_vmi(vmi).problem


def _waiting_for_agent(vmi: dict[str, Any]) -> str:
    return _("The VM is running; waiting for the lab agent inside it to start.")


def _apply(attempt: Attempt, changes: dict[str, Any], *, to: str | None = None) -> bool:
    """Write ``changes`` (and move the attempt ``to`` a state) if it is still in the state it was read in."""
    if to is not None:
        return attempt_transition(attempt=attempt, to=to, from_states=(attempt.state,), **changes) is not None
    if not changes:
        return False
    updated = Attempt.objects.filter(id=attempt.id, state=attempt.state).update(**changes, updated_at=timezone.now())
    if not updated:
        return False
    for name, value in changes.items():
        setattr(attempt, name, value)
    attempt_push_on_commit(attempt=attempt)
    return True
