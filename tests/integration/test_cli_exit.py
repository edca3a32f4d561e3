"""How the ``stockade`` process ends: its status, its output and its exit handlers.

``cli.main`` ends the process with ``os._exit`` once the command's exit status is
known and every exit handler has run, skipping Python's teardown of its
modules. These tests drive the real entry point in subprocesses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import Project

#: ``main()`` with a witness of Python's teardown (a module global whose
#: ``__del__`` writes TORN) and an exit handler registered while the command
#: runs (it writes HANDLED). argv: TORN HANDLED MODE stockade-args...; MODE
#: ``crash`` makes the command raise an exception that is not SystemExit.
PROGRAM = """
import atexit, sys
from stockade.cli import main as m
torn, handled, mode = sys.argv[1:4]
del sys.argv[1:4]
if mode == "embedded":  # a program that runs stockade after registering a handler
    atexit.register(lambda: open(handled + ".before", "w").close())

class Witness:
    # Bound now: by the time teardown reaches it, builtins may be gone.
    def __del__(self, _open=open, _torn=torn):
        _open(_torn, "w").close()

m.WITNESS = Witness()
real = m.cli

def cli(*args, **kwargs):
    atexit.register(lambda: open(handled, "w").close())
    if mode == "crash":
        raise RuntimeError("a bug")
    return real(*args, **kwargs)

m.cli = cli
sys.argv[0] = "stockade"
m.main()
"""


def _program(project: Project, tmp_path: Path, mode: str, *args: str,
             ) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    torn, handled = tmp_path / "torn", tmp_path / "handled"
    p = subprocess.run([sys.executable, "-c", PROGRAM, str(torn), str(handled), mode, *args],
                       cwd=project.path, env=project.env, capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    return p, torn, handled


def test_handlers_run_and_the_teardown_is_skipped(project: Project, tmp_path: Path) -> None:
    p, torn, handled = _program(project, tmp_path, "ok", "--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("stockade, version")
    assert handled.exists(), "an exit handler registered by the command did not run"
    assert not torn.exists(), "Python tore its modules down: the process did not end early"


def test_a_usage_error_keeps_its_status_and_message(project: Project, tmp_path: Path) -> None:
    p, torn, handled = _program(project, tmp_path, "ok", "show", "no-such-run")
    assert p.returncode == 2
    assert "no runs under" in p.stderr
    assert handled.exists() and not torn.exists()


def test_control_an_unexpected_exception_ends_as_python_does(project: Project,
                                                             tmp_path: Path) -> None:
    # The witness works: when the command ends by an exception that is not
    # SystemExit, nothing is skipped (the traceback, status 1, the teardown).
    p, torn, handled = _program(project, tmp_path, "crash", "--version")
    assert p.returncode == 1
    assert "RuntimeError: a bug" in p.stderr
    assert handled.exists() and torn.exists()


#: A run whose ``show --json`` of one step is a few hundred KiB.
MANY = """\
    name: many
    steps:
      - id: fan
        for_each: "{{ vars.n | from_json }}"
        keep: "{{ item % 3 == 0 }}"
    vars:
      n: "[]"
    """


def _many(project: Project, run_id: str, items: int = 3000) -> None:
    wf = project.write("wf.yaml", MANY)
    r = project.run("run", str(wf), "--run-id", run_id, "--var",
                    f"n={json.dumps(list(range(items)))}", "--sandbox", "none")
    assert r.code == 0, r.err


def test_output_larger_than_a_pipe_arrives_whole(project: Project) -> None:
    _many(project, "big")
    # Read through a pipe, well over its 64 KiB buffer: all of it, parsed.
    p = subprocess.run(project.cmd("show", "big", "fan", "--all", "--json"),
                       cwd=project.path, env=project.env, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout) > 256 * 1024
    shown = json.loads(p.stdout)
    assert len(shown["items"]) == 3000


def test_a_reader_that_goes_away_is_not_an_error(project: Project) -> None:
    _many(project, "b")
    show = subprocess.Popen(project.cmd("show", "b", "fan", "--all", "--json"),
                            cwd=project.path, env=project.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert show.stdout is not None and show.stderr is not None
    show.stdout.read(100)
    show.stdout.close()  # as `| head -c 100` does
    err = show.stderr.read().decode()
    assert show.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err


GATED = """\
name: gated
steps:
  - id: wait
    for_each: [1, 2, 3]
    run: |
      while [ ! -e {gate} ]; do sleep 0.05; done
      echo item {{{{ item }}}} says no >&2
      exit 1
  - id: other
    run: |
      while [ ! -e {gate} ]; do sleep 0.05; done
      echo kept > out/kept.txt
"""


def test_a_run_whose_reader_goes_away_finishes_and_keeps_its_status(project: Project,
                                                                      tmp_path: Path) -> None:
    """``stockade run wf.yaml | head -2``: the progress reader leaves after two
    lines; the run goes on to its end, records it and exits 1 (an item failed),
    not 0 with the run left as crashed."""
    gate = tmp_path / "gate"
    wf = project.write("wf.yaml", GATED.format(gate=gate))
    run = subprocess.Popen(project.cmd("run", str(wf), "--run-id", "gone", "--sandbox", "none"),
                           cwd=project.path, env=project.env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    assert run.stdout is not None
    first = [run.stdout.readline(), run.stdout.readline()]
    assert first[0].startswith(b"run gone in "), first
    run.stdout.close()
    gate.touch()  # only now do the items fail and print their lines
    assert run.wait(timeout=120) == 1
    shown = json.loads(subprocess.run(project.cmd("show", "gone", "--json"), cwd=project.path,
                                      env=project.env, capture_output=True, check=True).stdout)
    assert shown["run"]["status"] == "failed"
    assert [(s["id"], s["counts"]) for s in shown["steps"]] == [
        ("wait", {"failed": 3}), ("other", {"succeeded": 1})]


def test_a_handler_registered_before_main_still_runs(project: Project, tmp_path: Path) -> None:
    # coverage, or a benchmark's wrapper: stockade is not the whole program,
    # so it ends the usual way and the program's own handler runs.
    p, torn, handled = _program(project, tmp_path, "embedded", "--version")
    assert p.returncode == 0, p.stderr
    assert Path(f"{handled}.before").exists()
    assert handled.exists() and torn.exists()
