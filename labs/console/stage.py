"""Where an attempt's console stands, from the attempt's state and its VMI's last seen phase alone: decided the same
way by the bridge (whether to dial the VMI) and by the page (whether to open the console socket)."""

from __future__ import annotations

from labs.models import AttemptState

# Only these states may have a VMI whose console is worth dialling; the others are before or after the VM.
CONSOLE_STATES = (AttemptState.STARTING, AttemptState.RUNNING)
CONSOLE_ENDED_STATES = (AttemptState.STOPPING, AttemptState.STOPPED, AttemptState.FAILED, AttemptState.EXPIRED)


def console_stage(*, state: str, phase: str) -> str:
    """``ended``, ``ready`` (the VMI runs: the agent answered, or a list showed it Running) or ``waiting`` (no VM
    yet, or one still being scheduled: dialling it would only be refused)."""
    if state in CONSOLE_ENDED_STATES:
        return "ended"
    if state == AttemptState.RUNNING or (state in CONSOLE_STATES and phase == "Running"):
        return "ready"
    return "waiting"
