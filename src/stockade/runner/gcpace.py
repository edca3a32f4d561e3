"""The cyclic garbage collector's pace while a run executes.

Every item keeps its result, so the count of tracked objects only grows and
Python's default first threshold (700) runs the collector over and over for
nothing: it only finds cycles, and everything else is freed by reference
counting. Must not import the rest of the package.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: The collector's first threshold while a run executes. In a keep: over
#: 100,000 numbers the collector ran 1,126 times at 700 (8 of them full,
#: over everything the run holds), 1.3 s of the step, and 46 times at
#: 10,000, 0.34-0.39 s. That keep: went at a median 13,000 items/s at 700
#: and 16,700/s at 10,000 (5 alternating runs each; peak RSS 125 MB either
#: way).
GC_THRESHOLD = 10_000


@contextmanager
def collector_paced(threshold: int = GC_THRESHOLD) -> Iterator[None]:
    """Raise the collector's first threshold to ``threshold`` (never lower it)
    for the block; the previous thresholds come back after it."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], threshold), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
