"""What a network namespace of its own costs a landlock ``network: proxy`` item.

    python bench/bench_netns.py [--items 200] [--rounds 5] [--launcher native|python]

Root only. ``Backend.start`` + ``wait`` of ``/bin/true`` with ``network:
proxy`` (the egress proxy started once), one item at a time, on the
landlock backend with its own network namespace per item and without it
(``LandlockBackend.private_network = False``: the relay on the host's
loopback), the two interleaved round by round. Prints the median wall-clock
ms per item of each and the difference, and the median of ``_netns.create``
alone. On a shared, busy host the spread between rounds is of the same order
as small differences.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from stockade.sandbox import EgressProxy, Policy, _netns  # noqa: E402
from stockade.sandbox.landlock import LandlockBackend  # noqa: E402


def _round(backend: LandlockBackend, egress: EgressProxy, base: Path, items: int) -> float:
    """Median ms per item."""
    times = []
    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    for i in range(items):
        work, scratch = base / f"w{i}", base / f"s{i}"
        work.mkdir()
        policy = Policy(
            argv=("/bin/true",), work_dir=work, scratch_dir=scratch,
            env={"PATH": "/usr/bin:/bin"}, network="proxy",
            proxy_socket=egress.socket_path, proxy_token=egress.token,
        )  # fmt: skip
        t0 = time.perf_counter()
        running = backend.start(policy, stdout=devnull, stderr=devnull)
        status = running.wait(60)
        times.append(time.perf_counter() - t0)
        assert status == 0, status
    os.close(devnull)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--launcher", choices=("native", "python"), default="native")
    args = ap.parse_args()
    if os.geteuid() != 0 or _netns.unavailable():
        sys.exit(f"needs a root engine that can make network namespaces: {_netns.unavailable()}")
    backend = LandlockBackend(launcher=args.launcher)
    results: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="stockade-bench-netns-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        with EgressProxy([], base / "network.jsonl", base) as egress:
            for r in range(args.rounds):
                for own in (True, False) if r % 2 == 0 else (False, True):
                    backend.private_network = own
                    d = base / f"r{r}-{own}"
                    d.mkdir()
                    results[own].append(_round(backend, egress, d, args.items))
    backend.close()
    create = []
    for _ in range(args.items):
        t0 = time.perf_counter()
        net = _netns.create()
        create.append(time.perf_counter() - t0)
        net.listener.close()
        net.close()
    own, host = statistics.median(results[True]), statistics.median(results[False])
    print(f"landlock ({args.launcher}), network: proxy, {args.items} items x {args.rounds} rounds")
    print(f"  own namespace: {own:.2f} ms/item (rounds {_fmt(results[True])})")
    print(f"  host stack:    {host:.2f} ms/item (rounds {_fmt(results[False])})")
    print(f"  difference:    {own - host:+.2f} ms/item")
    print(f"  _netns.create alone: median {statistics.median(create) * 1000:.2f} ms")


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
