"""The object store: resourceVersions, per-resource watch history with compaction, and watch fan-out.

Stored objects are never mutated in place: every write stores a new dict, so an object handed to a watcher or
cached as JSON stays valid. Reads are O(objects in the namespace); a write costs O(watchers of the resource).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from kubesim.selectors import FieldSelector, LabelSelector

Key = tuple[str, str, str]  # (resource, namespace or "", name)


_stamp_cache: tuple[int, str] = (0, "")


def now_rfc3339() -> str:
    """The current time as metav1.Time renders it (whole seconds), formatted once per second."""
    global _stamp_cache
    second = int(time.time())
    if _stamp_cache[0] != second:
        _stamp_cache = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return _stamp_cache[1]


class Entry:
    """A stored object with its JSON encoding computed at most once."""

    __slots__ = ("obj", "_json")

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self._json: bytes | None = None

    def json(self) -> bytes:
        if self._json is None:
            self._json = orjson.dumps(self.obj)
        return self._json


@dataclass
class WatchEvent:
    rv: int
    type: str
    entry: Entry
    old: dict[str, Any] | None = None


@dataclass(eq=False)
class Watcher:
    """One open watch: its filters and the queue its HTTP stream drains."""

    resource: str
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    limit: int = 100_000
    overflowed: bool = False
    drop_mode: str | None = None  # set when kubesim ends the watch: "reset" cuts the connection, "close" ends it

    def wants(self, obj: dict[str, Any]) -> bool:
        if self.namespace and obj["metadata"].get("namespace") != self.namespace:
            return False
        return self.labels.matches(obj["metadata"].get("labels")) and self.fields.matches(obj)

    def offer(self, event_type: str, entry: Entry) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() >= self.limit:
            # A client that stopped reading gets its stream ended rather than unbounded memory.
            self.overflowed = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait((event_type, entry))


class TooOldResourceVersion(Exception):
    """The requested resourceVersion has been compacted away (410 Gone / Expired)."""


class Store:
    """All objects of all resources, keyed by (resource, namespace, name)."""

    def __init__(self, *, history_size: int = 10_000) -> None:
        self.history_size = history_size
        self.rv = 1
        self._objects: dict[str, dict[str, dict[str, Entry]]] = {}
        self._history: dict[str, deque[WatchEvent]] = {}
        self._compacted: dict[str, int] = {}
        self._watchers: dict[str, set[Watcher]] = {}
        self._by_uid: dict[str, Key] = {}
        self._dependents: dict[str, set[Key]] = {}
        self.listeners: list[Callable[[str, WatchEvent], None]] = []

    # ---- reads -------------------------------------------------------------------------------------------
    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        entry = self._objects.get(resource, {}).get(namespace, {}).get(name)
        return entry.obj if entry else None

    def entry(self, resource: str, namespace: str, name: str) -> Entry | None:
        return self._objects.get(resource, {}).get(namespace, {}).get(name)

    def entries(self, resource: str, namespace: str | None = None) -> Iterator[Entry]:
        by_namespace = self._objects.get(resource, {})
        if namespace is not None:
            yield from list(by_namespace.get(namespace, {}).values())
            return
        for names in list(by_namespace.values()):
            yield from list(names.values())

    def objects(self, resource: str, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        for entry in self.entries(resource, namespace):
            yield entry.obj

    def by_uid(self, uid: str) -> dict[str, Any] | None:
        key = self._by_uid.get(uid)
        return self.get(*key) if key else None

    def key_of_uid(self, uid: str) -> Key | None:
        return self._by_uid.get(uid)

    def dependents(self, owner_uid: str) -> list[Key]:
        return list(self._dependents.get(owner_uid, ()))

    def namespaces_in_use(self, namespace: str) -> bool:
        return any(namespace in names and names[namespace] for names in self._objects.values())

    def count(self, resource: str) -> int:
        return sum(len(names) for names in self._objects.get(resource, {}).values())

    # ---- writes ------------------------------------------------------------------------------------------
    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object: the caller has checked that the name is free."""
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_rfc3339())
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        namespace = meta.get("namespace", "")
        entry = Entry(obj)
        self._objects.setdefault(resource, {}).setdefault(namespace, {})[meta["name"]] = entry
        key = (resource, namespace, meta["name"])
        self._by_uid[meta["uid"]] = key
        self._index_owners(key, None, obj)
        self._publish(resource, WatchEvent(rv, "ADDED", entry))
        return obj

    def replace(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new version of an existing object (a fresh dict, never the stored one)."""
        meta = obj["metadata"]
        namespace = meta.get("namespace", "")
        names = self._objects[resource][namespace]
        old = names[meta["name"]].obj
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        entry = Entry(obj)
        names[meta["name"]] = entry
        self._index_owners((resource, namespace, meta["name"]), old, obj)
        self._publish(resource, WatchEvent(rv, "MODIFIED", entry, old))
        return obj

    def remove(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        names = self._objects.get(resource, {}).get(namespace, {})
        entry = names.pop(name, None)
        if entry is None:
            return None
        if not names:
            self._objects[resource].pop(namespace, None)
        obj = dict(entry.obj)
        obj["metadata"] = dict(obj["metadata"])
        rv = self._next_rv()
        # A DELETED event carries the last state with a new resourceVersion, as etcd3's watch does.
        obj["metadata"]["resourceVersion"] = str(rv)
        self._by_uid.pop(obj["metadata"].get("uid"), None)
        self._index_owners((resource, namespace, name), entry.obj, None)
        self._publish(resource, WatchEvent(rv, "DELETED", Entry(obj), entry.obj))
        return obj

    def _index_owners(self, key: Key, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        old_owners = {ref.get("uid") for ref in (old or {}).get("metadata", {}).get("ownerReferences") or ()}
        new_owners = {ref.get("uid") for ref in (new or {}).get("metadata", {}).get("ownerReferences") or ()}
        for uid in old_owners - new_owners:
            dependents = self._dependents.get(uid)
            if dependents:
                dependents.discard(key)
                if not dependents:
                    del self._dependents[uid]
        for uid in new_owners - old_owners:
            self._dependents.setdefault(uid, set()).add(key)

    # ---- watch -------------------------------------------------------------------------------------------
    def _publish(self, resource: str, event: WatchEvent) -> None:
        history = self._history.get(resource)
        if history is None:
            history = self._history[resource] = deque()
        history.append(event)
        if len(history) > self.history_size:
            self._compacted[resource] = history.popleft().rv
        for watcher in tuple(self._watchers.get(resource, ())):
            self._deliver(watcher, event)
        for listener in self.listeners:
            listener(resource, event)

    @staticmethod
    def _deliver(watcher: Watcher, event: WatchEvent) -> None:
        new = event.entry.obj
        if event.type == "ADDED":
            if watcher.wants(new):
                watcher.offer("ADDED", event.entry)
        elif event.type == "DELETED":
            if watcher.wants(new):
                watcher.offer("DELETED", event.entry)
        else:
            now_in = watcher.wants(new)
            was_in = watcher.wants(event.old) if event.old is not None else now_in
            if now_in and was_in:
                watcher.offer("MODIFIED", event.entry)
            elif now_in:
                watcher.offer("ADDED", event.entry)
            elif was_in:
                watcher.offer("DELETED", event.entry)

    def watch(self, watcher: Watcher, since: int | None) -> None:
        """Register a watcher; replay history after ``since`` (None: from now). Raises TooOldResourceVersion."""
        if since is not None:
            if since < self._compacted.get(watcher.resource, 0):
                raise TooOldResourceVersion()
            backlog = []
            for event in reversed(self._history.get(watcher.resource, ())):
                if event.rv <= since:
                    break
                backlog.append(event)
            for event in reversed(backlog):
                self._deliver(watcher, event)
        self._watchers.setdefault(watcher.resource, set()).add(watcher)

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.get(watcher.resource, set()).discard(watcher)

    def all_watchers(self) -> list[Watcher]:
        return [w for watchers in self._watchers.values() for w in watchers]

    def oldest_valid_rv(self, resource: str) -> int:
        return self._compacted.get(resource, 0)
