"""Naming one item (``show RUN STEP/KEY``, ``logs``, ``why``) reads that item's
record, not the run's: on a 100,000-item run, reading every record took
seconds per command. The store is the real SQLite store; the test records
which whole steps the commands read, and checks what they print."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from stockade.cli.main import cli
from stockade.store.sqlite import SQLiteStore

WORKFLOW = """\
name: lookup
steps:
  - id: gather
    run: echo '[30, 10, 40, 15, 50, 90, 20, 60, 55, 35, 52, 80, 95, 70, 99]' > out/items.json
  - id: fan
    needs: [gather]
    for_each: "{{ steps.gather.outputs['items.json'] | from_json }}"
    inputs: {n.txt: "{{ item }}"}
    run: cat n.txt; echo "err {{ item }}" >&2
  - id: quiet
    run: echo only on stderr >&2
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("lookup")
    wf = base / "wf.yaml"
    wf.write_text(WORKFLOW)
    mp = pytest.MonkeyPatch()
    mp.setenv("STOCKADE_HOME", str(base / "home"))
    result = CliRunner().invoke(cli, ["run", str(wf), "--run-id", "lk1", "--sandbox", "none"])
    assert result.exit_code == 0, result.output
    yield base / "home"
    mp.undo()


@pytest.fixture()
def reads(home: Path, monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The steps ``SQLiteStore.items`` is asked for whole (None: the whole run)."""
    monkeypatch.setenv("STOCKADE_HOME", str(home))
    asked: list[str | None] = []
    real = SQLiteStore.items

    def items(self: SQLiteStore, run_id: str, step: str | None = None) -> list:  # type: ignore[type-arg]
        asked.append(step)
        return real(self, run_id, step)

    monkeypatch.setattr(SQLiteStore, "items", items)
    return asked


def cli_run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.output


@pytest.mark.parametrize(("args", "expect"), [
    (["show", "lk1", "fan/#4"], "fan/50  (item #4 of run lk1"),
    (["show", "lk1", "fan/90"], "fan/90  (item #5 of run lk1"),
    (["show", "lk1", "gather"], "gather/0  (item #0 of run lk1"),
    (["logs", "lk1", "fan/#2"], "40"),  # n.txt has no newline
    (["logs", "lk1", "fan/#2", "--stderr"], "err 40\n"),
    (["why", "lk1", "fan/#2"], "fan/40 attempt 1 (run lk1"),
])
def test_one_item_is_read_alone(reads: list[str | None], args: list[str], expect: str) -> None:
    code, out = cli_run(*args)
    assert code == 0, out
    assert out == expect if args[0] == "logs" else expect in out
    assert reads == [], f"read whole steps {reads} to answer {args}"


@pytest.mark.parametrize(("args", "said"), [
    (["logs", "lk1", "quiet"],
     "quiet/0 wrote nothing to stdout; its stderr has 1 line: stockade logs lk1 quiet/0 --stderr"),
    (["logs", "lk1", "quiet", "--attempt", "1"],
     "quiet/0 wrote nothing to stdout; its stderr has 1 line: stockade logs lk1 quiet/0 --stderr "
     "--attempt 1"),
    (["logs", "lk1", "gather"], "gather/0 wrote nothing to stdout"),
    (["logs", "lk1", "gather", "--stderr"], "gather/0 wrote nothing to stderr"),
])
def test_an_empty_log_says_so_on_stderr(reads: list[str | None], args: list[str],
                                        said: str) -> None:
    # stdout stays empty (a pipe gets what the item wrote: nothing).
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert (r.stdout, r.stderr) == ("", said + "\n")


def test_a_number_that_is_no_key_is_a_position(reads: list[str | None]) -> None:
    # No item has the key 3: it names the item at position 3 (key 15).
    code, out = cli_run("show", "lk1", "fan/3", "--json")
    assert code == 0, out
    item = json.loads(out)["item"]
    assert (item["item"], item["key"], item["value"]) == (3, "15", 15)
    assert reads == []


def test_a_steps_listing_reads_that_step_only(reads: list[str | None]) -> None:
    code, out = cli_run("show", "lk1", "fan", "--json")
    assert code == 0, out
    assert [i["item"] for i in json.loads(out)["items"]] == list(range(15))
    assert reads == ["fan"]
    # The listing turns the cyclic collector off while it reads, and back on.
    assert gc.isenabled()


@pytest.mark.parametrize(("args", "message"), [
    (["show", "lk1", "fan"], None),  # a listing, not an error
    (["show", "lk1", "fan/#99"],
     "run lk1 has no item 'fan/#99' (keys of fan: 30, 10, 40, 15, 50, 90, 20, 60, 55, 35, ...)"),
    (["logs", "lk1", "fan"],
     "step 'fan' has 15 items; name one as fan/KEY or fan/#N (keys: 30, 10, 40, 15, 50, 90, "
     "20, 60, 55, 35, ...)"),
    (["why", "lk1", "nope/1"], "run lk1 has no step 'nope' with items (steps: gather, fan, quiet)"),
])
def test_what_is_not_there_is_named_with_what_is(reads: list[str | None], args: list[str],
                                                  message: str | None) -> None:
    code, out = cli_run(*args)
    if message is None:
        assert code == 0 and "15 succeeded" in out, out
        return
    assert code == 2, out
    assert message in out
    assert "Traceback" not in out
    assert None not in reads and "fan" not in reads


def _run_until_begun(tmp_path: Path, workflow: str, run_id: str,
                     item: str) -> subprocess.Popen[bytes]:
    """``stockade run`` of ``workflow`` (``--sandbox none``) in the background,
    returned once the item folder ``item`` (``step/index``) wrote its first
    byte of stdout."""
    wf = tmp_path / "wf.yaml"
    wf.write_text(workflow)
    env = {**os.environ, "STOCKADE_HOME": str(tmp_path / "home")}
    run = subprocess.Popen([sys.executable, "-m", "stockade.cli.main", "run", str(wf),
                            "--run-id", run_id, "--sandbox", "none"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    capture = tmp_path / "home" / "runs" / run_id / item / "meta" / "1.out"
    deadline = time.monotonic() + 120
    while not (capture.exists() and capture.read_bytes()):
        if run.poll() is not None or time.monotonic() > deadline:
            run.kill()
            raise AssertionError(f"{item} of run {run_id} never began")
        time.sleep(0.05)
    return run


def test_a_running_item_can_be_followed(tmp_path: Path) -> None:
    """``show``, ``logs`` and ``why`` of an item that began and has no record
    yet: it is named by its key as the run's item_keys event gives it, shown
    as running, and its output so far is read from its capture."""
    gate = tmp_path / "gate"
    run = _run_until_begun(tmp_path, f"""name: live
steps:
  - id: slow
    for_each: [first, second]
    run: |
      echo before the gate
      while [ ! -e {gate} ]; do sleep 0.05; done
      echo after the gate
""", "live1", "slow/1")
    try:
        runner = CliRunner(env={"STOCKADE_HOME": str(tmp_path / "home")})
        shown = runner.invoke(cli, ["logs", "live1", "slow/second"])
        assert (shown.exit_code, shown.stdout) == (0, "before the gate\n")
        shown = runner.invoke(cli, ["show", "live1", "slow/second"])
        assert shown.exit_code == 0
        assert shown.stdout.splitlines() == [
            "slow/second  (item #1 of run live1, step kind run)",
            "  status running",
            "  attempt 1: running",
            "  logs: stockade logs live1 slow/second [--stderr] [--attempt N]",
        ]
        # Both wait at the gate: the run's listing counts them, not "not started".
        listing = runner.invoke(cli, ["show", "live1"]).stdout.splitlines()
        assert listing[2] == "slow (run): 2 of 2 not finished", listing
        whole = runner.invoke(cli, ["logs", "live1", "slow"])
        assert (whole.exit_code, whole.stderr) == (
            2, "step 'slow' has 2 items; name one as slow/KEY or slow/#N (keys: first, "
               "second)\n")
        why = runner.invoke(cli, ["why", "live1", "slow/#1"])
        assert (why.exit_code, why.stderr) == (
            2, "slow/second is running (attempt 1): its outputs and provenance are recorded "
               "when an attempt ends\n")
    finally:
        gate.touch()
        assert run.wait(timeout=120) == 0
    shown = CliRunner(env={"STOCKADE_HOME": str(tmp_path / "home")}).invoke(
        cli, ["logs", "live1", "slow/second"])
    assert shown.stdout == "before the gate\nafter the gate\n"


def test_an_item_a_dead_engine_left_reads_as_lost(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    run = _run_until_begun(tmp_path, f"""name: dies
steps:
  - id: slow
    run: |
      echo before the end
      while [ ! -e {gate} ]; do sleep 0.05; done
""", "dead1", "slow/0")
    try:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=60)
    finally:
        gate.touch()
        if run.poll() is None:
            run.kill()
    runner = CliRunner(env={"STOCKADE_HOME": str(tmp_path / "home")})
    shown = runner.invoke(cli, ["show", "dead1", "slow/0"])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[1:3] == [
        "  status lost  the engine stopped during this attempt",
        "  attempt 1: lost  the engine stopped during this attempt",
    ]
    assert "slow (run): 1 of 1 not finished" in runner.invoke(cli, ["show", "dead1"]).stdout
    logs = runner.invoke(cli, ["logs", "dead1", "slow"])
    assert (logs.exit_code, logs.stdout) == (0, "before the end\n")
