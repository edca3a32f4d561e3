"""Tables for the pure parts of everyday operation: sizes, keys, limits, ids, CPUs, ages."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stockade.errors import InfraError, UserError
from stockade.runner.attempt import Outcome, after_interrupt
from stockade.runner.cpus import available_cpus, cgroup_quota
from stockade.runner.env import Masker
from stockade.runner.keys import check_key, item_keys, key_problem
from stockade.runner.kinds import process
from stockade.runner.kinds.process import limit_message, missing_outputs, refused_hint
from stockade.runner.runs import parse_age, parse_item
from stockade.runner.status import AttemptStatus
from stockade.runner.views import ItemView
from stockade.spec.model import Step
from stockade.spec.sizes import format_size, parse_size
from stockade.workspace.artifacts import Output


@pytest.mark.parametrize(("text", "expected"), [
    (512, 512), ("512", 512), ("1K", 1024), ("64M", 64 << 20), ("2G", 2 << 30),
    ("1.5G", int(1.5 * (1 << 30))), ("64MiB", 64 << 20), ("10kb", 10 << 10), (" 3 M ", 3 << 20),
    (None, None),
])
def test_sizes(text: int | str | None, expected: int | None) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["512 megs", "lots", "-1", "0", "1X", "", "M", True, 1 << 63])
def test_bad_sizes_say_what_to_write(bad: object) -> None:
    with pytest.raises(ValueError, match=r"size|large"):
        parse_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "shown"), [
    ("1M", "1M"), (1 << 20, "1M"), (1536, "1536 bytes"), (2 << 30, "2G"), (3 << 10, "3K"),
])
def test_sizes_are_shown_as_written_or_in_exact_units(value: int | str, shown: str) -> None:
    assert format_size(value) == shown


def _view(key: str) -> ItemView:
    return ItemView(index=0, key=key, value=None, result=None, outputs={})


@pytest.mark.parametrize(("values", "explicit", "keys"), [
    (["a", "b", "c"], None, ["a", "b", "c"]),
    ([3, 1, 2], None, ["3", "1", "2"]),
    (["a", "a"], None, ["0", "1"]),                          # not unique: indexes
    (["a b", "c"], None, ["0", "1"]),                        # not path-safe: indexes
    ([{"x": 1}, {"x": 2}], None, ["0", "1"]),                # mappings: indexes
    (["x" * 65], None, ["0"]),                               # too long
    ([True, False], None, ["0", "1"]),                       # booleans are not keys
    (["#1"], None, ["0"]),                                   # '#' is how positions are named
    ([_view("S1"), _view("S3")], None, ["S1", "S3"]),        # upstream items keep their keys
    ([_view("S1"), _view("S1")], None, ["0", "1"]),
    (["a", "b"], ["k1", "k2"], ["k1", "k2"]),                # key: wins
    ([], None, []),
])
def test_item_keys(values: list[object], explicit: list[str] | None, keys: list[str]) -> None:
    assert item_keys(values, explicit) == keys


@pytest.mark.parametrize("bad", ["", "a/b", "#3", "x\n", ".", "..", "k" * 201, True, None, 1.5])
def test_bad_keys(bad: object) -> None:
    with pytest.raises(UserError):
        check_key(bad)


def _mask(text: str) -> str:
    return text.replace("hunter2", "***")


@pytest.mark.parametrize(("keys", "problem"), [
    (["a", "b", "c"], None),
    ([], None),
    (["a", "b", "a", "c", "c", "a"], "keys must be unique within the step; repeated: a, c"),
    ([f"k{i % 7}" for i in range(100)], "repeated: k0, k1, k2, k3, k4"),
    (["x-hunter2-y", "b"], "an item key contains a secret value"),
    # The secret is named before the repeat: the message must not show it.
    (["hunter2", "hunter2"], "an item key contains a secret value"),
])
def test_key_problems(keys: list[str], problem: str | None) -> None:
    found = key_problem(keys, _mask)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found and "hunter2" not in found


class _Counted(Sequence[str]):
    """Keys that count how often an element is read."""

    def __init__(self, keys: list[str]) -> None:
        self.keys, self.reads = keys, 0

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        self.reads += 1
        return self.keys[i]


def test_a_repeat_among_many_keys_is_found_in_one_pass() -> None:
    # Counting each key's copies one by one (as the engine once did: 9 s for
    # 30,000 keys with one repeat) reads the keys once per key.
    keys = _Counted([f"k{i}" for i in range(2000)] + ["k7"])
    assert key_problem(keys, _mask) == "keys must be unique within the step; repeated: k7"
    assert keys.reads <= 3 * len(keys)


@pytest.mark.parametrize(("good", "text"), [("S003", "S003"), (7, "7"), ("a b.c", "a b.c")])
def test_good_keys(good: object, text: str) -> None:
    assert check_key(good) == text


def _step(**resources: object) -> Step:
    return Step.model_validate({"id": "s", "run": "true", "resources": resources})


@pytest.mark.parametrize(("resources", "code", "tail", "expected"), [
    ({"file_size": "1M"}, 128 + signal.SIGXFSZ, "", "exceeded file_size 1M (killed by SIGXFSZ)"),
    ({"file_size": "1M"}, -signal.SIGXFSZ, "", "exceeded file_size 1M (killed by SIGXFSZ)"),
    ({"cpu_seconds": 2}, 128 + signal.SIGXCPU, "", "exceeded cpu_seconds 2 (killed by SIGXCPU)"),
    ({"cpu_seconds": 2}, 137, "", "cpu_seconds 2 limit is the likely cause"),
    ({"memory": "64M"}, 1, "Traceback...\nMemoryError", "exceeded memory 64M (an allocation failed)"),
    ({"memory": "64M"}, 2, "x: Cannot allocate memory", "exceeded memory 64M"),
    ({"processes": 5}, 2, "sh: fork: Resource temporarily unavailable", "exceeded processes 5"),
    ({"processes": 5}, 2, "/bin/sh: 0: Cannot fork", "exceeded processes 5 (fork failed)"),
    ({}, 2, "/bin/sh: 0: Cannot fork", None),
    ({}, 128 + signal.SIGXFSZ, "", None),                    # no limit set: not our limit
    ({"memory": "64M"}, 1, "some other error", None),
    ({"file_size": "1M"}, 1, "", None),
])
def test_limit_messages(resources: dict[str, object], code: int, tail: str,
                        expected: str | None) -> None:
    got = limit_message(_step(**resources), code, tail)
    if expected is None:
        assert got is None
    else:
        assert got is not None and expected in got


def test_missing_outputs_are_named_by_pattern() -> None:
    step = Step.model_validate({"id": "s", "run": "true",
                                "outputs": ["report.md", "parts/*.csv", "log.txt"]})
    made = [Output("report.md", "0" * 64, 1), Output("parts/a.csv", "0" * 64, 1)]
    assert missing_outputs(step, made) == ["log.txt"]


@pytest.mark.parametrize(("text", "step", "key", "index"), [
    ("align", "align", None, None), ("align/S003", "align", "S003", None),
    ("align/#4", "align", None, 4), ("a/b.c-d", "a", "b.c-d", None),
])
def test_item_addresses(text: str, step: str, key: str | None, index: int | None) -> None:
    addr = parse_item(text)
    assert (addr.step, addr.key, addr.index) == (step, key, index)


@pytest.mark.parametrize("bad", ["", "/x", "a/", "a/#", "a/#x"])
def test_bad_item_addresses(bad: str) -> None:
    with pytest.raises(UserError):
        parse_item(bad)


@pytest.mark.parametrize(("text", "seconds"), [
    ("30d", 30 * 86400), ("12h", 43200), ("45m", 2700), ("90s", 90), ("2w", 1209600),
    ("1.5D", 129600),
])
def test_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize(("text", "why"), [
    ("a month", "use a number with s, m, h, d or w (for example 30d)"),
    # A bare number was seconds: `--older-than 30` took every run older than 30 s.
    ("30", "use a number with s, m, h, d or w"),
    ("1y", "use a number with s, m, h, d or w"),
    ("infd", "use a number with s, m, h, d or w"),
    ("nand", "use a number with s, m, h, d or w"),
    ("0", "use a number with s, m, h, d or w"),
    ("0d", "an age must be more than 0 (every run would go); to delete all finished runs, "
           "use --keep 0"),
    ("-1d", "an age must be more than 0"),
])
def test_bad_ages(text: str, why: str) -> None:
    with pytest.raises(UserError) as refused:
        parse_age(text)
    assert str(refused.value).startswith(f"--older-than {text!r}: {why}")


def _cgroup(tmp_path: Path, line: str, files: dict[str, str]) -> tuple[Path, Path]:
    proc = tmp_path / "cgroup"
    proc.write_text(line + "\n")
    root = tmp_path / "fs"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return proc, root


@pytest.mark.parametrize(("line", "files", "quota"), [
    ("0::/job", {"job/cpu.max": "150000 100000\n"}, 1.5),
    ("0::/job", {"job/cpu.max": "max 100000\n"}, None),
    ("4:cpu,cpuacct:/job", {"cpu/job/cpu.cfs_quota_us": "300000", "cpu/job/cpu.cfs_period_us":
                            "100000"}, 3.0),
    ("4:cpu,cpuacct:/job", {"cpu/job/cpu.cfs_quota_us": "-1", "cpu/job/cpu.cfs_period_us":
                            "100000"}, None),
    ("0::/job", {}, None),
])
def test_cgroup_quota(tmp_path: Path, line: str, files: dict[str, str],
                      quota: float | None) -> None:
    proc, root = _cgroup(tmp_path, line, files)
    assert cgroup_quota(proc, root) == quota


def test_available_cpus_honours_the_quota(tmp_path: Path) -> None:
    proc, root = _cgroup(tmp_path, "0::/job", {"job/cpu.max": "50000 100000\n"})
    assert available_cpus(proc, root) == 1
    assert 1 <= available_cpus() <= 1024


@pytest.mark.parametrize(("kinds", "threads", "waiting", "sizes"), [
    (["run"] * 4, 2, 0, [1, 1, 1, 1]),  # no more ready than twice the threads: one each
    (["run"] * 12, 2, 0, [3, 3, 3, 3]),  # two tasks per thread
    (["run"] * 100, 2, 0, [8] * 12 + [4]),  # at most BATCH_MAX
    (["run"] * 4, 2, 3, [1, 1, 1, 1]),  # a thread without two tasks waiting: spread
    (["run"] * 4, 2, 4, [4]),  # every thread has two waiting: one larger task
    (["run"] * 20, 2, 9, [8, 8, 4]),
    (["agent", "run", "agent"] + ["run"] * 8, 1, 0, [1, 1, 4, 4, 1]),  # agents alone
    (["agent"], 1, 5, [1]),
    ([], 4, 0, []),
])
def test_dask_batches(kinds: list[str], threads: int, waiting: int, sizes: list[int]) -> None:
    from types import SimpleNamespace

    from stockade.runner.dask_executor import batches

    ready: list[Any] = [(f"k{i}", SimpleNamespace(job=SimpleNamespace(kind=k)))
                        for i, k in enumerate(kinds)]
    groups = batches(ready, threads, waiting)
    assert [len(g) for g in groups] == sizes
    # Every job in exactly one task, agents first, runs in their order.
    flat = [k for g in groups for k, _ in g]
    assert sorted(flat) == sorted(k for k, _ in ready)
    assert all(len(g) == 1 for g in groups if g[0][1].job.kind == "agent")


def test_refused_hint_names_each_refusal_once_and_counts_the_rest(tmp_path: Path) -> None:
    log = tmp_path / "1.network.jsonl"
    assert refused_hint(log) == ""  # no log: a step without an allowlist
    entries = [{"allowed": True, "host": "pypi.org", "port": 443}]
    entries += [{"allowed": False, "host": h, "port": 443, "reason": "not in allowlist"}
                for h in ("a.com", "a.com", "b.com", "c.com", "d.com")]
    log.write_text("\n".join(json.dumps(e) for e in entries) + "\nnot json\n")
    assert refused_hint(log) == (
        "; the network proxy refused a.com:443 (not in allowlist), b.com:443 (not in "
        "allowlist), c.com:443 (not in allowlist) and 1 more (meta/1.network.jsonl)")
    log.write_text(json.dumps(entries[0]) + "\n")
    assert refused_hint(log) == ""


class _Dirs:
    def begin_attempt(self, n: int) -> None:
        pass

    def end_attempt(self, keep_scratch: bool = False) -> None:
        pass


@dataclass
class _Run:
    cancelled: bool = False
    masker: Masker = field(default_factory=lambda: Masker([]))


@dataclass
class _Attempt:
    run: _Run = field(default_factory=_Run)
    number: int = 1
    enforced: bool = True
    dirs: _Dirs = field(default_factory=_Dirs)

    def clock(self) -> float:
        return 5.0


@pytest.mark.parametrize(("interrupted", "exc", "status", "message"), [
    # Ctrl-C reached the launcher while the jail was starting: its pipe broke.
    (True, BrokenPipeError(32, "Broken pipe"), AttemptStatus.INTERRUPTED, ""),
    (True, InfraError("the launcher went away"), AttemptStatus.INTERRUPTED, ""),
    # A refusal is the item's own, interrupt or not.
    (True, UserError("x.txt: no such input"), AttemptStatus.ERRORED, "x.txt: no such input"),
    (False, BrokenPipeError(32, "Broken pipe"), AttemptStatus.ERRORED, "Broken pipe"),
    (False, PermissionError(13, "Permission denied", "/x"), AttemptStatus.ERRORED,
     "Permission denied: /x"),
    (False, InfraError("no bwrap"), AttemptStatus.ERRORED, "no bwrap"),
])
def test_a_launch_that_breaks_is_interrupted_only_after_an_interrupt(
        monkeypatch: pytest.MonkeyPatch, interrupted: bool, exc: Exception,
        status: AttemptStatus, message: str) -> None:
    """What ``in_jail`` reports, as the engine then records it (``after_interrupt``
    once an interrupt has arrived)."""
    monkeypatch.setattr(process, "attach", lambda attempt, outcome, inputs: outcome)

    def body(inputs: list[object]) -> Outcome:
        raise exc

    out = process.in_jail(_Attempt(), body)  # type: ignore[arg-type]
    if interrupted:
        out = after_interrupt(out)
    assert (out.status, out.message) == (status, message)
