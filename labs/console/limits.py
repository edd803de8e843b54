"""Console bridge limits, read from settings with defaults sized for a serial terminal."""

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
        output_window_bytes=getattr(settings, "CONSOLE_OUTPUT_WINDOW_BYTES", 1024 * 1024),
        lag_close_seconds=getattr(settings, "CONSOLE_LAG_CLOSE_SECONDS", 60.0),
        input_frame_max_bytes=getattr(settings, "CONSOLE_INPUT_FRAME_MAX_BYTES", 16 * 1024),
        input_rate_bytes_per_second=getattr(settings, "CONSOLE_INPUT_RATE_BYTES_PER_SECOND", 32 * 1024),
        input_burst_bytes=getattr(settings, "CONSOLE_INPUT_BURST_BYTES", 64 * 1024),
        lease_ttl_seconds=getattr(settings, "CONSOLE_LEASE_TTL_SECONDS", 6.0),
        # virtctl retries every second while the VMI is not running yet (400).
        upstream_retry_seconds=getattr(settings, "CONSOLE_UPSTREAM_RETRY_SECONDS", 1.0),
        upstream_max_backoff_seconds=getattr(settings, "CONSOLE_UPSTREAM_MAX_BACKOFF_SECONDS", 5.0),
        upstream_max_message_bytes=getattr(settings, "CONSOLE_UPSTREAM_MAX_MESSAGE_BYTES", 1024 * 1024),
        recording_max_bytes=getattr(settings, "CONSOLE_RECORDING_MAX_BYTES", 32 * 1024 * 1024),
        # Each flush is a hop to a worker thread; large output is written sooner (recording.FLUSH_AT_BYTES). Half a
        # second keeps a TA's replay, opened while the student types, close to what the student sees.
        recording_flush_seconds=getattr(settings, "CONSOLE_RECORDING_FLUSH_SECONDS", 0.5),
    )
