"""``stockade ui`` over real HTTP: the Host guard, the loopback bind, action tokens,
downloads checked against their recorded sha256, and what every route answers."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from stockade.store.sqlite import SQLiteStore
from tests.integration.conftest import Project
from tests.web.conftest import GATED, UIProcess, wait_for

VENDOR = Path(__file__).resolve().parents[2] / "src" / "stockade" / "web" / "static" / "vendor"


def raw_get(port: int, host: str | None, path: str = "/", version: str = "1.1",
            extra: str = "") -> tuple[int, str]:
    """A GET written by hand, so the Host header is exactly what the test says."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = f"GET {path} HTTP/{version}\r\n"
        if host is not None:
            head += f"Host: {host}\r\n"
        s.sendall((head + extra + "Connection: close\r\n\r\n").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.decode("utf-8", errors="replace")


@pytest.fixture
def finished(project: Project) -> str:
    wf = project.write("wf.yaml", """\
        name: web
        steps:
          - id: make
            for_each: [one, two]
            run: |
              head -c 4096 /dev/urandom > out/blob.bin
              mkdir -p out/sub && echo "$STOCKADE_ITEM_KEY" > out/sub/key.txt
          - id: use
            needs: [make]
            inputs:
              blob.bin: "{{ steps.make.items[0].outputs['blob.bin'] }}"
            run: sha256sum blob.bin > out/sum.txt
        """)
    assert project.run("run", str(wf), "--run-id", "webrun1").code == 0
    return "webrun1"


def test_foreign_host_is_refused(project: Project, finished: str, start_ui: object) -> None:
    ui: UIProcess = start_ui()  # type: ignore[operator]
    port = ui.port
    # Positive control: the names of this server get the page.
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
        status, body = raw_get(port, host)
        assert status == 200 and "Runs" in body, host
    # A page a rebound DNS name serves, another port, no port, no Host at all.
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}", "127.0.0.1",
                 f"127.0.0.1.evil.example:{port}", f"localhost:{port}@evil.example"):
        status, body = raw_get(port, host)
        assert status == 421, host
        assert "answers only to" in body and "webrun1" not in body
    assert raw_get(port, None, version="1.0")[0] == 421
    # Every route is behind the guard, the event streams and files included.
    for path in ("/api/runs", f"/runs/{finished}", f"/live/runs/{finished}",
                 f"/runs/{finished}/make/one/files/out/blob.bin", "/static/app.js"):
        assert raw_get(port, f"evil.example:{port}", path)[0] == 421, path
        assert raw_get(port, f"127.0.0.1:{port}", path.replace("/live/", "/api/")
                       if path.startswith("/live/") else path)[0] == 200, path


