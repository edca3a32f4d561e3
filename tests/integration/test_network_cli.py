"""A gather step that fetches data through the allowlist, end to end."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Project
from tests.loopback_http import serve


@pytest.fixture
def server() -> Iterator[int]:
    with serve(b'{"regions": ["north", "south"]}') as served:
        yield served.port


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
    # A step sees only "403"; its failure says what the proxy refused, and why.
    assert any(p.startswith("by_name/0: failed: exit status ") and p.endswith(
        f"; the network proxy refused localhost:{server} (resolves to loopback address "
        "127.0.0.1)") for p in s["problems"]), s["problems"]
    assert any(p.startswith("refused/0: failed: exit status ") and p.endswith(
        f"; the network proxy refused 127.0.0.1:{server} (not in allowlist)")
        for p in s["problems"]), s["problems"]
    assert not any("proxy" in p for p in s["problems"] if p.startswith("offline/"))
    # The per-item proxy credential is masked in the captures, in both forms.
    stderr = (log.parent / "1.err").read_text()
    assert "proxy=http://stockade:********@127.0.0.1:" in stderr, stderr
    assert "Proxy-Authorization: Basic ********" in stderr, stderr
    assert not re.search(r"stockade:[0-9a-f]{32}", stderr + log.read_text())


def test_landlock_without_a_network_namespace_says_so(server: int) -> None:
    """An engine that cannot make network namespaces (an ordinary user, or
    root without CAP_SYS_ADMIN as in most containers: reproduced here with
    ``setpriv``) runs ``network: [...]`` on the host's network stack, where
    the allowlist binds only clients that use the proxy. It says so in
    ``doctor`` (text and JSON), when such a step starts, and in the manifest;
    the allowlisted request still works."""
    from stockade.sandbox import get_backend

    if not get_backend("landlock").availability().available:
        pytest.skip("landlock is not available here")
    # World-searchable: root without CAP_SYS_ADMIN cannot make the bridge
    # mounts a private folder would need.
    base = Path(tempfile.mkdtemp(prefix="stockade-nonetns-", dir="/tmp"))
    try:
        base.chmod(0o755)
        (base / "tmp").mkdir(mode=0o755)
        project = Project(base / "project")
        project.env.update(STOCKADE_SANDBOX="landlock", TMPDIR=str(base / "tmp"))
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            assert setpriv, "setpriv (util-linux) is needed to drop CAP_SYS_ADMIN"
            drop = [setpriv, "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]
            plain = project.cmd
            project.cmd = lambda *args: [*drop, *plain(*args)]  # type: ignore[method-assign]
        wf = project.write("wf.yaml", f"""
            name: gap
            steps:
              - id: gather
                network: ["127.0.0.1:{server}"]
                run: curl -sf http://127.0.0.1:{server}/data.json > out/data.json
        """)
        doctor = project.run("doctor", "--json")
        assert doctor.code == 0, doctor.err
        report = doctor.json()
        assert report["active"] == "landlock" and report["enforced"] is True, report
        said = "network: proxy runs on the host's network stack"
        assert any(line.startswith(said) for line in report["limitations"]), report
        text = project.run("doctor")
        assert said in " ".join(text.out.split()), text.out
        r = project.run("run", str(wf), "--run-id", "g1")
        assert r.code == 0, r.err
        assert "gather: network: the allowlist binds only clients that use the proxy" in " ".join(
            (r.out + r.err).split()
        ), r.out + r.err
        manifest = json.loads((project.root / "runs" / "g1" / "manifest.json").read_text())
        assert any(line.startswith(said) for line in manifest["sandbox"]["limitations"])
        assert json.loads((project.item("g1", "gather") / "work" / "out" / "data.json").read_text())
    finally:
        shutil.rmtree(base, ignore_errors=True)
