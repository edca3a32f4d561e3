"""Only an item's own jail can talk to its broker: attackers hunt it through the real CLI.

A workflow asks an agent for a verdict (HOLDS or REFUTED) and a ``keep:``
step keeps the item only on HOLDS. While the agent waits on the scripted
model server, an attacker (``broker_attacker.py``) hunts the item's broker
with everything it can see, and posts a forged ``/finish`` (HOLDS) and a
``/model`` call to whatever answers like a broker:

* an unprivileged local user (``setpriv`` to an unused uid) on the host;
* a sibling step of the same run with ``network: open``.

The model says REFUTED, so nothing may be kept, and the model server must
see one request only. Every run plants decoys shaped like the broker that
was reachable before (a 0666 socket in 0711 folders under /tmp, plus an
abstract socket), and the attacker must reach one of them and forge there:
the positive control that its hunt works where a broker can be reached.

The tests use only the CLI and the attacker script, so they run unchanged
against an engine whose broker listens on a path (they fail there).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from modelserver import ModelServer, Seen, Turn, say

from tests.agent.conftest import LAUNCHES, jail_backends

STOCKADE = str(Path(sys.executable).with_name("stockade"))
ATTACKER = Path(__file__).with_name("broker_attacker.py")
#: No account uses it: an ordinary local user with no rights to anything of the run.
LOCAL_UID = 54321


class _DecoyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _DecoyServer

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        self.server.decoy.requests.append((self.server.label, self.path, body))
        known = self.path in ("/finish", "/model")
        data = json.dumps({"ok": known} if known else {"ok": False, "error": f"unknown route {self.path}"}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def address_string(self) -> str:
        return "client"


class _DecoyServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    decoy: Decoy
    label: str


class Decoy:
    """Broker-shaped listeners reachable the way the path broker was; both
    names carry the run id (so the attacker counts them as the run's)."""

    def __init__(self, scope: str) -> None:
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.dir = Path(tempfile.mkdtemp(prefix=f"stockade-decoy-{scope}-", dir="/tmp"))
        self.dir.chmod(0o711)
        sub = self.dir / secrets.token_hex(8)
        sub.mkdir()
        sub.chmod(0o711)
        self.path = sub / "broker.sock"
        self.abstract = f"stockade-decoy-{scope}"
        self._servers: list[_DecoyServer] = []
        for label, addr in (("path", str(self.path)), ("abstract", "\0" + self.abstract)):
            srv = _DecoyServer(addr, _DecoyHandler)
            srv.decoy, srv.label = self, label
            threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
            self._servers.append(srv)
        self.path.chmod(0o666)

    def addrs(self) -> set[str]:
        return {str(self.path), "@" + self.abstract}

    def forged(self, marker: str) -> list[str]:
        """Labels of the decoys that got the attacker's forged verdict."""
        return [label for label, route, body in self.requests
                if route == "/finish" and body.get("result") == f"HOLDS forged {marker}"]

    def close(self) -> None:
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def scope() -> str:
    return f"brk{secrets.token_hex(6)}"


@pytest.fixture
def decoy(scope: str) -> Iterator[Decoy]:
    d = Decoy(scope)
    yield d
    d.close()


def _workflow(root: Path, model_token: str, *, attack: tuple[str, int] | None = None) -> Path:
    """judge (agent) -> verdict (keep HOLDS) -> report; with ``attack`` (scope,
    gate port) a sibling step that hunts the judge's broker meanwhile."""
    wf = root / "wf"
    wf.mkdir()
    shutil.copy(ATTACKER, wf / "attack.py")
    text = f"""\
name: reach
steps:
  - id: judge
    inputs:
      claim.md: "Revenue grew."
    timeout: 600
    agent:
      model: openai/judge-{model_token}
      prompt: "Read claim.md. Answer HOLDS or REFUTED on the first line."
      tools: [read_file]
      max_turns: 3
  - id: verdict
    needs: [judge]
    for_each: "{{{{ steps.judge.items }}}}"
    keep: "{{{{ item.result.strip().startswith('HOLDS') }}}}"
  - id: report
    needs: [judge, verdict]
    inputs:
      kept.json: "{{{{ steps.verdict.result | map(attribute='index') | list | to_json }}}}"
      verdict.txt: "{{{{ steps.judge.result }}}}"
    run: cat kept.json; echo; cat verdict.txt
"""
    if attack is not None:
        text += """\
  - id: attack
    network: open
    timeout: 600
    inputs:
      attack.py: "{{{{ file('attack.py') }}}}"
    env:
      ATTACK_SCOPE: "{}"
      GATE_PORT: "{}"
    run: python3 -I -S attack.py "$ATTACK_SCOPE" - "$GATE_PORT"
""".format(*attack)
    (wf / "workflow.yaml").write_text(text)
    return wf / "workflow.yaml"


def _run(workflow: Path, root: Path, run_id: str, srv: ModelServer, launch: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
    env |= srv.env("openai") | LAUNCHES[launch]
    return subprocess.run(
        [STOCKADE, "run", str(workflow), "--root", str(root / "home"), "--run-id", run_id, "--jobs", "4"],
        env=env, capture_output=True, text=True, timeout=900,
    )


def _broker_answers(report: dict[str, Any], decoy: Decoy) -> list[Any]:
    """Everything in the report that answered like a broker, decoys excepted."""
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("broker") is True and node.get("addr") not in decoy.addrs():
                found.append(node)
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(report)
    return found


def _jail_argvs(report: dict[str, Any]) -> list[list[str]]:
    """In-scope processes that are the agent's jailed interpreter (``python -I -S -B ...``)."""
    return [argv for argv in report["in_scope"].values() if argv[1:4] == ["-I", "-S", "-B"]]


def _check(r: subprocess.CompletedProcess[str], root: Path, run_id: str, srv: ModelServer,
           report: dict[str, Any], marker: str, model_token: str, decoy: Decoy) -> None:
    assert r.returncode == 0, r.stdout + r.stderr
    # The attacker really ran, during the model call, with this run's marker.
    assert report["marker"] == marker
    # The positive control: where a broker can be reached, this hunt reaches it and forges.
    assert decoy.forged(marker), (decoy.requests, [c for c in report["candidates"] if c["scope"]])
    # keep: acted on the model's verdict only, and the key was spent once.
    out = (root / "home" / "runs" / run_id / "report" / "0" / "meta" / "1.out").read_text()
    assert out.split("\n") == ["[]", f"REFUTED {model_token}"], out
    assert len(srv.seen) == 1 and "spend" not in json.dumps(srv.seen[0].body)
    transcript = (root / "home" / "runs" / run_id / "judge" / "0" / "meta" / "1" / "transcript.jsonl")
    events = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [e["event"] for e in events] == ["call_started", "model_call", "finish"]
    assert events[-1]["result"] == f"REFUTED {model_token}"
    # It reached nothing else that answers like a broker, by any way it tried.
    assert _broker_answers(report, decoy) == []


def _start_local_user_attack(scope: str, marker: str) -> subprocess.Popen[str]:
    """The attacker as an unprivileged local user; returns once it has sent its requests."""
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to act as another local user"
    proc = subprocess.Popen(
        [setpriv, f"--reuid={LOCAL_UID}", f"--regid={LOCAL_UID}", "--clear-groups",
         "/usr/bin/python3", "-I", "-S", "-", scope, marker],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(ATTACKER.read_text())
    proc.stdin.close()
    line = proc.stdout.readline()
    assert line == "sent\n", (line, proc.stderr.read() if proc.stderr else "")
    return proc


def _report(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()  # its stderr stays small
    assert proc.wait(300) == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


# Playing another local user takes root: the test exists only then (a skip
# would fail CI's strict run), as tests/sandbox/test_root_engine.py does.
if os.geteuid() == 0:

    @pytest.mark.parametrize("launch", jail_backends())
    def test_local_user_cannot_find_or_forge_the_broker(launch: str, short_tmp: Path, scope: str, decoy: Decoy) -> None:
        marker, model_token = secrets.token_hex(8), secrets.token_hex(6)
        attackers: list[subprocess.Popen[str]] = []

        def respond(seen: Seen, n: int) -> Turn:
            if not attackers:  # the agent waits on this answer while the hunt runs
                attackers.append(_start_local_user_attack(scope, marker))
            return say(f"REFUTED {model_token}")

        with ModelServer(respond) as srv:
            r = _run(_workflow(short_tmp, model_token), short_tmp, scope, srv, launch)
        (attacker,) = attackers
        report = _report(attacker)
        assert report["uid"] == LOCAL_UID and report["euid"] == LOCAL_UID
        _check(r, short_tmp, scope, srv, report, marker, model_token, decoy)
        # It saw the run's processes, the agent's jail among them; no command line
        # there names a runtime path (the jail's is the interpreter and a program).
        jails = _jail_argvs(report)
        assert jails, report["in_scope"]
        for argv in jails:
            assert not any("/" in a for a in argv[1:]), argv


@pytest.mark.parametrize("launch", jail_backends())
def test_sibling_step_cannot_forge_the_verdict(launch: str, short_tmp: Path, scope: str, decoy: Decoy) -> None:
    marker, model_token = secrets.token_hex(8), secrets.token_hex(6)
    gate = socket.create_server(("127.0.0.1", 0))
    gate.settimeout(300)
    conns: list[socket.socket] = []

    def respond(seen: Seen, n: int) -> Turn:
        if not conns:  # the agent waits on this answer while the sibling hunts
            conn, _ = gate.accept()
            conns.append(conn)
            conn.settimeout(300)
            conn.sendall(f"go {marker}\n".encode())
            assert conn.recv(5) == b"sent\n"
        return say(f"REFUTED {model_token}")

    workflow = _workflow(short_tmp, model_token, attack=(scope, gate.getsockname()[1]))
    try:
        with ModelServer(respond) as srv:
            r = _run(workflow, short_tmp, scope, srv, launch)
        (conn,) = conns
        data = b""
        while chunk := conn.recv(1 << 16):
            data += chunk
        conn.close()
    finally:
        gate.close()
    report = json.loads(data)
    _check(r, short_tmp, scope, srv, report, marker, model_token, decoy)
    if launch.startswith("landlock"):
        # Same host view: it saw the agent's jail and the engine.
        jails = _jail_argvs(report)
        assert jails, report["in_scope"]
        for argv in jails:
            assert not any("/" in a for a in argv[1:]), argv