def test_listens_on_loopback_only(project: Project, finished: str, start_ui: object) -> None:
    ui: UIProcess = start_ui()  # type: ignore[operator]
    out = subprocess.run(["ss", "-Hltn", f"sport = :{ui.port}"], capture_output=True, text=True)
    listening = [line.split()[3] for line in out.stdout.splitlines() if line.strip()]
    assert listening == [f"127.0.0.1:{ui.port}"], out.stdout
    # Other addresses of this machine do not answer (positive control: loopback does).
    others = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    others |= set(re.findall(r"inet (\d+\.\d+\.\d+\.\d+)", subprocess.run(
        ["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout))
    for addr in sorted(a for a in others if not a.startswith("127.")):
        with pytest.raises(OSError):
            socket.create_connection((addr, ui.port), timeout=5).close()
    assert ui.get("/").status_code == 200


def test_port_in_use_is_one_message(project: Project, finished: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        r = project.run("ui", "--port", str(s.getsockname()[1]), timeout=60)
    assert r.code == 2 and "is in use" in r.err and "--port 0" in r.err and "Traceback" not in r.err


def test_ui_refuses_an_empty_root(project: Project) -> None:
    r = project.run("ui", "--port", "0", timeout=60)
    assert r.code == 2 and "no runs under" in r.err


def test_every_page_and_route_answers(project: Project, finished: str, start_ui: object) -> None:
    ui: UIProcess = start_ui()  # type: ignore[operator]
    for path, marker in [
        ("/", "webrun1"), ("/?status=succeeded", "webrun1"), ("/?workflow=nope", "no runs match"),
        ("/runs/webrun1", 'id="dag"'), ("/runs/webrun1/make", "two"),
        ("/runs/webrun1/make?filter=failed", "no items here"), ("/runs/webrun1/make?page=9", "page 1 of"),
        ("/runs/webrun1/make/two", "out/sub/key.txt"), ("/runs/webrun1/make/%231", "make/two"),
        ("/runs/webrun1/use/0", "blob.bin"),
    ]:
        r = ui.get(path)
        assert r.status_code == 200, path
        assert marker in r.text, path
        assert "default-src 'self'" in r.headers["content-security-policy"]
    assert 'id="run-resumes"' not in ui.get("/runs/webrun1").text  # never resumed
    assert 'id="warnings"' not in ui.get("/runs/webrun1").text  # its workflow had none
    # A prefix of the run id leads to the run's own URL.
    r = ui.get("/runs/webr", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/runs/webrun1"
    for path, status in [("/runs/nope", 404), ("/runs/webrun1/nope", 404), ("/runs/webrun1/make/nope", 404),
                         ("/runs/webrun1/make?filter=bogus", 400), ("/runs/webrun1/make/one/log/1/passwd", 404)]:
        assert ui.get(path).status_code == status, path
    runs = ui.get("/api/runs").json()
    assert [(r["run_id"], r["status"], r["done"], r["total"]) for r in runs] == [("webrun1", "succeeded", 3, 3)]
    run = ui.get("/api/runs/webrun1").json()
    assert [(s["id"], s["done"], s["total"]) for s in run["steps"]] == [("make", 2, 2), ("use", 1, 1)]
    tl = ui.get("/api/runs/webrun1/timeline").json()
    assert tl["steps"] == ["make", "use"] and tl["spans"]["s"] == [0, 0, 1]
    silent = ui.get("/runs/webrun1/make/one/log/1/stdout")  # printed nothing: no capture file
    assert silent.status_code == 200 and silent.text == ""
    assert silent.headers["x-content-type-options"] == "nosniff"
    assert ui.get("/runs/webrun1/make/one/log/9/stdout").status_code == 404  # never ran
    # The vendored layout library is the file its README names.
    line = next(x for x in (VENDOR / "README.md").read_text().splitlines() if "dagre.min.js" in x)
    want = re.findall(r"`([0-9a-f]{64})`", line)[0]
    served = ui.get("/static/vendor/dagre.min.js").content
    assert hashlib.sha256(served).hexdigest() == want


def test_a_runs_workflow_warnings_are_on_its_page(project: Project, start_ui: object) -> None:
    project.write("wf.yaml", """\
        name: warned
        steps:
          - id: s
            run: echo "{{ run.id }}"
        """)
    assert project.run("run", "wf.yaml", "--run-id", "warned1").code == 0
    ui: UIProcess = start_ui()  # type: ignore[operator]
    page = ui.get("/runs/warned1").text
    assert 'id="warnings"' in page
    assert "wf.yaml:4:16: warning: step &#39;s&#39;: {{ run.id }} is inside" in page


def test_downloads_are_the_recorded_bytes(project: Project, finished: str, start_ui: object) -> None:
    ui: UIProcess = start_ui()  # type: ignore[operator]
    store = SQLiteStore(project.root / "stockade.db")
    try:
        recorded = {(o.step, o.item, o.name): o.sha256
                    for i in store.items(finished) for o in i.outputs}
    finally:
        store.close()
    for (step, item, name), sha in recorded.items():
        r = ui.get(f"/runs/{finished}/{step}/%23{item}/files/out/{name}")
        assert r.status_code == 200, name
        assert hashlib.sha256(r.content).hexdigest() == sha
        assert r.headers["content-disposition"].startswith("attachment")
        assert r.headers["x-stockade-sha256"] == sha
    # An input: the bytes written into the item's world, as its provenance records them.
    prov = project.provenance(finished, "use")
    [inp] = prov["inputs"]
    r = ui.get(f"/runs/{finished}/use/0/files/in/blob.bin?attempt=1")
    assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == inp["sha256"]
    # Names that are no output of the item, or walk out of out/, are not served.
    for name in ("nope.bin", "../../meta/1.out", "..%2F..%2Fmeta%2F1.out",
                 "../1.out", "sub", "%2e%2e/%2e%2e/meta/1.out"):
        status, body = raw_get(ui.port, f"127.0.0.1:{ui.port}",
                               f"/runs/{finished}/make/one/files/out/{name}")
        assert status == 404, name
        assert "no output" in body
    # A file changed after it was recorded is refused, never served as the recorded one.
    blob = project.item(finished, "make", 1) / "work" / "out" / "blob.bin"
    blob.write_bytes(b"tampered")
    r = ui.get(f"/runs/{finished}/make/two/files/out/blob.bin")
    assert r.status_code == 409 and "changed since it was recorded" in r.text
    # A symlink planted in its place is not followed (the target would hash right).
    target = project.path / "elsewhere.bin"
    key = project.item(finished, "make", 1) / "work" / "out" / "sub" / "key.txt"
    target.write_bytes(key.read_bytes())
    key.unlink()
    os.symlink(target, key)
    r = ui.get(f"/runs/{finished}/make/two/files/out/sub/key.txt")
    assert r.status_code == 409 and "symlink" in r.text.lower()


def test_actions_need_the_servers_token(project: Project, start_ui: object) -> None:
    wf = project.write("wf.yaml", GATED)
    proc = project.popen("run", str(wf), "--run-id", "act1", "--jobs", "3")
    try:
        wait_for(lambda: (project.item("act1", "gate", 2) / "work").is_dir(), "the gated items")
        readonly: UIProcess = start_ui()  # type: ignore[operator]
        assert readonly.token("/runs/act1") == ""
        assert "data-action" not in readonly.get("/runs/act1").text
        ui: UIProcess = start_ui("--allow-actions")  # type: ignore[operator]
        token = ui.token("/runs/act1")
        assert len(token) >= 24 and token != readonly.token()
        url = ui.url + "/actions/cancel/act1"
        wrong = secrets.token_urlsafe(24)
        for headers in ({}, {"X-Stockade-Token": ""}, {"X-Stockade-Token": wrong}):
            r = httpx.post(url, headers=headers, timeout=30)
            assert r.status_code == 403 and r.json()["ok"] is False
        # The right token from another origin (a page elsewhere) is refused too.
        r = httpx.post(url, headers={"X-Stockade-Token": token, "Origin": "http://evil.example"},
                       timeout=30)
        assert r.status_code == 403 and "cross-origin" in r.json()["error"]
        # The read-only server refuses even its own page's (absent) token.
        r = httpx.post(readonly.url + "/actions/cancel/act1",
                       headers={"X-Stockade-Token": token}, timeout=30)
        assert r.status_code == 403 and "--allow-actions" in r.json()["error"]
        assert proc.poll() is None, "a refused cancel must leave the run running"
        r = httpx.post(url, headers={"X-Stockade-Token": token,
                                     "Origin": f"http://127.0.0.1:{ui.port}"}, timeout=30)
        assert r.status_code == 202, r.text
        assert proc.wait(60) == 130
        assert ui.get("/api/runs/act1").json()["run"]["status"] == "interrupted"
        # Resume with the token: the run goes on (attempt 2 does not wait) and succeeds.
        r = httpx.post(ui.url + "/actions/resume/act1", headers={"X-Stockade-Token": token},
                       timeout=30)
        assert r.status_code == 202, r.text
        wait_for(lambda: ui.get("/api/runs/act1").json()["run"]["status"] == "succeeded",
                 "the resumed run to succeed", timeout=120)
        assert '<dd id="run-resumes"' in ui.get("/runs/act1").text
        assert ">once</dd>" in ui.get("/runs/act1").text
        r = httpx.post(ui.url + "/actions/resume/act1", headers={"X-Stockade-Token": token},
                       timeout=30)
        assert r.status_code == 409 and "nothing to resume" in r.json()["error"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
