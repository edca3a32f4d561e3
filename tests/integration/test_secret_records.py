"""No secret value in any record: a workflow tries every way to get one recorded.

The secret is composed at run time. After the run every file name and every
byte under the root (the run tree, the manifest, provenance, logs, the SQLite
store) and every CLI view (``show --json``, ``runs --json``, ``why``, ``logs``)
are searched for it. Only the bytes a step deliberately wrote into an output
file may hold it (outputs are data: ``list`` writes one).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from tests.integration.conftest import Project


def _leaks(root: Path, needle: bytes, data: tuple[Path, ...] = ()) -> list[str]:
    """Names and contents under ``root`` holding ``needle`` (contents of ``data`` files aside)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if needle.decode() in name:
                found.append(f"name: {os.path.join(dirpath, name)}")
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or Path(path) in data:
                continue
            try:
                with open(path, "rb") as f:
                    if needle in f.read():
                        found.append(f"content: {path}")
            except OSError:
                pass
    return found


def test_no_record_or_view_holds_a_secret(project: Project) -> None:
    token = "tok-" + secrets.token_hex(12)
    wf = project.write("wf.yaml", """
        name: leaky
        secrets: [API_TOKEN]
        vars: {day: "2026-01-01"}
        steps:
          - id: speak
            secrets: [API_TOKEN]
            run: |
              echo "stdout $API_TOKEN"
              echo "stderr $API_TOKEN" >&2
              echo fine > out/ok.txt
          - id: name
            secrets: [API_TOKEN]
            run: echo x > "out/$API_TOKEN.txt"
          - id: fail
            secrets: [API_TOKEN]
            retries: 1
            retry_delay: 0
            run: echo "failing with $API_TOKEN" >&2; exit 3
          - id: list
            secrets: [API_TOKEN]
            run: printf '["a", "%s"]' "$API_TOKEN" > out/list.json
          - id: fan
            needs: [list]
            for_each: "{{ steps.list.outputs['list.json'] | from_json }}"
            run: "true"
          - id: net
            secrets: [API_TOKEN]
            network: ["127.0.0.1:9"]
            run: curl -s -m 10 "http://$API_TOKEN.example/$API_TOKEN" -o /dev/null || true
          - id: keyed
            needs: [speak]
            for_each: [1]
            inputs: {said.txt: "{{ steps.speak.result }}"}
            run: cat said.txt
    """)
    env = {"API_TOKEN": token}
    r = project.run("run", str(wf), "--run-id", "leak1", "--var", f"day={token}", env=env)
    assert r.code == 1
    # The jail really ran and really had the secret: the masked line is there.
    assert project.run("logs", "leak1", "speak").out == "stdout ********\n"
    assert "********" in project.run("logs", "leak1", "fail", "--stderr").out
    assert token not in r.out + r.err
    views = [
        project.run("show", "leak1", "--json", env=env),
        project.run("show", "leak1", "--all", env=env),
        project.run("show", "leak1", "fail", "--json", env=env),
        project.run("runs", "--json", env=env),
        project.run("why", "leak1", "keyed/1", "--json", env=env),
        project.run("logs", "leak1", "fail", "--stderr", env=env),
    ]
    for v in views:
        assert token not in v.out + v.err
    net_log = (project.item("leak1", "net") / "meta/1.network.jsonl").read_text()
    assert "********" in net_log and "not in allowlist" in net_log
    data = (project.item("leak1", "list") / "work/out/list.json",)
    assert token in data[0].read_text()
    leaks = _leaks(project.root, token.encode(), data)
    assert leaks == []
    # The output named after the secret was refused and removed, the key that
    # would have been the secret refused.
    show = project.run("show", "leak1", "--json").json()
    steps = {s["id"]: s for s in show["steps"]}
    assert "secret value" in steps["name"]["items"][0]["message"]
    assert "secret value" in steps["fan"]["items"][0]["message"]


def test_the_search_finds_a_secret_that_is_there(project: Project) -> None:
    """Positive control for ``_leaks``: an unmasked copy under the root is found."""
    token = "tok-" + secrets.token_hex(12)
    (project.root / "runs").mkdir(parents=True)
    (project.root / "runs" / "x.log").write_text(f"a {token} b")
    (project.root / f"named-{token}").mkdir()
    assert len(_leaks(project.root, token.encode())) == 2
