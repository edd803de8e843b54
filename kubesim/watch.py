"""Watch streams: the newline-delimited events the API server sends, with bookmarks, 410 Expired and the
dropped-connection faults."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kubesim.bodies import bool_param, int_param, wants_table
from kubesim.errors import ApiError
from kubesim.resources import ResourceType
from kubesim.selectors import FieldSelector, LabelSelector
from kubesim.store import TooOldResourceVersion, Watcher
from kubesim.tables import to_table

if TYPE_CHECKING:
    from kubesim.server import KubeSim

_JSON = "application/json"


async def serve_watch(
    sim: KubeSim,
    request: web.Request,
    rt: ResourceType,
    namespace: str | None,
    labels: LabelSelector,
    fields: FieldSelector,
) -> web.StreamResponse:
    """A watch stream: synthetic ADDED events or history replay, then live events, bookmarks, 410 Expired."""
    query = request.query
    rv_text = query.get("resourceVersion", "")
    send_initial = bool_param(query.get("sendInitialEvents"))
    bookmarks = bool_param(query.get("allowWatchBookmarks"))
    table = wants_table(request)
    include_object = query.get("includeObject", "Metadata")
    timeout = float(int_param(query, "timeoutSeconds") or sim.config.watch_timeout)
    watcher = Watcher(rt.key, namespace, labels, fields)
    initial = []
    expired = None
    if rv_text in ("", "0") or send_initial:
        initial = [e for e in sim.store.entries(rt.key, namespace) if watcher.wants(e.obj)]
        sim.store.watch(watcher, None)
    else:
        try:
            since = int(rv_text)
        except ValueError as exc:
            raise ApiError(400, f"invalid resource version {rv_text!r}") from exc
        try:
            sim.store.watch(watcher, since)
        except TooOldResourceVersion:
            expired = since
    response = web.StreamResponse(status=200, headers={"Content-Type": _JSON, "Cache-Control": "no-cache, private"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    if expired is not None:
        oldest = sim.store.oldest_valid_rv(rt.key)
        status = ApiError(410, f"too old resource version: {expired} ({oldest})", reason="Expired").status()
        await response.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
        await response.write_eof()
        return response
    sim.watches.add(watcher)
    loop = asyncio.get_running_loop()
    drop_at = float("inf")
    if sim.faults.watch_drop_after is not None:
        drop_at = loop.time() + sim.faults.watch_drop_after
    deadline = min(loop.time() + timeout, drop_at)
    next_bookmark = loop.time() + sim.config.bookmark_interval
    drop_mode = None
    try:
        if initial:
            await response.write(b"".join(_event_line(rt, "ADDED", e, table, include_object) for e in initial))
            sim.counters.watch_events += len(initial)
        if send_initial and bookmarks:
            await response.write(_bookmark(sim, rt, initial_end=True))
        while True:
            now = loop.time()
            if now >= deadline:
                if now >= drop_at:
                    drop_mode = "reset"  # the injected fault: the connection dies mid-stream
                break
            wait = deadline - now
            if bookmarks:
                wait = min(wait, max(0.0, next_bookmark - now))
            try:
                # Not wait_for: on Python 3.11 it drops a cancellation (the client gone) that arrives as an
                # event does, and the stream would go on for a client that left.
                async with asyncio.timeout(wait):
                    item = await watcher.queue.get()
            except TimeoutError:
                if bookmarks and loop.time() >= next_bookmark and watcher.queue.empty():
                    await response.write(_bookmark(sim, rt))
                    next_bookmark = loop.time() + sim.config.bookmark_interval
                continue
            if item is None:
                drop_mode = watcher.drop_mode
                break
            chunks = [item]
            while not watcher.queue.empty():
                extra = watcher.queue.get_nowait()
                if extra is None:
                    drop_mode = watcher.drop_mode
                    break
                chunks.append(extra)
            await response.write(b"".join(_event_line(rt, t, e, table, include_object) for t, e in chunks))
            sim.counters.watch_events += len(chunks)
            if drop_mode is not None:
                break
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    finally:
        sim.store.unwatch(watcher)
        sim.watches.discard(watcher)
    if drop_mode == "reset" and request.transport is not None:
        request.transport.abort()
        return response
    await response.write_eof()
    return response


def _event_line(rt: ResourceType, event_type: str, entry: Any, table: bool, include_object: str) -> bytes:
    if table:
        obj = to_table(
            rt.key,
            [entry.obj],
            resource_version=entry.obj["metadata"]["resourceVersion"],
            include_object=include_object,
        )
        return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"
    return b'{"type":"' + event_type.encode() + b'","object":' + entry.json() + b"}\n"


def _bookmark(sim: KubeSim, rt: ResourceType, *, initial_end: bool = False) -> bytes:
    metadata: dict[str, Any] = {"resourceVersion": str(sim.store.rv)}
    if initial_end:
        metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
    return (
        json.dumps(
            {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": metadata}}
        ).encode()
        + b"\n"
    )
