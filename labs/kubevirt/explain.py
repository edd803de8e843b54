"""Why a VM failed when its VMI does not say (KubeVirt v1.9 writes no ``status.reason`` for a failed launcher or
guest): the ``Synchronized`` condition, or else the Events, read once per Failed VMI."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from labs.kubevirt import operations, status
from labs.kubevirt.operations import ClusterError

logger = logging.getLogger(__name__)


def failed_vmi_words(vmi: Mapping[str, Any]) -> Callable[[], str]:
    """A function giving the Failed VMI's reason in the active language (pure: call it under each language)."""
    if status.observe_vmi(vmi).explained:
        return lambda: status.failed_problem(vmi)
    metadata = vmi.get("metadata") or {}
    try:
        said = status.events_problem(
            operations.events_for(namespace=metadata.get("namespace", ""), name=metadata.get("name", ""))
        )
    except ClusterError as error:
        logger.info(
            "events of VMI %s/%s unavailable: %s", metadata.get("namespace"), metadata.get("name"), error.message
        )
        said = ""
    return lambda: status.failed_problem(vmi, said)
