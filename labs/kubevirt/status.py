"""Pure reading of the cluster's objects into what an attempt shows: VMI phase and times, node, and a readable
reason from where KubeVirt puts it (a Failed VMI's reason, Synchronized=False, Unschedulable, image pull errors,
the VM's printableStatus, Events; reference §1, §2)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from labs import wording

# VMI phases the attempt records a time for, in order, with the Attempt field each one fills.
PHASE_FIELDS = {
    "Pending": "pending_at",
    "Scheduling": "scheduling_at",
    "Scheduled": "scheduled_at",
    "Running": "vmi_running_at",
}
FINAL_PHASES = ("Failed", "Succeeded")
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")
# The launcher's error when ImageVolume is on but the runtime mounts image volumes empty (reference §6).
CONTAINER_DISK_SIGNATURE = "container-disk"


# Synchronized=False reasons of virt-controller for a launcher pod that was not made.
POD_NOT_CREATED_REASONS = (
    "FailedCreate",
    "FailedCreateValidation",
    "FailedPvcNotFound",
    "ContainerPathVolumesDisabled",
)
QUOTA_SIGNATURE = "exceeded quota"
POD_SECURITY_SIGNATURE = "violates PodSecurity"


class Problem:
    """Stable codes for what can keep a VM from running, stored with the attempt's message."""

    POD_REFUSED = "pod_refused"
    POD_WAITING = "pod_waiting"
    UNSCHEDULABLE = "unschedulable"
    IMAGE_PULL = "image_pull"
    VMI_FAILED = "vmi_failed"
    IMAGE_VOLUME = "image_volume"


@dataclass(frozen=True)
class VmiObservation:
    phase: str
    uid: str = ""
    phase_times: dict[str, datetime] = field(default_factory=dict)
    node_name: str = ""
    # A reason the VM is not (yet) running, in plain words; empty when all is well.
    problem: str = ""
    problem_code: str = ""
    problem_since: datetime | None = None
    # The problem cannot mend by itself: the attempt ends now rather than after the grace.
    problem_final: bool = False

    @property
    def failed(self) -> bool:
        return self.phase == "Failed"

    @property
    def running(self) -> bool:
        return self.phase == "Running"


def _time(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) and value else None


