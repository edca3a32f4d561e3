"""The broker's one line: an inherited socket, no name, nothing on disk, no path on a command line.

``test_broker_reach`` shows attackers cannot reach the broker; these show
what the line is: the jail's end of a socketpair, over which the jail gets
its code and config, and whoever holds it speaks for the agent (the
positive control: that is why nobody else may hold it).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from modelserver import ModelServer, Seen, say

from stockade.agent import AgentJob, start_agent
from stockade.agent.session import jail_launch
from stockade.sandbox._popen import place_fds_argv
from stockade.sandbox.policy import Policy
from stockade.spec.model import Agent
from tests.agent.conftest import get, jail_backends, run_item

#: A process given the jail's end at fd 3: reads the image, then posts a
#: forged verdict and one more request.
HOLDER = r"""
import json, marshal, re, socket, sys
s = socket.socket(fileno=3)
n = int.from_bytes(s.recv(8, socket.MSG_WAITALL), "big")
b = b""
while len(b) < n:
    b += s.recv(n - len(b))
image = marshal.loads(b)

def post(route, payload):
    body = json.dumps(payload).encode()
    try:
        s.sendall(f"POST {route} HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    except (BrokenPipeError, ConnectionResetError):
        return "closed"
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return "closed"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    size = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(rest) < size:
        rest += s.recv(65536)
    return json.loads(rest[:size])

forged = {"ok": True, "result": "HOLDS forged " + sys.argv[1], "message": "", "turns": 1}
out = {"config": image["config"], "names": [s.getsockname(), s.getpeername()]}
out["finish"] = post("/finish", forged)
out["after"] = post("/model", {"messages": []})
print(json.dumps(out))
"""


def _job(root: Path, prompt: str, host_env: dict[str, str]) -> AgentJob:
    work, meta = root / "work", root / "meta"
    (work / "out").mkdir(parents=True)
    return AgentJob(
        run_id="r", step="s", item=0, attempt=1,
        config=Agent(model="openai/m", prompt=prompt, tools=["read_file"], writes=["out/**"], max_turns=4),
        work_dir=work, meta_dir=meta, timeout=60, host_env=host_env, echo=lambda s: None, interactive=False,
    )


def test_whoever_holds_the_jail_end_speaks_for_the_agent(short_tmp: Path) -> None:
    marker, token = secrets.token_hex(8), secrets.token_hex(8)
    with ModelServer([say("REFUTED")]) as srv:
        job = _job(short_tmp, f"Answer HOLDS or REFUTED. {token}", srv.env("openai"))
        with start_agent(job) as s:
            fd = s.launch.pass_fds[0]
            r = subprocess.run(place_fds_argv([sys.executable, "-I", "-S", "-c", HOLDER, marker], [fd]),
                               pass_fds=(fd,), capture_output=True, text=True, timeout=120)
            outcome = s.finish(r.returncode)
        seen = list(srv.seen)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    # The config came over the line; the line has no address on either end.
    assert got["config"] == {"prompt": f"Answer HOLDS or REFUTED. {token}", "tools": ["read_file"],
                             "writes": ["out/**"], "max_turns": 4}
    assert got["names"] == ["", ""]
    # The positive control: the holder's forged verdict is the item's verdict...
    assert got["finish"] == {"ok": True}
    assert outcome.result == f"HOLDS forged {marker}"
    # ...and after it the broker hangs up: nothing more, and the key was not spent.
    assert got["after"] == "closed"
    assert seen == []


def _processes() -> dict[int, tuple[bytes, bytes]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes()
                env = Path(f"/proc/{name}/environ").read_bytes()
            except OSError:
                continue
            out[int(name)] = (cmd, env)
    return out


def _warm(launch: str, tmp: Path) -> None:
    """Start one jail first: a backend makes its own helper folders on first use."""
    work = tmp / "warm"
    work.mkdir()
    pol = Policy(argv=("/bin/true",), work_dir=work, scratch_dir=tmp / "warm-scratch", env={"PATH": "/usr/bin:/bin"})
    with open(os.devnull, "wb") as null:
        assert get(launch).start(pol, stdout=null, stderr=null).wait(60) == 0


@pytest.mark.parametrize("launch", [pytest.param("none", id="none"), *jail_backends()])
def test_no_path_on_any_command_line_and_nothing_on_disk(
    launch: str, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During a model call: the jail's command line is the interpreter and the
    boot program; no process's command line or environment names the item's
    records or carries its prompt; the engine made no file or folder for the
    agent outside work/ and meta/ (no runtime dir, socket, config or code copy)."""
    token = secrets.token_hex(8)
    _warm(launch, short_tmp)
    watched = short_tmp / "tmpdir"
    watched.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(watched))
    item_root = short_tmp / "runs" / "r1" / "step" / "0"
    during: list[tuple[dict[int, tuple[bytes, bytes]], list[str], list[str]]] = []

    def inspect(seen: Seen) -> None:
        during.append((_processes(), sorted(p.name for p in watched.iterdir()), sorted(p.name for p in item_root.iterdir())))

    with ModelServer([say("done")], on_request=inspect) as srv:
        outcome, it = run_item(
            short_tmp, backend=launch, host_env=srv.env("openai"),
            agent=Agent(model="openai/m", prompt=f"Say done. {token}", tools=["read_file"]),
        )
        seen = list(srv.seen)
    assert outcome.ok and outcome.result == "done", (outcome.message, it.log)
    # The prompt did reach the jail (over its fd) and through it the model.
    assert token in seen[0].first_user_text()
    ((procs, temp, item),) = during
    expected = b"\0".join(a.encode() for a in jail_launch(3).argv) + b"\0"
    assert any(cmd == expected for cmd, _env in procs.values()), "the jail was not seen during the model call"
    for pid, (cmd, env) in procs.items():
        for secret in (token.encode(), str(it.meta).encode(), str(it.root / "meta").encode()):
            assert secret not in cmd and secret not in env, (pid, cmd[:300])
    assert temp == []
    assert item == ["meta", "work"]
