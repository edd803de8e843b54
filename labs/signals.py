"""Signals labs sends to the apps built on it, which labs does not import (grading)."""

from django.dispatch import Signal

# Sent with ``attempt`` and ``trigger`` before an attempt's VM is deleted; grading's receiver runs the final
# grading, synchronously, while the guest is still there.
attempt_final_grading = Signal()
