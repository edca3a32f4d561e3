"""``--strict-skips`` turns every skip into a failure: a test's own, and a
module's that skips itself while it is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

MODULE_SKIP = """\
import pytest
pytest.importorskip("no_such_module_anywhere")

def test_never_collected() -> None:
    pass
"""

TEST_SKIP = """\
import pytest

def test_skips() -> None:
    pytest.skip("bubblewrap is missing")
"""


@pytest.mark.parametrize("body", [MODULE_SKIP, TEST_SKIP], ids=["module", "test"])
@pytest.mark.parametrize("strict", [False, True])
def test_a_skip_fails_under_strict_skips(tmp_path: Path, body: str, strict: bool) -> None:
    (tmp_path / "test_it.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "STOCKADE_STRICT_SKIPS": "1" if strict else "0"}
    # The suite's own conftest, loaded as a plugin into a throwaway session.
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_it.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    if strict:
        assert p.returncode != 0, p.stdout
        assert "skipped under --strict-skips" in p.stdout
    else:
        # 5: pytest's "no tests collected", for the module that skipped itself.
        assert p.returncode in (0, 5), p.stdout + p.stderr
        assert "1 skipped" in p.stdout
