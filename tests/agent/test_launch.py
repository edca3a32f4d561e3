"""What the runner starts in the jail: argv, mounts, environment, and how the jail gets its code."""

from __future__ import annotations

import json
import marshal
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stockade.agent import ship
from stockade.agent.session import interpreter, jail_launch
from stockade.sandbox._popen import place_fds_argv


def test_launch_names_no_path_and_passes_the_broker_fd() -> None:
    launch = jail_launch(17)
    exe, prefix = interpreter()
    assert launch.argv == (exe, "-I", "-S", "-B", "-c", ship.BOOT)
    assert "/" not in ship.BOOT  # no path of any kind on the jail's command line
    assert [(m.source, m.target, m.writable) for m in launch.mounts] == [(prefix, str(prefix), False)]
    assert launch.pass_fds == (17,)
    assert dict(launch.env) == {}


def _boot_in_child(frame: bytes) -> subprocess.CompletedProcess[str]:
    """Run ``ship.BOOT`` with one end of a socketpair at fd 3 that carries ``frame``."""
    here, there = socket.socketpair()
    try:
        exe, _ = interpreter()
        argv = place_fds_argv([exe, "-I", "-S", "-B", "-c", ship.BOOT], [there.fileno()])
        proc = subprocess.Popen(argv, pass_fds=(there.fileno(),), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
        there.close()
        here.sendall(frame)
        here.shutdown(socket.SHUT_WR)
        out, err = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)
    finally:
        here.close()
        there.close()


@pytest.mark.parametrize("code", [True, False], ids=["code-objects", "source"])
def test_jail_code_comes_over_the_socket_and_is_self_contained(code: bool) -> None:
    """The shipped modules import with nothing but the stdlib: no httpx, pydantic
    or engine module, none of them from a file."""
    boot, modules = ship._parts(code)
    # In place of boot.main: load the real boot stage, import the jail, report.
    probe = (
        "def main(s, d):\n"
        "    import json, sys\n"
        "    g = {'__name__': 'stockade.agent.boot'}\n"
        "    exec(d['real_boot'], g)\n"
        "    sys.meta_path.insert(0, g['ShippedModules'](d['modules']))\n"
        "    import stockade.agent.jail\n"
        "    mods = sorted(m for m in sys.modules if m.split('.')[0] in ('stockade', 'httpx', 'pydantic'))\n"
        "    print(json.dumps([mods, stockade.agent.jail.__spec__.origin, d['config']]))\n"
        "    return 0\n"
    )
    payload = {"boot": probe, "real_boot": boot, "modules": modules, "config": {"prompt": "p", "tools": []}}
    blob = marshal.dumps(payload) if code else marshal.dumps(payload, 4)
    r = _boot_in_child(len(blob).to_bytes(8, "big") + blob)
    assert r.returncode == 0, r.stderr
    names, origin, config = json.loads(r.stdout)
    assert names == [
        "stockade", "stockade.agent", "stockade.agent.fs", "stockade.agent.guard", "stockade.agent.jail",
        "stockade.agent.loop", "stockade.agent.patch", "stockade.agent.tools",
    ]
    assert origin == "stockade image"
    assert config == {"prompt": "p", "tools": []}


def test_image_frame_and_portable_source() -> None:
    frame = ship.image({"prompt": "x", "tools": ["read_file"], "writes": ["out/**"], "max_turns": 3}, code=False)
    n = int.from_bytes(frame[:8], "big")
    assert n == len(frame) - 8
    data = marshal.loads(frame[8:])
    assert data["config"] == {"prompt": "x", "tools": ["read_file"], "writes": ["out/**"], "max_turns": 3}
    # Source for another interpreter: plain strings only, nothing version-bound.
    assert isinstance(data["boot"], str)
    assert all(isinstance(src, str) for _pkg, src in data["modules"].values())
    assert {name for name, _file, _pkg in ship.JAIL_MODULES} == set(data["modules"])


def test_boot_fails_clearly_when_the_broker_hangs_up() -> None:
    r = _boot_in_child(b"\0\0\0\0\0\0\1\0short")
    assert r.returncode == 1 and "the broker connection closed during the start" in r.stderr


def test_engine_python_runs_the_jail_without_a_copy_of_stockade() -> None:
    """The jail's sys.path holds nothing of the engine: -I and -S, no folder added."""
    exe, _ = interpreter()
    r = subprocess.run([exe, "-I", "-S", "-B", "-c", "import sys, json; print(json.dumps(sys.path))"],
                       capture_output=True, text=True, check=True)
    src = os.path.dirname(os.path.dirname(ship.__file__))
    assert not any(p.startswith(src) for p in json.loads(r.stdout)), (src, r.stdout)


def test_code_objects_only_for_an_interpreter_that_reads_them(tmp_path: Path) -> None:
    assert ship.reads_our_bytecode(os.path.realpath(sys.executable))
    other = tmp_path / "python3"
    other.write_text("#!/bin/sh\nprintf 0d0d0d0d\n")  # another bytecode magic
    other.chmod(0o755)
    assert not ship.reads_our_bytecode(str(other))
    assert not ship.reads_our_bytecode(str(tmp_path / "missing"))
