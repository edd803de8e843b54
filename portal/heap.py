"""The garbage collector and a long-lived server process.

Python's full collections walk every object the process holds, and a started portal holds a few hundred thousand
that live as long as it does: modules, the app registry, URL resolvers, compiled templates. A page that allocates a
lot (the gradebook of a large course) set off full collections that doubled its time now and then. Frozen once
startup is done, those objects are left out of every later collection.

Serving processes also collect their young objects less often than Python's default (every 700 allocations net):
a request, a socket's message or a task allocates thousands of objects that are freed by reference counting when
it ends, and collecting in the middle of it only walks them and moves the ones still in use to an older generation,
which the next full collection then walks as well. Measured side by side in a burst of 100 lab starts (README,
"Benchmarks"): daphne spent 4.5–6.3 % of its CPU collecting with the default thresholds, 2.0–2.9 % with these.
"""

from __future__ import annotations

import gc

# (young, middle, old): a young collection every 10,000 allocations net, a middle one every 20 young ones, an old one
# every 20 middle ones (and then only once the objects waiting for it are a quarter of those it holds).
SERVER_GC_THRESHOLDS = (10_000, 20, 20)


def freeze_startup_objects() -> None:
    """Collect what startup left behind, then move everything still alive out of the collector's sight, and set the
    serving thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVER_GC_THRESHOLDS)
