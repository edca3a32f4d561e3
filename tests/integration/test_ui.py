"""``stockade ui`` serves runs over real HTTP on loopback."""

from __future__ import annotations

import threading

import httpx

from stockade.store.sqlite import SQLiteStore
from stockade.web.server import make_server
from tests.integration.conftest import Project


def test_ui_lists_runs_and_items(project: Project) -> None:
    wf = project.write("wf.yaml", "name: ui\nsteps:\n  - id: a\n    run: echo hi > out/x.txt\n")
    assert project.run("run", str(wf), "--run-id", "u1").code == 0
    server = make_server(lambda: SQLiteStore(project.root / "stockade.db"), "127.0.0.1", 0)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        page = httpx.get(base + "/")
        assert page.status_code == 200 and "stockade runs" in page.text
        runs = httpx.get(base + "/api/runs").json()
        assert [r["run_id"] for r in runs] == ["u1"]
        detail = httpx.get(base + "/api/runs/u1").json()
        assert detail["items"][0]["outputs"][0]["name"] == "x.txt"
        assert httpx.get(base + "/api/runs/nope").status_code == 404
        assert httpx.get(base + "/api/runs/../etc").status_code == 404
    finally:
        server.shutdown()
        server.server_close()
