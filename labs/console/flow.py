"""Per-viewer flow control: an output window acknowledged by the browser, and an input token bucket."""

from __future__ import annotations

import time


class InputRateLimiter:
    """A token bucket over bytes: bursts (a paste) up to ``burst``, sustained ``rate`` bytes per second."""

    def __init__(self, *, rate: int, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.updated = time.monotonic()

    def allow(self, size: int) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if size > self.tokens:
            return False
        self.tokens -= size
        return True


class OutputWindow:
    """Bytes sent to one browser minus the bytes it has drawn; past ``window`` the viewer lags: output is skipped
    rather than queued here, and the caught-up browser gets a fresh screen from scrollback."""

    def __init__(self, *, window: int) -> None:
        self.window = window
        self.sent = 0
        self.acked = 0
        self.lagging_since: float | None = None

    @property
    def in_flight(self) -> int:
        return self.sent - self.acked

    def may_send(self, size: int) -> bool:
        if self.lagging_since is None and self.in_flight + size > self.window:
            self.lagging_since = time.monotonic()
        return self.lagging_since is None

    def record_sent(self, size: int) -> None:
        self.sent += size

    def acknowledge(self, total: int) -> bool:
        """Record the browser's running total; True when a lagging viewer has caught up and needs a redraw."""
        # Never beyond what was sent: a browser cannot have drawn bytes it was not given.
        self.acked = max(self.acked, min(total, self.sent))
        if self.lagging_since is not None and self.in_flight <= self.window // 4:
            self.lagging_since = None
            return True
        return False

    def lagging_for(self) -> float:
        return 0.0 if self.lagging_since is None else time.monotonic() - self.lagging_since
