"""Signals and hooks by which labs reaches the apps built on it, which labs does not import (grading)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from django.dispatch import Signal

if TYPE_CHECKING:
    from labs.models import Attempt

# Sent with ``attempt`` and ``trigger`` before an attempt's VM is deleted; grading's receiver runs the final
# grading, synchronously, while the guest is still there.
attempt_final_grading = Signal()


def socket_part_register(part: Callable[[Attempt], list[dict]]) -> None:
    """Add ``part``'s messages after the attempt's status on each events socket that opens (grading: the latest
    run). It is given an attempt the socket's user may see."""
    if part not in socket_parts:
        socket_parts.append(part)


socket_parts: list[Callable[[Attempt], list[dict]]] = []
