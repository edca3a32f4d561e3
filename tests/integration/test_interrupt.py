"""Ctrl-C at any moment: exit 130, every jail process gone, the run interrupted and resumable.

The signal goes to the engine's whole process group, as a terminal's Ctrl-C
does, at moments spread over the run's start: before the store record exists,
while the first items' folders appear, while the jails run. Each jail runs
``sleep`` with an argument composed at test time, so a leftover process is
found by that marker and by nothing else.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Project

#: The spec says 10 s; this bound leaves room for a loaded 2-core machine. The
#: measured figure is reported by bench/bench_interrupt.py.
EXIT_BOUND = 30.0


def _jail_processes(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in raw:
            found.append(int(pid))
    return found


def _wait(cond: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def before_the_handler(err: str) -> bool:
    """``err`` is Python's own ``KeyboardInterrupt`` traceback from before
    stockade's handler existed: through the interpreter's frozen import
    machinery and the two files that install the handler, nothing else (an
    ``import signal`` there would show ``signal.py``, as a CI run once did)."""
    files = re.findall(r'^  File "([^"]+)"', err, re.MULTILINE)
    return err.rstrip().endswith("KeyboardInterrupt") and bool(files) and all(
        f.startswith("<frozen ") or f.endswith(("/stockade/__init__.py", "/stockade/_pending.py"))
        for f in files)


def _workflow(project: Project, marker: str) -> Path:
    return project.write("wf.yaml", f"""
        name: ctrlc
        secrets: [SLOW]
        steps:
          - id: sleepers
            for_each: [1, 2, 3, 4, 5, 6, 7, 8]
            secrets: [SLOW]
            run: |
              if [ -n "$SLOW" ]; then sh -c 'sleep {marker}'; fi
              echo done > out/done.txt
    """)


def _interrupt(project: Project, wf: Path, run_id: str, *, delay: float | None,
               sig: signal.Signals = signal.SIGINT) -> tuple[int, float, str]:
    p = project.popen("run", str(wf), "--run-id", run_id, "--jobs", "4", env={"SLOW": "yes"})
    if delay is None:
        # The moment the first item's work/ appears.
        first = project.item(run_id, "sleepers", 0) / "work"
        _wait(first.exists, 60)
    else:
        time.sleep(delay)
    sent = time.monotonic()
    os.killpg(p.pid, sig)
    try:
        _, err = p.communicate(timeout=EXIT_BOUND + 30)
    except Exception:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    return p.returncode, time.monotonic() - sent, err


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.4, None, 0.8, 1.5])
def test_ctrl_c_at_any_moment(project: Project, delay: float | None) -> None:
    marker = f"300.{secrets.randbelow(10**8):08d}"
    wf = _workflow(project, marker)
    code, took, err = _interrupt(project, wf, "c1", delay=delay)
    starting = ("init_import_site", "init_sys_streams", "Could not import runpy")
    if code == 1 and any(s in err for s in starting):
        # The signal landed while CPython itself was starting (before any of
        # stockade's code): Python ends with a fatal error and nothing exists.
        assert not (project.root / "runs").exists()
        return
    if code == -signal.SIGINT and before_the_handler(err):
        # It landed while the package's first lines installed the handler.
        assert not (project.root / "runs").exists()
        return
    # 130 from the engine; -2 if the signal beat the interpreter's own handler.
    assert code in (130, -signal.SIGINT), (code, err)
    assert "Traceback" not in err
    assert took < EXIT_BOUND, f"exit took {took:.1f}s"
    assert _wait(lambda: not _jail_processes(marker), 5), \
        f"jail processes outlived the engine: {_jail_processes(marker)}"
    runs = project.run("runs", "--json")
    if runs.code == 0 and runs.json():
        assert runs.json()[0]["status"] == "interrupted", runs.json()[0]


def test_an_interrupted_run_resumes_to_success(project: Project) -> None:
    marker = f"300.{secrets.randbelow(10**8):08d}"
    wf = _workflow(project, marker)
    code, _, err = _interrupt(project, wf, "c2", delay=None)
    assert code == 130
    assert project.run("runs", "--json").json()[0]["status"] == "interrupted"
    # Each item the Ctrl-C stopped says so once, without the status again.
    stopped = [ln for ln in err.splitlines() if "sleepers/" in ln]
    assert stopped and all(ln.endswith(": interrupted (attempt 1)") for ln in stopped), err
    # No folder made ahead is left (runner.prefetch makes them only where the
    # step folder refuses the spread flag: tests/integration/test_prefetch_cli.py
    # interrupts such a run on tmpfs). Only attempts that began left a work/.
    run_dir = project.root / "runs" / "c2"
    assert not list(run_dir.rglob(".next*"))
    begun = [i for i in range(8) if (project.item("c2", "sleepers", i) / "work").exists()]
    # --jobs 4: the others were waiting for a slot.
    assert 0 in begun and set(begun) <= {0, 1, 2, 3}, begun
    r = project.run("resume", "c2", env={"SLOW": ""}, timeout=120)
    assert r.code == 0, r.err
    items = project.run("show", "c2", "sleepers", "--json").json()["items"]
    assert [i["status"] for i in items] == ["succeeded"] * 8


DROPPED = """\
import sys
from stockade import _pending
import stockade.cli.main as m
import stockade.runner.session as session

