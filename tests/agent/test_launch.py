"""What the runner starts in the jail: argv, mounts, environment, and the jail's code."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from stockade.agent.session import install_jail_code, interpreter, jail_launch


def test_launch_is_isolated_read_only_and_keyless(tmp_path: Path) -> None:
    launch = jail_launch(tmp_path / "agent.json", tmp_path / "broker.sock", tmp_path / "lib")
    exe, prefix = interpreter()
    assert launch.argv[:4] == (exe, "-I", "-S", "-B")
    assert launch.argv[-2:] == (str(tmp_path / "lib"), str(tmp_path / "agent.json"))
    assert all(not m.writable and m.target == str(m.source) for m in launch.mounts)
    assert {m.source for m in launch.mounts} == {prefix, tmp_path / "lib", tmp_path / "broker.sock", tmp_path / "agent.json"}
    assert dict(launch.env) == {}


def test_jail_code_is_self_contained(tmp_path: Path) -> None:
    """The copy imports with nothing but the stdlib: no httpx, pydantic or engine module."""
    lib = tmp_path / "lib"
    install_jail_code(lib)
    exe, _ = interpreter()
    probe = (
        f"import sys, json; sys.path.insert(0, {str(lib)!r}); import stockade.agent.jail; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('stockade', 'httpx', 'pydantic'))))"
    )
    r = subprocess.run([exe, "-I", "-S", "-B", "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(r.stdout) == [
        "stockade", "stockade.agent", "stockade.agent.fs", "stockade.agent.guard", "stockade.agent.jail",
        "stockade.agent.loop", "stockade.agent.patch", "stockade.agent.tools",
    ]
    assert all(p.stat().st_mode & 0o004 for p in lib.rglob("*"))  # readable by a jail uid
