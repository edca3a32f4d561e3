"""A gather step that fetches data through the allowlist, end to end."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.integration.conftest import Project


class _Data(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"regions": ["north", "south"]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Data)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_gather_fetches_through_the_allowlist_and_nothing_else(project: Project, server: int) -> None:
    wf = project.write("wf.yaml", f"""
        name: fetch
        steps:
          - id: gather
            network: ["127.0.0.1:{server}"]
            run: |
              echo "proxy=$HTTPS_PROXY" >&2
              curl -sf -v http://127.0.0.1:{server}/data.json > out/data.json
          - id: refused
            network: ["example.invalid"]
            run: curl -sf --max-time 5 http://127.0.0.1:{server}/data.json
          - id: by_name
            network: ["localhost:{server}"]
            run: curl -sf --max-time 5 http://localhost:{server}/data.json
          - id: offline
            run: curl -sf --max-time 5 http://localhost:{server}/data.json
          - id: use
            needs: [gather]
            for_each: "{{{{ (steps.gather.outputs['data.json'] | from_json).regions }}}}"
            run: echo {{{{ item }}}}
    """)
    r = project.run("run", str(wf), "--run-id", "n1", "--json")
    s = r.json()
    assert s["steps"]["gather"] == "succeeded", r.err
    assert s["steps"]["use"] == "succeeded"
    assert s["items"]["use"] == {"succeeded": 2}
    assert s["steps"]["refused"] == "failed"
    assert s["steps"]["by_name"] == "failed"
    assert s["steps"]["offline"] == "failed"
    log = project.item("n1", "gather") / "meta" / "1.network.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(e.get("allowed") is True for e in entries), entries
    refused = project.item("n1", "refused") / "meta" / "1.network.jsonl"
    assert any(json.loads(line).get("allowed") is False for line in refused.read_text().splitlines())
    by_name = project.item("n1", "by_name") / "meta" / "1.network.jsonl"
    (entry,) = [json.loads(line) for line in by_name.read_text().splitlines()]
    assert entry["allowed"] is False and entry["reason"].startswith("resolves to loopback")
    # The per-item proxy credential is masked in the captures, in both forms.
    stderr = (log.parent / "1.err").read_text()
    assert "proxy=http://stockade:********@127.0.0.1:" in stderr, stderr
    assert "Proxy-Authorization: Basic ********" in stderr, stderr
    assert not re.search(r"stockade:[0-9a-f]{32}", stderr + log.read_text())
