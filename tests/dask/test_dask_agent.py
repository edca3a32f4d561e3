"""An agent step on a Dask worker: the key stays on the engine, the model calls go through it.

The scripted model server (``tests/modelserver.py``) accepts only its own
random key. The item's broker runs on the worker beside its files; every
model call reaches the server through the engine's gateway, which alone adds
the key. While the server answers, the test looks for the key in every file
under the workers' folders and in the environment of every process on the
machine: only the engine holds it.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import daskcluster
import pytest
from modelserver import Call, ModelServer, Seen, calls, say

from tests.integration.conftest import Project

WORKFLOW = """\
name: agentic
steps:
  - id: draft
    inputs:
      notes.txt: "the sky is blue"
    agent:
      model: {provider}/scripted-1
      prompt: Read notes.txt and write out/report.md.
      tools: [read_file, create_file]
    outputs: [report.md]
"""


def _holders(key: bytes) -> dict[int, str]:
    """pid -> command line of every process whose environment holds ``key``."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            if key in env:
                found[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().decode(
                    errors="replace").replace("\0", " ")
        except OSError:
            continue
    return found


def _files_with(root: Path, key: bytes) -> list[str]:
    out = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink() and key in p.read_bytes():
                out.append(str(p))
        except OSError:
            continue
    return out


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_agent_item_on_a_worker_never_sees_the_key(provider: str,
                                                       dask_cluster: daskcluster.Cluster,
                                                       project: Project) -> None:
    key = f"sk-dask-{secrets.token_hex(16)}"
    report = f"report {secrets.token_hex(4)}\n"
    script = [
        calls(Call("read_file", {"path": "notes.txt"})),
        calls(Call("create_file", {"path": "out/report.md", "content": report})),
        say("Wrote out/report.md."),
    ]
    leaks: list[str] = []
    engine_pid: list[int] = []
    checked: list[int] = []

    def inspect(seen: Seen) -> None:
        # Mid-run: the item's jail and broker are alive on the worker right now.
        holders = _holders(key.encode())
        # The scan finds the key where it is (the engine: positive control of the check).
        assert engine_pid and engine_pid[0] in holders
        for pid, cmd in holders.items():
            if pid not in engine_pid:
                leaks.append(f"process {pid}: {cmd}")
        leaks.extend(f"file {f}" for f in _files_with(dask_cluster.base, key.encode()))
        checked.append(1)

    project.write("wf.yaml", WORKFLOW.format(provider=provider))
    with ModelServer(script, key=key, on_request=inspect) as srv:
        proc = project.popen("run", "wf.yaml", "--executor", dask_cluster.url, "--json",
                             env=srv.env(provider))
        engine_pid.append(proc.pid)
        out, err = proc.communicate(timeout=300)
        seen = list(srv.seen)
        assert not srv.errors, srv.errors
    assert proc.returncode == 0, err
    data = json.loads(out)
    assert data["status"] == "succeeded"
    assert data["usage"].get("model_calls") == 3
    assert len(seen) == 3 and len(checked) == 3
    assert not leaks, leaks
    # The file scan finds the key where it is (positive control of the check).
    canary = dask_cluster.base / f"canary-{secrets.token_hex(4)}" / "deep" / "k.bin"
    canary.parent.mkdir(parents=True)
    canary.write_bytes(b"prefix " + key.encode() + b" suffix")
    try:
        assert str(canary) in _files_with(dask_cluster.base, key.encode())
    finally:
        canary.unlink()
    # The server accepted the calls: the real key arrived there (added by the engine).
    auth = seen[0].headers.get("authorization") or seen[0].headers.get("x-api-key") or ""
    assert key in auth
    run_dir = project.root / "runs" / data["run_id"] / "draft" / "0"
    assert (run_dir / "work" / "out" / "report.md").read_text() == report
    # The transcript came back from the worker into the attempt's meta/, key masked.
    transcript = (run_dir / "meta" / "1" / "transcript.jsonl").read_text()
    assert '"event": "model_call"' in transcript and key not in transcript
    assert (run_dir / "meta" / "1" / "writes.jsonl").exists()
    assert "WRITE TARGET: out/report.md" in err  # the broker's echo reached the engine
    prov = project.provenance(data["run_id"], "draft/0")
    assert prov["worker"]["name"] in ("w1", "w2")
    assert {o["name"] for o in prov["outputs"]} == {"report.md", "changes.diff"}
    assert not _files_with(dask_cluster.base, key.encode())
