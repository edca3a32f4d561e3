"""A writer process for the chaos test: take the lease, write a few keys under its
token, release, repeat, until the deadline. Prints its counts as one JSON line.

Run as ``python chaos_writer.py STORE_URL SINK HOLDER SECONDS TTL [--unfenced]`` where
SINK is ``sqlite:PATH`` or ``postgresql://...``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from stockade.publish.sink import Write
from stockade.publish.sql import PostgresSink, SQLiteSink
from stockade.store import open_store

KEYS = ("k0", "k1", "k2", "k3")


def main() -> None:
    store_url, sink_url, holder, seconds, ttl = sys.argv[1:6]
    fenced = "--unfenced" not in sys.argv
    store = open_store(store_url, Path("."))
    if sink_url.startswith("sqlite:"):
        sink: SQLiteSink | PostgresSink = SQLiteSink(Path(sink_url[7:]), "chaos", fenced=fenced)
    else:
        sink = PostgresSink(sink_url, "chaos", fenced=fenced)
    counts = {"applied": 0, "already": 0, "fenced": 0, "failed": 0, "rounds": 0}
    deadline = time.monotonic() + float(seconds)
    n = 0
    while time.monotonic() < deadline:
        lease = store.acquire_lease("chaos", holder, float(ttl))
        if lease is None:
            time.sleep(0.005)
            continue
        counts["rounds"] += 1
        for key in KEYS:
            n += 1
            r = sink.write(Write(f"{holder}/{n}", key, {"by": holder, "n": n}, holder,
                                 lease.token, "chaos"))
            counts[r.status] += 1
            time.sleep(0.02)
        store.release_lease("chaos", holder)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
