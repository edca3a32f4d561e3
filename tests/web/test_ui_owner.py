"""``stockade ui`` serves only the user who started it: requests from another local
user (``nobody``, over real loopback connections) are refused, pages, logs,
files, event streams and actions alike, while the same requests from the
server's own user are served."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from typing import Any

import pytest

from stockade.web.owner import netlink_uid, peer_uid
from tests.integration.conftest import Project
from tests.nobody import AS_NOBODY, need_nobody
from tests.web.conftest import UIProcess, wait_for

#: One request per connection with the standard library only (``nobody`` cannot
#: import the checkout's packages): status, headers, and the body, or an event
#: stream's first bytes. A list of requests in one entry goes over one connection.
CLIENT = r"""
import http.client, json, sys
port, batches = json.load(sys.stdin)
out = []
for batch in batches:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for method, path, headers in batch:
        c.request(method, path, headers=headers)
        r = c.getresponse()
        stream = (r.getheader("content-type") or "").startswith("text/event-stream")
        body = r.read1(65536) if stream else r.read()
        out.append({"path": path, "status": r.status, "headers": dict(r.getheaders()),
                    "body": body.decode("utf-8", "replace")})
        if stream:
            break
    c.close()
print(json.dumps(out))
"""

SECRET = "secret-stderr-5b1f"


def requests(port: int, batches: list[list[tuple[str, str, dict[str, str]]]],
             as_nobody: bool) -> list[dict[str, Any]]:
    argv = [*(AS_NOBODY if as_nobody else []), "/usr/bin/python3", "-I", "-c", CLIENT]
    r = subprocess.run(argv, input=json.dumps([port, batches]), capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    out: list[dict[str, Any]] = json.loads(r.stdout)
    return out


@pytest.fixture
def failed_run(project: Project) -> str:
    project.write("wf.yaml", f"""\
        name: private
        steps:
          - id: make
            run: |
              echo "{SECRET}" >&2
              echo data > out/x.txt
          - id: boom
            needs: [make]
            run: exit 3
        """)
    assert project.run("run", "wf.yaml", "--run-id", "priv1").code != 0
    return "priv1"


def test_another_user_is_refused_everything(project: Project, failed_run: str,
                                            start_ui: Any) -> None:
    need_nobody()
    if os.geteuid() != 0:
        pytest.skip("needs root to make requests as another user (nobody)")
    run = failed_run
    # The threat: the log is not readable by nobody on disk, only through the server.
    log = project.item(run, "make", 0) / "meta" / "1.err"
    assert SECRET in log.read_text()
    assert subprocess.run([*AS_NOBODY, "cat", str(log)], capture_output=True).returncode != 0

    ui: UIProcess = start_ui("--allow-actions")
    token = ui.token(f"/runs/{run}")
    assert token
    origin = {"Origin": f"http://127.0.0.1:{ui.port}"}
    host = {"Host": f"127.0.0.1:{ui.port}"}
    gets = ["/", f"/runs/{run}", f"/runs/{run}/make", f"/runs/{run}/make/0",
            f"/runs/{run}/make/0/log/1/stderr", f"/runs/{run}/make/0/files/out/x.txt",
            "/api/runs", f"/api/runs/{run}", "/static/app.js",
            "/live/runs", f"/live/runs/{run}", f"/live/runs/{run}/make",
            f"/live/runs/{run}/make/0?logs=1:stderr:0"]
    batches = [[("GET", p, host)] for p in gets]
    resume = ("POST", f"/actions/resume/{run}", {**host, **origin, "X-Stockade-Token": token})
    cancel = ("POST", f"/actions/cancel/{run}", {**host, **origin, "X-Stockade-Token": token})

    refused = requests(ui.port, [*batches, [resume], [cancel]], as_nobody=True)
    assert len(refused) == len(gets) + 2
    for r in refused:
        assert r["status"] == 403, r
        assert r["body"] == ("this stockade ui serves only uid 0 (root), the user who started "
                             "it; this connection is from uid 65534 (nobody): start your own "
                             "with `stockade ui`\n"), r
        assert r["headers"].get("connection") == "close"
    assert not (project.root / "runs" / run / "ui-resume.log").exists()
    # A second request on a refused connection is not served either: it is closed.
    assert requests(ui.port, [[("GET", "/", host), ("GET", "/", host)]],
                    as_nobody=True)[0]["status"] == 403

    # The same requests from the server's own user are served, several on one
    # connection (the uid is read once per connection).
    served = requests(ui.port, [[("GET", p, host) for p in gets[:9]], *batches[9:]],
                      as_nobody=False)
    assert [r["status"] for r in served] == [200] * len(gets), served
    by_path = {r["path"]: r for r in served}
    assert SECRET in by_path[f"/runs/{run}/make/0/log/1/stderr"]["body"]
    assert by_path[f"/runs/{run}/make/0/files/out/x.txt"]["body"] == "data\n"
    for p in gets[9:]:
        assert by_path[p]["headers"]["content-type"].startswith("text/event-stream")
        assert by_path[p]["body"].startswith("retry:"), by_path[p]
    [done] = requests(ui.port, [[resume]], as_nobody=False)
    assert done["status"] == 202, done
    # Let the resumed run end (it fails again) so nothing outlives the test.
    # The startup line says who may connect.
    assert "for uid 0 (root) only" in ui.log.read_text()
    resumed = project.root / "runs" / run / "ui-resume.log"
    wait_for(lambda: resumed.exists() and f"run {run} failed" in resumed.read_text(),
             "the resumed run to end", timeout=120)


HOLD = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


def test_both_lookups_name_another_users_socket() -> None:
    """netlink and /proc/net/tcp each name nobody as the owner of nobody's connection."""
    need_nobody()
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another user (nobody)")
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(1)
    proc = subprocess.Popen([*AS_NOBODY, "/usr/bin/python3", "-I", "-c", HOLD,
                             str(lsn.getsockname()[1])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        srv, peer = lsn.accept()
        assert proc.stdout is not None and int(proc.stdout.readline()) == peer[1]
        here = srv.getsockname()
        assert netlink_uid(peer, here) == 65534
        assert peer_uid(peer, here, netlink=False) == 65534
        assert peer_uid(peer, here) == 65534
        srv.close()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)
        lsn.close()
