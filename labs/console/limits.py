"""Console bridge limits, read from settings (sized there for a serial terminal)."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class ConsoleLimits:
    scrollback_bytes: int
    # Output sent to a browser but not yet acknowledged as drawn. Past it the viewer is "lagging": output is
    # skipped (the screen is redrawn from scrollback once the browser catches up) instead of buffered.
    output_window_bytes: int
    lag_close_seconds: float
    input_frame_max_bytes: int
    input_rate_bytes_per_second: int
    input_burst_bytes: int
    lease_ttl_seconds: float
    upstream_retry_seconds: float
    upstream_max_backoff_seconds: float
    upstream_max_message_bytes: int
    recording_max_bytes: int
    recording_flush_seconds: float


def console_limits() -> ConsoleLimits:
    return ConsoleLimits(
        scrollback_bytes=settings.CONSOLE_SCROLLBACK_BYTES,
        output_window_bytes=settings.CONSOLE_OUTPUT_WINDOW_BYTES,
        lag_close_seconds=settings.CONSOLE_LAG_CLOSE_SECONDS,
        input_frame_max_bytes=settings.CONSOLE_INPUT_FRAME_MAX_BYTES,
        input_rate_bytes_per_second=settings.CONSOLE_INPUT_RATE_BYTES_PER_SECOND,
        input_burst_bytes=settings.CONSOLE_INPUT_BURST_BYTES,
        lease_ttl_seconds=settings.CONSOLE_LEASE_TTL_SECONDS,
        # virtctl retries every second while the VMI is not running yet (400).
        upstream_retry_seconds=settings.CONSOLE_UPSTREAM_RETRY_SECONDS,
        upstream_max_backoff_seconds=settings.CONSOLE_UPSTREAM_MAX_BACKOFF_SECONDS,
        upstream_max_message_bytes=settings.CONSOLE_UPSTREAM_MAX_MESSAGE_BYTES,
        recording_max_bytes=settings.CONSOLE_RECORDING_MAX_BYTES,
        # Each flush is a hop to a worker thread; large output is written sooner (recording.FLUSH_AT_BYTES). Half a
        # second keeps a TA's replay, opened while the student types, close to what the student sees.
        recording_flush_seconds=settings.CONSOLE_RECORDING_FLUSH_SECONDS,
    )