def _conditions(obj: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    status = (obj or {}).get("status") or {}
    return {c.get("type", ""): c for c in status.get("conditions") or () if isinstance(c, Mapping)}


def grace_seconds(observation: VmiObservation) -> int:
    """How long the attempt may wait on this problem: minutes for room (an autoscaler adds nodes), less else."""
    if observation.problem_code == Problem.UNSCHEDULABLE:
        return settings.ATTEMPT_UNSCHEDULABLE_GRACE_SECONDS
    return settings.ATTEMPT_FAILURE_GRACE_SECONDS


def image_volume_hint(message: str) -> str:
    if CONTAINER_DISK_SIGNATURE in message and "no such file or directory" in message:
        return " " + _(
            "The cluster cannot mount the VM's disk: KubeVirt's ImageVolume feature is on but the container runtime "
            "does not support image volumes. An operator must add ImageVolume to disabledFeatureGates in the "
            "KubeVirt resource (run `python manage.py cluster_check`)."
        )
    return ""


def failure_words(vmi: Mapping[str, Any]) -> str:
    """Why a Failed VMI failed: ``status.reason`` (v1.9 sets it only for a lost node), else Synchronized=False's."""
    reason = (vmi.get("status") or {}).get("reason") or ""
    synchronized = _conditions(vmi).get("Synchronized") or {}
    if synchronized.get("status") == "False":
        reason = reason or synchronized.get("reason") or ""
    return ": ".join(part for part in (reason, synchronized.get("message") or "") if part)


def failed_problem(vmi: Mapping[str, Any], events: str = "") -> str:
    """A Failed VMI's reason in plain words, from the VMI, else from the Events about it (``events_problem``)."""
    detail = ((_conditions(vmi).get("Synchronized") or {}).get("message")) or ""
    words = failure_words(vmi) or events or _("no reason given")
    return _("The VM failed (%(reason)s).") % {"reason": words} + image_volume_hint(detail)


def observe_vmi(vmi: Mapping[str, Any]) -> VmiObservation:
    status = vmi.get("status") or {}
    phase = status.get("phase") or ""
    conditions = _conditions(vmi)
    times: dict[str, datetime] = {}  # the first time the VMI reached each phase
    for entry in status.get("phaseTransitionTimestamps") or ():
        when = _time(entry.get("phaseTransitionTimestamp"))
        if entry.get("phase") and when:
            times.setdefault(entry["phase"], when)
    seen = VmiObservation(
        phase=phase,
        uid=(vmi.get("metadata") or {}).get("uid") or "",
        phase_times=times,
        node_name=status.get("nodeName") or "",
    )
    synchronized = conditions.get("Synchronized") or {}
    since = _time(synchronized.get("lastTransitionTime"))

    if phase == "Failed":
        return replace(
            seen,
            problem_code=Problem.IMAGE_VOLUME
            if image_volume_hint(synchronized.get("message") or "")
            else Problem.VMI_FAILED,
            problem=failed_problem(vmi),
            problem_since=times.get("Failed") or since,
        )

    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return replace(
            seen,
            problem_code=Problem.UNSCHEDULABLE,
            problem=_("No node in the cluster has room for this VM right now (the scheduler says: %(why)s).")
            % {"why": scheduled.get("message") or _("no reason given")},
            problem_since=_time(scheduled.get("lastTransitionTime")) or times.get("Pending"),
        )

    if synchronized.get("status") == "False" and synchronized.get("reason") in POD_NOT_CREATED_REASONS:
        message = synchronized.get("message") or synchronized.get("reason") or ""
        waiting = QUOTA_SIGNATURE in message
        # virt-controller retries a failed pod creation: only a refusal no retry can mend (Pod Security, a
        # manifest that cannot be rendered) ends the attempt at once; anything else has the grace.
        final = not waiting and (synchronized.get("reason") != "FailedCreate" or POD_SECURITY_SIGNATURE in message)
        return replace(
            seen,
            problem_code=Problem.POD_WAITING if waiting else Problem.POD_REFUSED,
            problem=wording.pod_waiting(message) if waiting else wording.pod_refused(message),
            problem_since=since or times.get("Pending"),
            problem_final=final,
        )

    if synchronized.get("status") == "False" and synchronized.get("reason") in IMAGE_PULL_REASONS:
        return replace(
            seen,
            problem_code=Problem.IMAGE_PULL,
            problem=_(
                "The lab's disk image could not be downloaded (%(reason)s: %(message)s). Ask your instructor "
                "to check the lab's VM image."
            )
            % {"reason": synchronized.get("reason"), "message": synchronized.get("message") or ""},
            # kubelet flips ErrImagePull ↔ ImagePullBackOff and each flip renews the condition's time: the problem
            # is as old as the phase it keeps the VMI in.
            problem_since=times.get(phase) or times.get("Pending") or since,
        )
    return seen


# VM printableStatus values that name a problem, in plain words (reference §1, precedence list).
_PRINTABLE_PROBLEMS = {
    "ErrorUnschedulable": lambda: _("No node in the cluster has room for this VM."),
    "ErrImagePull": lambda: _("The lab's disk image could not be downloaded."),
    "ImagePullBackOff": lambda: _("The lab's disk image could not be downloaded."),
    "CrashLoopBackOff": lambda: _("The VM keeps failing as it starts."),
    "ErrorPvcNotFound": lambda: _("A disk the VM needs does not exist."),
    "DataVolumeError": lambda: _("A disk the VM needs could not be prepared."),
    "WaitingForVolumeBinding": lambda: _("The VM is waiting for a disk to be bound."),
}


def vm_problem(vm: Mapping[str, Any] | None) -> str:
    """The VM's ``printableStatus`` as a reason, or a failure condition's message; empty when it names none."""
    if not vm:
        return ""
    status = vm.get("status") or {}
    printable = status.get("printableStatus") or ""
    words = _PRINTABLE_PROBLEMS.get(printable)
    if words is not None:
        return f"{words()} ({printable})"
    failure = _conditions(vm).get("Failure") or {}
    if failure.get("status") == "True":
        return failure.get("message") or failure.get("reason") or ""
    return ""


def events_problem(events: Iterable[Mapping[str, Any]]) -> str:
    """The latest Warning events about an attempt's objects, newest last, as one line."""
    warnings = [e for e in events if e.get("type") == "Warning"]
    warnings.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    seen: list[str] = []
    for event in warnings[-3:]:
        text = f"{event.get('reason', '')}: {event.get('message', '')}".strip(": ")
        if text and text not in seen:
            seen.append(text)
    return "; ".join(seen)
