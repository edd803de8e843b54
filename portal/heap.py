"""The garbage collector and a long-lived server process.

Python's full collections walk every object the process holds, and a started portal holds a few hundred thousand
that live as long as it does: modules, the app registry, URL resolvers, compiled templates. A page that allocates a
lot (the gradebook of a large course) set off full collections that doubled its time now and then. Frozen once
startup is done, those objects are left out of every later collection.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Collect what startup left behind, then move everything still alive out of the collector's sight."""
    gc.collect()
    gc.freeze()
