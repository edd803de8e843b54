"""Every write of the labs app: what people do to attempts, and what the system does as the cluster moves.

Split by subject; the names below are the contract other apps import.

- ``start``: ``attempt_start`` (``attempt_start_limited``: behind the per-person limit); ``quota``: the capacity
  and per-student limits it checks
- ``stopping``: ``attempt_stop``, ``attempt_extend``, ``attempt_expire``, the stop when left; ``presence``: whether
  a page has the attempt open
- ``provisioning``: the VM and Secret onto the cluster, the system's transitions; ``follow_ups``: lists soon after;
  ``teardown``: off the cluster again; ``namespaces``: the tenant's
  namespace
- ``tracking``: the sync (one VMI list per namespace) mapping phases onto attempts
- ``sweeping``: orphans both ways; ``stuck_attempts``: vanished VMs, start timeouts, lost tasks
- ``events``: ``attempt.update`` pushes on commit
"""

from labs.services.namespaces import tenant_namespace_ensure
from labs.services.provisioning import (
    attempt_end,
    attempt_fail,
    attempt_mark_running,
    attempt_provision,
)
from labs.services.start import attempt_start, attempt_start_limited
from labs.services.stopping import attempt_expire, attempt_extend, attempt_stop
from labs.services.sweeping import attempts_sweep
from labs.services.teardown import attempt_teardown
from labs.services.tracking import attempts_sync, namespace_sync

__all__ = [
    "attempt_end",
    "attempt_expire",
    "attempt_extend",
    "attempt_fail",
    "attempt_mark_running",
    "attempt_provision",
    "attempt_start",
    "attempt_start_limited",
    "attempt_stop",
    "attempt_teardown",
    "attempts_sweep",
    "attempts_sync",
    "namespace_sync",
    "tenant_namespace_ensure",
]
