"""Console output recorded per attempt as asciicast v2, for TAs and instructors to replay.

One file per attempt, ``attempt-<id>.cast`` under ``settings.CONSOLE_RECORDINGS_DIR``: a JSON header line,
then one ``[seconds, "o", text]`` line per chunk of output. Whoever holds the upstream appends to it, so
the file continues across reconnects and changes of holder (with several hosts the directory must be shared).
Writes are batched and done off the event loop; a recording stops at a size cap with a marker saying so.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import time
from pathlib import Path

from django.conf import settings

logger = logging.getLogger(__name__)

ASCIICAST_CONTENT_TYPE = "application/x-asciicast"
# Output waiting for the periodic flush is written at once past this size: a serial console can produce tens of
# megabytes a second, which must not pile up in memory between two flushes.
FLUSH_AT_BYTES = 256 * 1024
# Should the disk fall behind even so, output past this backlog is left out of the recording (with a marker)
# rather than held in memory.
MAX_PENDING_BYTES = 4 * 1024 * 1024
DEFAULT_WIDTH = 80
DEFAULT_HEIGHT = 24


def recording_path(*, attempt_id: int) -> Path:
    return Path(settings.CONSOLE_RECORDINGS_DIR) / f"attempt-{int(attempt_id)}.cast"


def _read_header(path: Path) -> dict | None:
    try:
        with path.open("rb") as handle:
            return json.loads(handle.readline())
    except (OSError, ValueError):
        return None


def _open_for_append(path: Path, *, title: str) -> tuple[float, int]:
    """Create the file with its header if needed; returns (start timestamp, current size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = _read_header(path) if path.exists() else None
    if header is None or header.get("version") != 2:
        start = time.time()
        header = {
            "version": 2, "width": DEFAULT_WIDTH, "height": DEFAULT_HEIGHT, "timestamp": int(start),
            "title": title, "env": {"TERM": "xterm-256color"},
        }
        with path.open("w", encoding="utf-8") as handle:
            handle.write(json.dumps(header) + "\n")
    return float(header["timestamp"]), path.stat().st_size


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)


class AsciicastRecorder:
    """Buffers events in memory and appends them to the attempt's recording every flush interval."""

    def __init__(self, *, attempt_id: int, max_bytes: int, flush_seconds: float) -> None:
        self.path = recording_path(attempt_id=attempt_id)
        self.title = f"attempt {attempt_id}"
        self.max_bytes = max_bytes
        self.flush_seconds = flush_seconds
        # Serial output may split a UTF-8 sequence across frames; decode incrementally.
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.start: float | None = None
        self.size = 0
        self.pending: list[str] = []
        self.pending_bytes = 0
        self.truncated = False
        self.failed = False
        self.skipped_bytes = 0
        self._flusher: asyncio.Task | None = None
        self._early_flush: asyncio.Task | None = None
        self._write_lock = asyncio.Lock()  # flushes append in order

    async def open(self) -> None:
        try:
            self.start, self.size = await asyncio.to_thread(_open_for_append, self.path, title=self.title)
        except OSError:
            logger.exception("Cannot open the console recording %s; output of this session is not recorded", self.path)
            self.failed = True
            return
        self.truncated = self.size >= self.max_bytes
        self._flusher = asyncio.create_task(self._flush_periodically(), name=f"recording-flush-{self.path.name}")

    def _event(self, kind: str, text: str) -> None:
        if self.failed or self.truncated or self.start is None or not text:
            return
        if self.pending_bytes >= MAX_PENDING_BYTES:
            self.skipped_bytes += len(text)
            return
        line = json.dumps([round(time.time() - self.start, 6), kind, text], ensure_ascii=False) + "\n"
        encoded = len(line.encode())
        if self.size + self.pending_bytes + encoded > self.max_bytes:
            self.truncated = True
            line = json.dumps([round(time.time() - self.start, 6), "m", "recording truncated: size limit"]) + "\n"
        self.pending.append(line)
        self.pending_bytes += len(line.encode())
        if self.pending_bytes >= FLUSH_AT_BYTES and (self._early_flush is None or self._early_flush.done()):
            self._early_flush = asyncio.get_running_loop().create_task(self.flush())

    def output(self, data: bytes) -> None:
        self._event("o", self.decoder.decode(data))

    def marker(self, label: str) -> None:
        self._event("m", label)

    async def flush(self) -> None:
        async with self._write_lock:
            if not self.pending or self.failed:
                return
            text, self.pending, written = "".join(self.pending), [], self.pending_bytes
            self.pending_bytes = 0
            try:
                await asyncio.to_thread(_append, self.path, text)
                self.size += written
            except OSError:
                logger.exception("Cannot write the console recording %s; recording stops", self.path)
                self.failed = True
                return
        if self.skipped_bytes:
            skipped, self.skipped_bytes = self.skipped_bytes, 0
            self._event("m", f"recording skipped {skipped} characters of output (the disk fell behind)")

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.flush_seconds)
            await self.flush()

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        if self._early_flush is not None:
            await self._early_flush
            self._early_flush = None
        tail = self.decoder.decode(b"", final=True)
        if tail:
            self._event("o", tail)
        await self.flush()
