"""``meta.k8s.io/v1`` Table output, so ``kubectl get`` shows the columns a real cluster shows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

Column = tuple[str, str, int, str]  # name, type, priority, json path (dotted) or a computed key


def _age(timestamp: str | None) -> str:
    """kube's HumanDuration, as the API server renders the Age column."""
    if not timestamp:
        return "<unknown>"
    then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    seconds = max(0, int((datetime.now(UTC) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def _ready_condition(obj: dict[str, Any]) -> str:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return condition.get("status", "")
    return ""


def _path(obj: dict[str, Any], path: str) -> Any:
    node: Any = obj
    for part in path.split("."):
        if isinstance(node, list):
            node = node[int(part)] if part.isdigit() and int(part) < len(node) else None
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node


def _pod_ready(pod: dict[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or ()
    total = len(pod.get("spec", {}).get("containers") or ())
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _pod_status(pod: dict[str, Any]) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        waiting = (status.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "PodInitializing"):
            return waiting["reason"]
        terminated = (status.get("state") or {}).get("terminated")
        if terminated and terminated.get("reason") not in (None, "Completed"):
            return terminated["reason"]
    return (pod.get("status") or {}).get("phase", "")


_COMPUTED = {
    "age": lambda o: _age(o["metadata"].get("creationTimestamp")),
    "ready": _ready_condition,
    "pod_ready": _pod_ready,
    "pod_status": _pod_status,
    "restarts": lambda o: sum(s.get("restartCount", 0) for s in (o.get("status") or {}).get("containerStatuses") or ()),
    "secret_data": lambda o: len(o.get("data") or {}),
    "node_status": lambda o: "Ready" if _ready_condition(o) == "True" else "NotReady",
    "node_roles": lambda o: (
        ",".join(
            k.split("/", 1)[1] for k in o["metadata"].get("labels", {}) if k.startswith("node-role.kubernetes.io/")
        )
        or "<none>"
    ),
    "event_object": lambda o: (
        f"{(o.get('involvedObject') or {}).get('kind', '').lower()}/{(o.get('involvedObject') or {}).get('name', '')}"
    ),
    "last_seen": lambda o: _age(o.get("lastTimestamp") or o.get("firstTimestamp")),
}

_COLUMNS: dict[str, list[Column]] = {
    "virtualmachines": [
        ("Name", "string", 0, "metadata.name"),
        ("Age", "date", 0, "age"),
        ("Status", "string", 0, "status.printableStatus"),
        ("Ready", "string", 0, "ready"),
    ],
    "virtualmachineinstances": [
        ("Name", "string", 0, "metadata.name"),
        ("Age", "date", 0, "age"),
        ("Phase", "string", 0, "status.phase"),
        ("IP", "string", 0, "status.interfaces.0.ipAddress"),
        ("NodeName", "string", 0, "status.nodeName"),
        ("Ready", "string", 0, "ready"),
    ],
    "pods": [
        ("Name", "string", 0, "metadata.name"),
        ("Ready", "string", 0, "pod_ready"),
        ("Status", "string", 0, "pod_status"),
        ("Restarts", "string", 0, "restarts"),
        ("Age", "string", 0, "age"),
        ("IP", "string", 1, "status.podIP"),
        ("Node", "string", 1, "spec.nodeName"),
    ],
    "nodes": [
        ("Name", "string", 0, "metadata.name"),
        ("Status", "string", 0, "node_status"),
        ("Roles", "string", 0, "node_roles"),
        ("Age", "string", 0, "age"),
        ("Version", "string", 0, "status.nodeInfo.kubeletVersion"),
    ],
    "namespaces": [
        ("Name", "string", 0, "metadata.name"),
        ("Status", "string", 0, "status.phase"),
        ("Age", "string", 0, "age"),
    ],
    "secrets": [
        ("Name", "string", 0, "metadata.name"),
        ("Type", "string", 0, "type"),
        ("Data", "string", 0, "secret_data"),
        ("Age", "string", 0, "age"),
    ],
    "events": [
        ("Last Seen", "string", 0, "last_seen"),
        ("Type", "string", 0, "type"),
        ("Reason", "string", 0, "reason"),
        ("Object", "string", 0, "event_object"),
        ("Message", "string", 0, "message"),
    ],
    "kubevirts": [
        ("Name", "string", 0, "metadata.name"),
        ("Age", "date", 0, "age"),
        ("Phase", "string", 0, "status.phase"),
    ],
}
_DEFAULT: list[Column] = [("Name", "string", 0, "metadata.name"), ("Age", "date", 0, "age")]


def _cell(obj: dict[str, Any], source: str) -> Any:
    if source in _COMPUTED:
        return _COMPUTED[source](obj)
    value = _path(obj, source)
    return "" if value is None else value


def to_table(
    resource: str,
    objects: list[dict[str, Any]],
    *,
    resource_version: str,
    include_object: str,
    continue_token: str | None = None,
) -> dict[str, Any]:
    columns = _COLUMNS.get(resource, _DEFAULT)
    rows = []
    for obj in objects:
        if include_object == "Object":
            embedded: Any = obj
        elif include_object == "None":
            embedded = None
        else:
            embedded = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
        rows.append({"cells": [_cell(obj, source) for _, _, _, source in columns], "object": embedded})
    metadata: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": [
            {
                "name": name,
                "type": type_,
                "format": "name" if name == "Name" else "",
                "description": name,
                "priority": priority,
            }
            for name, type_, priority, _ in columns
        ],
        "rows": rows,
    }
