"""What the cluster's Events say about a VM that failed or would not start, for when its VMI does not say (KubeVirt
v1.9 writes no ``status.reason`` for a failed launcher or guest)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from labs.kubevirt import operations, status
from labs.kubevirt.operations import ClusterError

logger = logging.getLogger(__name__)


def events_said(*, namespace: str, name: str) -> str:
    """The latest Warning events about the objects named ``name``; '' when the cluster cannot say."""
    try:
        return status.events_problem(operations.events_for(namespace=namespace, name=name))
    except ClusterError as error:
        logger.info("events of %s/%s unavailable: %s", namespace, name, error.message)
        return ""


def failed_vmi_words(vmi: Mapping[str, Any]) -> Callable[[], str]:
    """A function giving the Failed VMI's reason in the active language (pure: call it under each language)."""
    if status.observe_vmi(vmi).explained:
        return lambda: status.failed_problem(vmi)
    metadata = vmi.get("metadata") or {}
    said = events_said(namespace=metadata.get("namespace", ""), name=metadata.get("name", ""))
    return lambda: status.failed_problem(vmi, said)
