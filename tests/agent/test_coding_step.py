"""A coding step through the CLI: ``tree()`` in, strict patches, diff out, ``stockade apply``.

The seed-001 shape once more, end to end: the model guesses a leftover path,
is refused, patches the named file; ``stockade apply`` then lands exactly
that file in the host checkout and ``git diff --name-only`` proves it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from modelserver import Call, ModelServer, calls, say

from tests.agent.conftest import backends

STOCKADE = str(Path(sys.executable).with_name("stockade"))
UTILS = "def total(xs):\n    return round(sum(xs), 2)\n"
APP = "from billing.utils import total\n"
GOOD = "--- a/billing/utils.py\n+++ b/billing/utils.py\n@@ -1,2 +1,6 @@\n+def round_cents(x):\n+    return round(x, 2)\n+\n+\n def total(xs):\n-    return round(sum(xs), 2)\n+    return round_cents(sum(xs))\n"
WORKFLOW = """\
name: coding
steps:
  - id: fix
    inputs:
      repo: "{{ tree('checkout') }}"
    agent:
      model: %s/coder
      prompt: Extract a round_cents helper in billing/utils.py and use it in total().
      tools: [read_file, list_dir, apply_patch]
      writes: ["repo/**"]
"""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_coding_step_then_apply(provider: str, backend: str, short_tmp: Path) -> None:
    proj = short_tmp / "proj"
    co = proj / "checkout"
    (co / "billing").mkdir(parents=True)
    (co / "src").mkdir()
    (co / "billing" / "utils.py").write_text(UTILS)
    (co / "src" / "app.py").write_text(APP)
    _git(co, "init", "-q")
    _git(co, "add", ".")
    _git(co, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    (proj / "workflow.yaml").write_text(WORKFLOW % provider)
    root = short_tmp / "home"
    script = [
        calls(Call("list_dir", {"path": "repo"})),
        calls(Call("apply_patch", {"path": "repo/src/app.py", "diff": "@@ -1 +1 @@\n-from billing.utils import total\n+x\n"})),
        calls(Call("apply_patch", {"path": "repo/billing/utils.py", "diff": GOOD})),
        say("done"),
    ]
    with ModelServer(script) as srv:
        env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
        env |= srv.env(provider) | {"STOCKADE_SANDBOX": backend}
        r = subprocess.run([STOCKADE, "run", str(proj / "workflow.yaml"), "--root", str(root), "--run-id", "c1"],
                           env=env, capture_output=True, text=True, timeout=120)
        results = [s.tool_results() for s in srv.seen[1:]]
    assert r.returncode == 0, r.stderr
    assert results[0] == ["billing/\nsrc/"]
    assert results[1][0].startswith("error:") and "not named" in results[1][0]
    assert "WRITE TARGET: repo/billing/utils.py" in r.stderr + r.stdout
    diff = (root / "runs/c1/fix/0/meta/1/changes.diff").read_text()
    assert "diff --git a/repo/billing/utils.py b/repo/billing/utils.py" in diff and "src/app.py" not in diff

    a = subprocess.run([STOCKADE, "apply", "c1", "fix/0", "--to", str(co), "--root", str(root), "--yes"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert a.returncode == 0, a.stdout + a.stderr
    assert f"TARGET: {co / 'billing/utils.py'}" in a.stdout
    assert _git(co, "diff", "--name-only").split() == ["billing/utils.py"]
    assert "return round_cents(sum(xs))" in (co / "billing/utils.py").read_text()
    assert (co / "src/app.py").read_text() == APP
