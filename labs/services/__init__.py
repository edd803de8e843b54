"""Every write of the labs app, split by subject; the names below are what other apps import."""

from labs.services.namespaces import tenant_namespace_ensure
from labs.services.provisioning import attempt_provision
from labs.services.start import attempt_start, attempt_start_limited
from labs.services.stopping import attempt_expire, attempt_extend, attempt_stop
from labs.services.tracking import namespace_sync

__all__ = [
    "attempt_expire",
    "attempt_extend",
    "attempt_provision",
    "attempt_start",
    "attempt_start_limited",
    "attempt_stop",
    "namespace_sync",
    "tenant_namespace_ensure",
]
