"""Agent items end to end: scripted model server -> broker -> jail -> tools -> gate.

Every test runs under both providers' real wire formats and under each
available sandbox backend (``none`` always, ``bwrap`` when present).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from modelserver import Call, ModelServer, Seen, calls, say

from stockade.agent import ship
from stockade.spec.model import Agent
from tests.agent.conftest import backends, run_item

PROVIDERS = ["openai", "anthropic"]

UTILS = "def total(xs):\n    return round(sum(xs), 2)\n\n\ndef fmt(x):\n    return f'{x:.2f}'\n"
APP = "from billing.utils import total\n\nprint(total([1, 2]))\n"
GOOD = (
    "--- a/billing/utils.py\n+++ b/billing/utils.py\n@@ -1,2 +1,6 @@\n"
    "+def round_cents(x):\n+    return round(x, 2)\n+\n+\n"
    " def total(xs):\n-    return round(sum(xs), 2)\n+    return round_cents(sum(xs))\n"
)
APP_DIFF = "--- a/src/app.py\n+++ b/src/app.py\n@@ -1,3 +1,3 @@\n-from billing.utils import total\n+from billing.utils import round_cents as total\n \n print(total([1, 2]))\n"
PROMPT = "Extract a round_cents helper inside billing/utils.py and use it in total(). Change nothing else."


def _jail_envs() -> list[dict[str, str]]:
    """The environment of every live jailed agent process on this machine."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if ship.BOOT.encode() not in cmd or b"bwrap" in cmd.split(b"\0")[0]:
                continue
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        found.append(dict(e.split("=", 1) for e in raw.decode(errors="replace").split("\0") if "=" in e))
    return found


