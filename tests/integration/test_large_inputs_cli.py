"""Large inputs through the real CLI: a 400 MB artifact fanned out to 4 items
with the engine's memory flat, shared without a copy where the backend can,
and what happens when a step hands a shared input on with ``mv``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.integration.conftest import Project

SIZE = 400 * 1000 * 1000
#: Generous: the engine's own baseline is about 50 MB; before streaming, a
#: 400 MB input alone took more than that many MB per copy.
RSS_LIMIT = 150 << 20


def peak_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def disk_use(path: Path) -> int:
    """Allocated bytes below ``path``, each inode once (a hard link is no copy)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def test_a_400_mb_input_fanned_out_to_4_items_keeps_the_engine_small(project: Project) -> None:
    wf = project.write("wf.yaml", f"""
        name: big
        steps:
          - id: make
            run: head -c {SIZE} /dev/zero > out/big.bin
          - id: fan
            needs: [make]
            for_each: [a, b, c, d]
            inputs:
              big.bin: "{{{{ steps.make.outputs['big.bin'] }}}}"
            run: wc -c < big.bin
    """)
    proc = project.popen("run", str(wf), "--run-id", "b1")
    peak = 0
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        peak = max(peak, peak_rss(proc.pid))
        time.sleep(0.05)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert 0 < peak < RSS_LIMIT, f"engine peak RSS {peak >> 20} MiB"
    for key in "abcd":
        assert project.run("logs", "b1", f"fan/{key}").out.strip() == str(SIZE)
    shown = project.run("show", "b1", "fan/a", "--json").json()
    source = shown["provenance"]["inputs"][0]["source"]
    runs = project.root / "runs" / "b1"
    if source.get("shared") in ("bind", "hardlink", "reflink"):
        # One copy of the data on disk, however many items read it.
        assert disk_use(runs) < 1.5 * SIZE, disk_use(runs)
    else:
        # A streamed copy per item (an unprivileged engine under landlock on
        # a filesystem without reflinks): still constant memory.
        assert disk_use(runs) > 4 * SIZE


def test_a_step_that_moves_a_shared_input_to_out(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: mv
        steps:
          - id: make
            run: head -c 3000000 /dev/urandom > out/big.bin
          - id: pass
            needs: [make]
            inputs: {big.bin: "{{ steps.make.outputs['big.bin'] }}"}
            run: mv big.bin out/big.bin
    """)
    r = project.run("run", str(wf), "--run-id", "m1")
    shown = project.run("show", "m1", "pass", "--json").json()
    how = shown["provenance"]["inputs"][0]["source"].get("shared", "copy")
    made = project.item("m1", "make") / "work/out/big.bin"
    if how == "bind":
        # A read-only bind cannot be renamed: the step fails, saying why and what to do.
        assert r.code == 1
        assert "are shared read-only, without a copy: a step cannot move, rename or remove " \
               "them; copy one with cp" in r.err
    else:
        # A hard link (engine-owned, read-only), a reflink or a copy: handed on as an output.
        assert r.code == 0, r.err
        out = project.item("m1", "pass") / "work/out/big.bin"
        assert out.read_bytes() == made.read_bytes()
        made_record = project.run("show", "m1", "make", "--json").json()["provenance"]
        assert shown["provenance"]["outputs"][0]["sha256"] == made_record["outputs"][0]["sha256"]
