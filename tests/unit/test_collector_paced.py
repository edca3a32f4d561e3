"""The engine raises the cyclic collector's first threshold while a run
executes, and gives the caller's thresholds back after it (the speed it buys
is measured in ``bench/``, not here)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from stockade.cli.main import cli
from stockade.runner import engine
from stockade.runner.gcpace import GC_THRESHOLD, collector_paced


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*before)


def test_raised_inside_and_given_back(thresholds: tuple[int, int, int]) -> None:
    with collector_paced():
        assert gc.get_threshold() == (GC_THRESHOLD, 10, 10)
    assert gc.get_threshold() == thresholds


def test_given_back_when_the_block_fails(thresholds: tuple[int, int, int]) -> None:
    with pytest.raises(RuntimeError), collector_paced():
        raise RuntimeError("boom")
    assert gc.get_threshold() == thresholds


def test_a_higher_threshold_of_the_caller_is_kept(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(50_000, 5, 5)
    with collector_paced():
        assert gc.get_threshold() == (50_000, 5, 5)
    assert gc.get_threshold() == (50_000, 5, 5)


def test_a_run_executes_paced(
    thresholds: tuple[int, int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int, int]] = []
    execute = engine.Engine._execute

    def spy(self: engine.Engine) -> engine.RunSummary:
        seen.append(gc.get_threshold())
        return execute(self)

    monkeypatch.setattr(engine.Engine, "_execute", spy)
    wf = tmp_path / "wf.yaml"
    wf.write_text("name: paced\nsteps:\n  - id: pick\n    for_each: [1, 2, 3]\n"
                  "    keep: \"{{ item > 1 }}\"\n")
    r = CliRunner().invoke(cli, ["run", str(wf), "--root", str(tmp_path / "home"),
                                 "--sandbox", "none", "--json"])
    assert r.exit_code == 0, r.output
    assert seen == [(GC_THRESHOLD, 10, 10)]
    assert gc.get_threshold() == thresholds