def _all_bytes(root: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("provider", PROVIDERS)
def test_seed_001_wrong_file_incident(provider: str, backend: str, short_tmp: Path) -> None:
    work_abs = short_tmp / "runs" / "r1" / "step" / "0" / "work"
    script = [
        calls(Call("apply_patch", {"diff": GOOD})),  # path omitted
        calls(Call("apply_patch", {"path": "src/app.py", "diff": APP_DIFF})),  # guessed, exists, not named
        calls(Call("apply_patch", {"file": "billing/utils.py", "diff": GOOD})),  # alias key
        calls(Call("apply_patch", {"target": "billing/utils.py", "path": "billing/utils.py", "diff": GOOD})),
        calls(Call("apply_patch", {"path": "../0/work/billing/utils.py", "diff": GOOD})),  # traversal
        calls(Call("apply_patch", {"path": str(work_abs / "billing/utils.py"), "diff": GOOD})),  # absolute
        calls(Call("create_file", {"path": "billing/utils.py", "content": "clobbered\n"})),  # over existing
        calls(Call("apply_patch", {"path": "billing/utils.py", "diff": APP_DIFF})),  # diff for another file
        calls(Call("apply_patch", {"path": "billing/utils.py", "diff": GOOD})),  # the right patch
        say("Extracted round_cents in billing/utils.py."),
    ]
    jail_envs: list[dict[str, str]] = []

    def inspect(seen: Seen) -> None:
        jail_envs.extend(_jail_envs())

    with ModelServer(script, on_request=inspect) as srv:
        outcome, it = run_item(
            short_tmp,
            backend=backend,
            agent=Agent(model=f"{provider}/scripted-1", prompt=PROMPT, tools=["read_file", "apply_patch", "create_file"],
                        writes=["billing/**", "src/**"], max_turns=12),
            host_env=srv.env(provider) | {"HOME": "/root"},
            inputs={"billing/utils.py": UTILS, "src/app.py": APP},
        )
        seen = list(srv.seen)
        assert not srv.errors, srv.errors

    assert outcome.ok, (outcome.message, it.log)
    assert outcome.result == "Extracted round_cents in billing/utils.py."
    assert outcome.writes == ("billing/utils.py",) and outcome.extra_paths == ()
    # What the model was told after each bad call: a clear error, nothing written.
    results = [s.tool_results() for s in seen[1:]]
    expected = [
        "required argument 'path' is missing",
        "was not named in the operator's request",
        "unknown argument(s) ['file']",
        "unknown argument(s) ['target']",
        "parent traversal is forbidden",
        "absolute paths are forbidden",
        "already exists",
        "header names 'src/app.py'",
        "patched billing/utils.py",
    ]
    for got, want in zip(results, expected, strict=True):
        assert len(got) == 1 and want in got[0], (want, got)
    assert all(r[0].startswith("error:") for r in results[:8])
    # Only the named file changed, exactly as asked; the leftover file is untouched.
    assert (it.work / "src/app.py").read_text() == APP
    new = (it.work / "billing/utils.py").read_text()
    assert new.startswith("def round_cents(x):") and "return round_cents(sum(xs))" in new and "def fmt" in new
    assert it.echoed == ["WRITE TARGET: billing/utils.py"]
    writes = [json.loads(line) for line in (it.meta / "writes.jsonl").read_text().splitlines()]
    assert [w["event"] for w in writes] == ["intent", "written"]
    import hashlib

    assert writes[1]["sha256"] == hashlib.sha256(new.encode()).hexdigest() == writes[1]["reported"]
    assert "+    return round_cents(sum(xs))" in outcome.diff
    assert (it.meta / "changes.diff").read_text() == outcome.diff
    # The transcript: every call, with latency and usage, keys masked.
    records = [json.loads(line) for line in (it.meta / "transcript.jsonl").read_text().splitlines()]
    transcript = [t for t in records if t["event"] == "model_call"]
    assert [t["n"] for t in transcript] == list(range(1, 11))
    assert records[-1] == {"time": records[-1]["time"], "event": "finish", "ok": True, "result": outcome.result,
                           "message": "", "turns": 10, "usage": dict(outcome.usage)}
    assert outcome.usage["model_calls"] == 10 and outcome.usage["input_tokens"] > 0
    assert all(t["latency_ms"] >= 0 and t["usage"]["input_tokens"] and t["response"]["status"] == 200 for t in transcript)
    # Each call is preceded by its call-started record; each request is recorded as
    # what is new since the previous call (the first one whole).
    started = [r for r in records if r["event"] == "call_started"]
    assert [r["n"] for r in started] == list(range(1, 11))
    assert transcript[0]["request"]["body"]["model"] == "scripted-1"
    assert all("model" not in t["request"]["body"] and "tools" not in t["request"]["body"] for t in transcript[1:])
    # The key reached the server, and nothing else.
    key = srv.key
    assert all(key in (s.headers.get("authorization", "") + s.headers.get("x-api-key", "")) for s in seen)
    assert jail_envs, "the jail process was not observed during a model call"
    if backend == "bwrap":  # it really ran in the jail: HOME is the jail's private one
        assert all(env.get("HOME") == "/home/stockade" for env in jail_envs), jail_envs[0]
    for env in jail_envs:
        assert not any(key in v for v in env.values())
        assert not any(k.endswith("_API_KEY") or k.endswith("_BASE_URL") for k in env)
    for path, data in _all_bytes(short_tmp):
        assert key.encode() not in data, path


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("provider", PROVIDERS)
def test_sceptic_cannot_see_the_analyst(provider: str, backend: str, short_tmp: Path) -> None:
    notes = "PRIVATE-ANALYST-REASONING: the trend is driven by a single outlier"
    report = "# Report\nRevenue grew 12% in the north region.\n"

    analyst_work = short_tmp / "runs" / "r1" / "analyse" / "0" / "work"
    analyst_work.mkdir(parents=True)
    (analyst_work / "notes.md").write_text(notes)
    (analyst_work / "out").mkdir()
    (analyst_work / "out" / "report.md").write_text(report)

    script = [
        calls(Call("list_dir", {"path": ".."}), Call("list_dir", {"path": None}), Call("list_dir", {"path": "../.."})),
        calls(
            Call("read_file", {"path": "../../../analyse/0/work/notes.md", "offset": None, "limit": None}),
            Call("read_file", {"path": str(analyst_work / "notes.md"), "offset": None, "limit": None}),
            Call("read_file", {"path": "report.md", "offset": None, "limit": None}),
        ),
        say("REFUTED: one region is not a trend."),
    ]
    with ModelServer(script) as srv:
        outcome, _it = run_item(
            short_tmp,
            backend=backend,
            agent=Agent(model=f"{provider}/sceptic", prompt="Try to refute report.md. Answer HOLDS or REFUTED.",
                        tools=["read_file", "list_dir"]),
            host_env=srv.env(provider),
            inputs={"report.md": report},
        )
        seen = list(srv.seen)
    assert outcome.ok and outcome.result.startswith("REFUTED")
    listing, reads = seen[1].tool_results(), seen[2].tool_results()
    assert listing[0].startswith("error:") and "parent traversal" in listing[0]
    assert listing[1] == "out/\nreport.md"
    assert listing[2].startswith("error:")
    assert reads[0].startswith("error:") and reads[1].startswith("error:")
    assert reads[2] == report
    everything = json.dumps([s.body for s in seen])
    assert "PRIVATE-ANALYST-REASONING" not in everything
    # The only things the sceptic learnt are its own folder and the report; the
    # errors echo nothing but the path it asked for.
    told = [r for s in seen for r in s.tool_results()]
    assert [r for r in told if not r.startswith("error:")] == ["out/\nreport.md", report]
    assert all(len(r) < 200 for r in told if r.startswith("error:"))
    assert outcome.writes == () and outcome.extra_paths == ()


@pytest.mark.parametrize("backend", backends())
def test_name_list_gate_names_extra_paths(backend: str, short_tmp: Path) -> None:
    def tamper(work: Path) -> None:
        (work / "data.txt").write_text("changed behind the tools\n")
        (work / "out" / "sneaky.md").write_text("x")
        (work / "out" / "r.md").write_text("rewritten after the tool wrote it\n")

    script = [calls(Call("create_file", {"path": "out/r.md", "content": "report\n"})), say("done")]
    with ModelServer(script) as srv:
        outcome, it = run_item(
            short_tmp,
            backend=backend,
            agent=Agent(model="openai/m", prompt="write out/r.md", tools=["create_file"]),
            host_env=srv.env("openai"),
            inputs={"data.txt": "input\n"},
            tamper=tamper,
        )
    assert not outcome.ok
    assert outcome.extra_paths == ("data.txt", "out/r.md", "out/sneaky.md")
    assert "data.txt" in outcome.message and "out/sneaky.md" in outcome.message
    assert json.loads((it.meta / "outcome.json").read_text())["extra_paths"] == list(outcome.extra_paths)


@pytest.mark.parametrize(
    ("interactive", "answer", "written"),
    [(False, True, False), (True, False, False), (True, True, True)],
)
def test_approve_ask(interactive: bool, answer: bool, written: bool, short_tmp: Path) -> None:
    asked: list[str] = []

    def ask(path: str) -> bool:
        asked.append(path)
        return answer

    script = [calls(Call("create_file", {"path": "out/r.md", "content": "report\n"})), say("done")]
    with ModelServer(script) as srv:
        outcome, it = run_item(
            short_tmp,
            backend="none",
            agent=Agent(model="anthropic/m", prompt="write out/r.md", tools=["create_file"], approve="ask"),
            host_env=srv.env("anthropic"),
            interactive=interactive,
            ask=ask,
        )
        result = srv.seen[1].tool_results()[0]
    assert it.echoed == ["WRITE TARGET: out/r.md"]
    assert asked == (["out/r.md"] if interactive else [])
    assert (it.work / "out" / "r.md").exists() is written
    assert outcome.ok and outcome.writes == (("out/r.md",) if written else ())
    if not written:
        assert result.startswith("error:") and ("no terminal" in result or "refused" in result)
    events = [json.loads(line)["event"] for line in (it.meta / "writes.jsonl").read_text().splitlines()]
    assert events == (["intent", "approved", "written"] if written else ["intent", "refused"])