# As when Python drops a Ctrl-C's exception inside an import's clean-up
# ("Exception ignored in ..."): counted by the handler, never raised. Where:
# while the command line dispatches, or while the run loads its workflow.
where = sys.argv.pop(1)
real_cli, real_load = m.cli, session.load_spec


def cli(*args, **kwargs):
    if where == "dispatch":
        _pending.record()
    return real_cli(*args, **kwargs)


def load_spec(*args, **kwargs):
    if where == "load":
        _pending.record()
    return real_load(*args, **kwargs)


m.cli, session.load_spec = cli, load_spec
m.main()
"""


@pytest.mark.parametrize("where", ["dispatch", "load", "nowhere"])
def test_a_ctrl_c_python_dropped_still_interrupts_the_run(project: Project, where: str) -> None:
    marker = f"300.{secrets.randbelow(10**8):08d}"
    wf = _workflow(project, marker)
    p = subprocess.run(
        [sys.executable, "-c", DROPPED, where, "run", str(wf), "--run-id", "d1", "--jobs", "4"],
        cwd=project.path, env={**project.env, "SLOW": "" if where == "nowhere" else "yes"},
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if where == "dispatch":
        # Before the command began: exit 130, nothing made.
        assert p.returncode == 130, p.stderr
        assert not (project.root / "runs").exists() and "Traceback" not in p.stderr
        return
    runs = project.run("runs", "--json").json()
    if where == "load":
        # The run started and was interrupted at once: resumable, no jail left.
        assert p.returncode == 130, p.stderr
        assert runs[0]["status"] == "interrupted" and "Traceback" not in p.stderr
        assert _wait(lambda: not _jail_processes(marker), 5), _jail_processes(marker)
    else:  # positive control: without a dropped Ctrl-C it runs to the end
        assert p.returncode == 0, p.stderr
        assert runs[0]["status"] == "succeeded"


def test_a_terminal_hang_up_ends_the_run_as_interrupted(project: Project) -> None:
    """SIGHUP (the terminal or SSH session went away) to the run's process
    group: the run stops its jails and ends recorded as interrupted, exit 130,
    resumable, as for Ctrl-C; not killed mid-write and left as crashed."""
    marker = f"300.{secrets.randbelow(10**8):08d}"
    wf = _workflow(project, marker)
    code, _, err = _interrupt(project, wf, "hup1", delay=None, sig=signal.SIGHUP)
    assert code == 130, err
    assert _wait(lambda: not _jail_processes(marker), EXIT_BOUND)
    assert project.run("runs", "--json").json()[0]["status"] == "interrupted"
    assert project.run("resume", "hup1", env={"SLOW": ""}, timeout=120).code == 0


def test_under_nohup_a_hang_up_changes_nothing(project: Project, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    wf = project.write("wf.yaml", f"""
        name: nohup
        steps:
          - id: waits
            for_each: [1, 2, 3]
            run: |
              while [ ! -e {gate} ]; do sleep 0.05; done
              echo done > out/done.txt
    """)
    p = subprocess.Popen(["nohup", *project.cmd("run", str(wf), "--run-id", "hup2",
                                                "--sandbox", "none")],
                         cwd=project.path, env=project.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        assert _wait((project.item("hup2", "waits", 0) / "work").exists, 60)
        os.killpg(p.pid, signal.SIGHUP)
        gate.touch()
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, err
    assert project.run("runs", "--json").json()[0]["status"] == "succeeded"
