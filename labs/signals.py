"""Signals by which labs reaches the apps built on it, which labs does not import (grading)."""

from django.dispatch import Signal

# Sent with ``attempt`` and ``trigger`` before an attempt's VM is deleted; grading's receiver runs the final
# grading, synchronously, while the guest is still there.
attempt_final_grading = Signal()

# Sent with ``attempt`` (one the socket's user may see) as its events socket opens; each receiver returns the
# messages it adds after the attempt's status (grading: the latest run).
attempt_socket_opened = Signal()
