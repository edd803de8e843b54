"""The garbage collector in a long-lived server: objects alive once startup is done are frozen out of later full
collections, and young objects are collected less often, since a request's allocations are freed by reference
counting when it ends (side-by-side figures: bench/RESULTS.md)."""

from __future__ import annotations

import gc

# (young, middle, old): a young collection every 10,000 allocations net, a middle one every 20 young ones, an old one
# every 20 middle ones (and then only once the objects waiting for it are a quarter of those it holds).
SERVER_GC_THRESHOLDS = (10_000, 20, 20)


def freeze_startup_objects() -> None:
    """Collect what startup left behind, hide what is still alive from the collector, set the serving thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVER_GC_THRESHOLDS)
