"""Checks' output patterns, matched by the ``regex`` engine under ``GRADING_PATTERN_TIMEOUT_MS`` on bounded input, so
an instructor's catastrophic backtracking cannot hold a process (``PatternTimeout`` fails the check in plain
words); ``pattern_problem`` vets a pattern on save."""

from __future__ import annotations

import functools

import regex
from django.conf import settings
from django.utils.translation import gettext as _

# The guest agent caps each output stream at 64 KiB; an output past that did not come from an honest agent.
MATCH_INPUT_MAX_CHARS = 64 * 1024
# Vetting on save: probe inputs of this length, each given this long. Exponential backtracking shows well
# before 64 characters, while a sound pattern answers in microseconds.
PROBE_LENGTH = 64
PROBE_TIMEOUT_SECONDS = 0.1


class PatternTimeout(Exception):
    """A match ran out of time; the pattern backtracks too much on this output."""


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> regex.Pattern:
    return regex.compile(pattern, regex.MULTILINE | regex.VERSION0)  # VERSION0: the syntax and meaning of ``re``


def pattern_timeout_seconds() -> float:
    return settings.GRADING_PATTERN_TIMEOUT_MS / 1000


def search(pattern: str, text: str, *, timeout: float | None = None) -> bool:
    """``re.search`` with ``MULTILINE``; ``PatternTimeout`` past ``timeout`` seconds (default the setting)."""
    limit = pattern_timeout_seconds() if timeout is None else timeout
    try:
        return compile_pattern(pattern).search(text[:MATCH_INPUT_MAX_CHARS], timeout=limit) is not None
    except TimeoutError as exc:
        raise PatternTimeout(pattern) from exc


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a check's output pattern, in words for the instructor; ``None`` when it can."""
    try:
        compile_pattern(pattern)
    except regex.error as exc:
        return _("Not a valid regular expression: %s") % exc
    # Repetitive texts of (up to 24 of) the pattern's own characters and common ones, each ending in one that fails.
    own = dict.fromkeys(ch for ch in pattern if ch.isprintable() and ch not in "()[]{}|*+?^$\\")
    characters = dict.fromkeys([*list(own)[:24], *"a1 \tx.-_/:=\n"])
    probes = [ch * PROBE_LENGTH + ending for ch in characters for ending in ("", "!", "\x00", "\n!")]
    for probe in [*probes, "ab" * PROBE_LENGTH + "!"]:
        try:
            search(pattern, probe, timeout=PROBE_TIMEOUT_SECONDS)
        except PatternTimeout:
            return _(
                "This regular expression backtracks too much: matching it against %(length)d repeated characters "
                "took longer than %(seconds)s s, so grading would give up on it. Avoid nested or overlapping "
                "repeats such as (a+)+ or (a|a)*."
            ) % {"length": PROBE_LENGTH, "seconds": PROBE_TIMEOUT_SECONDS}
    return None
