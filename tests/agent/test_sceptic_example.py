"""``examples/sceptic`` through the real CLI against the scripted model server.

The analysts write notes and a report; each sceptic tries to read the notes
(``list_dir('..')``, relative and absolute paths) and must get nothing; the
``keep:`` rule decides what survives. The key reaches the server only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from modelserver import Call, ModelServer, Seen, Turn, calls, say

from tests.agent.conftest import backends

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sceptic" / "workflow.yaml"
STOCKADE = Path(sys.executable).with_name("stockade")
RUN_ID = "sceptic-e2e"


def _script(root: Path) -> object:
    def respond(seen: Seen, n: int) -> Turn:
        if "You are an analyst" in seen.first_user_text():
            if n == 0:
                return calls(Call("read_file", {"path": "region.txt", "offset": None, "limit": None}),
                             Call("read_file", {"path": "sales.csv", "offset": None, "limit": None}))
            if n == 1:
                region = seen.tool_results()[0].strip()
                trend = "grew steadily" if region == "north" else "jumped in August"
                return calls(
                    Call("create_file", {"path": "out/notes.md", "content": f"ANALYST-NOTES-{region}: unsure\n"}),
                    Call("create_file", {"path": "out/report.md", "content": f"# {region}\nRevenue {trend}.\n"}),
                )
            return say("report written")
        notes = root / "runs" / RUN_ID / "analyse" / "0" / "work" / "out" / "notes.md"
        if n == 0:
            return calls(
                Call("list_dir", {"path": ".."}),
                Call("list_dir", {"path": None}),
                Call("read_file", {"path": "../../analyse/0/work/out/notes.md", "offset": None, "limit": None}),
                Call("read_file", {"path": str(notes), "offset": None, "limit": None}),
                Call("read_file", {"path": "report.md", "offset": None, "limit": None}),
            )
        report = seen.tool_results()[-1]
        return say("HOLDS\nThe numbers support it." if "steadily" in report else "REFUTED\nOne month is not a trend.")

    return respond


@pytest.mark.parametrize("backend", backends())
def test_sceptic_example_end_to_end(backend: str, short_tmp: Path) -> None:
    root = short_tmp / "home"
    with ModelServer(_script(root)) as srv:  # type: ignore[arg-type]
        env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
        env |= srv.env("openai") | {"STOCKADE_SANDBOX": backend}
        r = subprocess.run(
            [str(STOCKADE), "run", str(EXAMPLE), "--root", str(root), "--run-id", RUN_ID, "--json"],
            env=env, capture_output=True, text=True, timeout=120,
        )
        seen = list(srv.seen)
        assert not srv.errors, srv.errors
    assert r.returncode == 0, r.stdout + r.stderr
    run = root / "runs" / RUN_ID
    summary = (run / "summary" / "0" / "meta" / "1.out").read_text()
    assert "1 of 3 claims survived their sceptic: [0]" in summary
    sceptics = [s for s in seen if "You are a sceptic" in s.first_user_text()]
    assert len(sceptics) == 6
    told = [t for s in sceptics for t in s.tool_results()]
    assert not any("ANALYST-NOTES" in t or "notes.md" in t.replace("notes.md'", "") for t in told if not t.startswith("error:"))
    assert sum(t.startswith("error:") for t in told) == 9  # 3 sceptics x (list .., read relative, read absolute)
    assert sorted(t for t in told if not t.startswith("error:") and t.startswith("out/")) == ["out/\nreport.md"] * 3
    for item in range(3):
        meta = run / "challenge" / str(item) / "meta" / "1"
        transcript = [json.loads(line) for line in (meta / "transcript.jsonl").read_text().splitlines()]
        calls_ = [t for t in transcript if t["event"] == "model_call"]
        assert len(calls_) == 2 and all(t["usage"]["input_tokens"] for t in calls_)
        assert transcript[-1]["event"] == "finish" and transcript[-1]["result"].startswith(("HOLDS", "REFUTED"))
        assert (run / "analyse" / str(item) / "work" / "out" / "notes.md").is_file()
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert srv.key.encode() not in p.read_bytes(), p
