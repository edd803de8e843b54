"""Console output recorded per attempt as asciicast v2 (``attempt-<id>.cast`` under ``CONSOLE_RECORDINGS_DIR``,
shared between hosts) for staff to replay: whoever holds the upstream appends, batched and off the event loop, up
to a size cap marked in the file."""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import time
import weakref
from pathlib import Path

from django.conf import settings

logger = logging.getLogger(__name__)

ASCIICAST_CONTENT_TYPE = "application/x-asciicast"
# Output waiting for the periodic flush is written at once past this size (a console can flood megabytes a second).
FLUSH_AT_BYTES = 256 * 1024
# Should the disk fall behind even so, output past this backlog is left out (with a marker), not held in memory.
MAX_PENDING_BYTES = 4 * 1024 * 1024


def recording_path(*, attempt_id: int) -> Path:
    return Path(settings.CONSOLE_RECORDINGS_DIR) / f"attempt-{int(attempt_id)}.cast"


def _open_for_append(path: Path, *, title: str) -> tuple[float, int]:
    """Create the file with its header if needed; returns (start timestamp, current size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("rb") as handle:
            header = json.loads(handle.readline())
    except (OSError, ValueError):
        header = None
    if not isinstance(header, dict) or header.get("version") != 2:
        header = {
            "version": 2,
            "width": 80,
            "height": 24,
            "timestamp": int(time.time()),
            "title": title,
            "env": {"TERM": "xterm-256color"},
        }
        with path.open("w", encoding="utf-8") as handle:
            handle.write(json.dumps(header) + "\n")
    return float(header["timestamp"]), path.stat().st_size


def _append_all(writes: list[tuple[Path, str]]) -> list[OSError | None]:
    """Append each text to its file; one failing file does not stop the others."""
    errors: list[OSError | None] = []
    for path, text in writes:
        try:
            with path.open("a", encoding="utf-8") as handle:
                handle.write(text)
            errors.append(None)
        except OSError as exc:
            errors.append(exc)
    return errors


class RecordingWriter:
    """Appends what every recorder of one event loop has pending in one worker-thread call per interval, not one
    per console; one write at a time, so each file's appends stay in order."""

    def __init__(self, *, interval: float) -> None:
        self.interval = interval
        self.recorders: set[AsciicastRecorder] = set()
        self.lock = asyncio.Lock()
        self.task: asyncio.Task | None = None

    def add(self, recorder: AsciicastRecorder) -> None:
        self.recorders.add(recorder)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name="console-recordings")

    def discard(self, recorder: AsciicastRecorder) -> None:
        self.recorders.discard(recorder)
        if not self.recorders and self.task is not None and not self.lock.locked():
            self.task.cancel()  # asleep: nothing left to write
            self.task = None

    async def _run(self) -> None:
        while self.recorders:
            await asyncio.sleep(self.interval)
            await self.write(list(self.recorders))

    async def write(self, recorders: list[AsciicastRecorder]) -> None:
        async with self.lock:
            batch = [
                (recorder, recorder.take_pending())
                for recorder in recorders
                if recorder.pending and not recorder.failed
            ]
            if not batch:
                return
            errors = await asyncio.to_thread(_append_all, [(recorder.path, text) for recorder, (text, _) in batch])
        for (recorder, (_, size)), error in zip(batch, errors, strict=True):
            recorder.written(size, error)


# Each event loop's writers, by flush interval.
_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, RecordingWriter]] = (
    weakref.WeakKeyDictionary()
)


class AsciicastRecorder:
    """Buffers events in memory; the loop's writer appends them to the attempt's recording every flush interval."""

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
        self.writer: RecordingWriter | None = None
        self._early_flush: asyncio.Task | None = None

    async def open(self) -> None:
        try:
            self.start, self.size = await asyncio.to_thread(_open_for_append, self.path, title=self.title)
        except OSError:
            logger.exception("Cannot open the console recording %s; output of this session is not recorded", self.path)
            self.failed = True
            return
        self.truncated = self.size >= self.max_bytes
        writers = _writers.setdefault(asyncio.get_running_loop(), {})
        self.writer = writers.setdefault(self.flush_seconds, RecordingWriter(interval=self.flush_seconds))
        self.writer.add(self)

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
            encoded = len(line.encode())
        self.pending.append(line)
        self.pending_bytes += encoded
        if self.pending_bytes >= FLUSH_AT_BYTES and (self._early_flush is None or self._early_flush.done()):
            self._early_flush = asyncio.get_running_loop().create_task(self.flush())

    def output(self, data: bytes) -> None:
        self._event("o", self.decoder.decode(data))

    def marker(self, label: str) -> None:
        self._event("m", label)

    def resize(self, *, cols: int, rows: int) -> None:
        """asciicast v2's resize event: a player redraws what follows at the guest's new size."""
        self._event("r", f"{cols}x{rows}")

    def take_pending(self) -> tuple[str, int]:
        text, size = "".join(self.pending), self.pending_bytes
        self.pending, self.pending_bytes = [], 0
        return text, size

    def written(self, size: int, error: OSError | None) -> None:
        if error is not None:
            logger.error("Cannot write the console recording %s (%s); recording stops", self.path, error)
            self.failed = True
            return
        self.size += size
        if self.skipped_bytes:
            skipped, self.skipped_bytes = self.skipped_bytes, 0
            self._event("m", f"recording skipped {skipped} characters of output (the disk fell behind)")

    async def flush(self) -> None:
        if self.writer is not None:
            await self.writer.write([self])

    async def close(self) -> None:
        if self._early_flush is not None:
            await self._early_flush
            self._early_flush = None
        tail = self.decoder.decode(b"", final=True)
        if tail:
            self._event("o", tail)
        await self.flush()
        if self.writer is not None:
            self.writer.discard(self)
