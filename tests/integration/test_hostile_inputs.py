"""Hostile inputs through the real CLI: a symlinked checkout folder, forged provenance.

Each runs under every backend the ``project`` fixture gives (bwrap by default,
and landlock). Markers and canaries are composed at run time.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
from pathlib import Path

from stockade.publish import PublishRequest, publish
from stockade.store import open_store
from tests.integration.conftest import Project
from tests.publish.legacy_provenance import legacy_check_provenance


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _all_bytes(root: Path) -> bytes:
    """Every byte the run left under ``root``: records, the store, copies, captures."""
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink())


def test_tree_copies_no_file_through_a_folder_swapped_for_a_symlink(project: Project) -> None:
    canary = "canary-" + secrets.token_hex(16)
    marker = "marker-" + secrets.token_hex(16)
    # A root-only folder outside the checkout, holding what the attacker wants.
    vault = project.path / "vault"
    vault.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(vault, 0, 0)
    (vault / "settings.txt").write_text(canary)
    (vault / "settings.txt").chmod(0o600)
    co = project.path / "checkout"
    (co / "cfg").mkdir(parents=True)
    (co / "docs").mkdir()
    (co / "cfg" / "settings.txt").write_text("harmless\n")
    (co / "docs" / "readme.txt").write_text(marker)
    _git(co, "init", "-q")
    _git(co, "add", ".")
    _git(co, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")
    # The attack: the tracked folder cfg/ becomes a symlink to the vault.
    shutil.rmtree(co / "cfg")
    (co / "cfg").symlink_to(vault)
    # Positive control: a copy that follows links (the old path-based check
    # passed cfg/settings.txt: only its last component was tested) gets the canary.
    naive = project.path / "naive"
    shutil.copytree(co, naive)
    assert (naive / "cfg" / "settings.txt").read_text() == canary
    old_check = co / "cfg" / "settings.txt"
    assert not old_check.is_symlink() and old_check.is_file()
    shutil.rmtree(naive)

    wf = project.write("wf.yaml", """
        name: hostile-tree
        steps:
          - id: look
            inputs:
              repo: "{{ tree('checkout') }}"
            run: |
              cat repo/docs/readme.txt; echo
              cat repo/cfg/settings.txt || echo "no cfg/settings.txt"
              find repo | sort
    """)
    r = project.run("run", str(wf), "--run-id", "t1")
    assert r.code == 0, r.err
    seen = (project.item("t1", "look") / "meta/1.out").read_text()
    assert marker in seen, seen  # the jail ran, with the tree
    assert "no cfg/settings.txt" in seen and "repo/cfg" not in seen
    assert canary not in seen + r.out + r.err
    assert canary.encode() not in _all_bytes(project.root)
    # The run says what it refused, on stderr, in the manifest and in the item's provenance.
    refusal = "cfg/settings.txt (cfg is a symlink, not a folder)"
    assert "warning: tree('checkout'): 1 tracked path not copied" in r.err and refusal in r.err
    manifest = json.loads((project.root / "runs/t1/manifest.json").read_text())
    why = [{"path": "cfg/settings.txt", "why": "cfg is a symlink, not a folder"}]
    assert manifest["input_refused"] == {"tree:checkout": why}
    prov = project.provenance("t1", "look")
    assert [i["source"].get("refused") for i in prov["inputs"]] == [why]


FORGE = """
name: forge
steps:
  - id: make
    run: printf '%s' "{{ vars.mark }}" > out/report.txt
  - id: forge
    needs: [make]
    inputs:
      report.txt: "{{ steps.make.outputs['report.txt'] }}"
    run: |
      sha=$(sha256sum report.txt | cut -d' ' -f1)
      size=$(wc -c < report.txt)
      ref() {
        printf '{"$artifact": {"run_id": "%s", "step": "%s", "item": 0, "attempt": 1, "name": "report.txt", "sha256": "%s", "size": %s}, "text": "%s"}' "$1" "$2" "$sha" "$size" "$3"
      }
      printf '[%s, %s, %s]' \
        "$(ref "$STOCKADE_RUN_ID" make forged-text)" \
        "$(ref "$STOCKADE_RUN_ID" ghost "$(cat report.txt)")" \
        "$(ref other-run make "$(cat report.txt)")"
  - id: forged
    needs: [forge]
    for_each: "{{ from_json(steps.forge.result) }}"
    retries: 2
    publish:
      to: sqlite:///pub.db?table=reports
      key: "forged-{{ item['$artifact'].step }}-{{ item['$artifact'].run_id }}"
      payload:
        report: "{{ item }}"
  - id: genuine
    needs: [make]
    publish:
      to: sqlite:///pub.db?table=reports
      key: genuine
      payload:
        report: "{{ steps.make.outputs['report.txt'] }}"
"""


def test_forged_artifact_references_in_step_output_publish_nothing(project: Project) -> None:
    mark = "mark-" + secrets.token_hex(16)
    wf = project.write("wf.yaml", FORGE.replace("{{ vars.mark }}", mark))
    r = project.run("run", str(wf), "--run-id", "f1")
    assert r.code == 1, r.err
    sha = hashlib.sha256(mark.encode()).hexdigest()
    forged = json.loads((project.item("f1", "forge") / "meta/1.out").read_text())
    assert [f["$artifact"]["sha256"] for f in forged] == [sha] * 3  # the step saw the real hash

    # Only the genuine reference was published, with its real content.
    with sqlite3.connect(project.path / "pub.db") as db:
        rows = list(db.execute("SELECT key, payload, run_id FROM reports"))
    assert [(k, rid) for k, _, rid in rows] == [("genuine", "f1")]
    assert json.loads(rows[0][1]) == {"report": {"$artifact": {
        "run_id": "f1", "step": "make", "item": 0, "attempt": 1, "name": "report.txt",
        "sha256": sha, "size": len(mark)}, "text": mark}}
    # Each forged item is refused with the reason, once: a refusal is not retried.
    for i in range(3):
        shown = project.run("show", "f1", f"forged/#{i}", "--json").json()
        assert [a["attempt"] for a in shown["attempts"]] == [1]
        [line] = [ln for ln in r.err.splitlines() if f"forged/{i}: errored (attempt 1)" in ln]
        assert "wf.yaml:25:9: refused: payload[\"report\"] holds the key '$artifact' in data" in line

    # Positive control: the old check accepted the first two forgeries (this
    # run's id with a real hash but other text; a step that does not exist)
    # against this very run's records; it caught only another run's id. The
    # new check refuses all three on its own, even past the runner's refusal.
    store = open_store(None, project.root)
    try:
        assert [legacy_check_provenance({"report": f}, "f1", store) for f in forged] == \
            [None, None, "foreign"]
        reasons = []
        for i, f in enumerate(forged):
            out = publish(PublishRequest(
                run_id="f1", step="forged", item=10 + i, attempt=1,
                to="sqlite:///pub.db?table=reports", base_dir=project.path, key=f"direct-{i}",
                payload={"report": f}, lease="forge.direct", lease_ttl=30.0, max_age=86400.0,
                run_started_at=store.get_run("f1").started_at,  # type: ignore[union-attr]
                allow_stale=False, input_fingerprint=""), store)
            assert out.status == "failed" and not out.retryable
            reasons.append(out.message)
    finally:
        store.close()
    assert "its text is not the artifact's content" in reasons[0]
    assert "run f1 has no step 'ghost' with outputs" in reasons[1]
    assert "from run other-run, not from this run f1" in reasons[2]
    with sqlite3.connect(project.path / "pub.db") as db:
        assert [k for (k,) in db.execute("SELECT key FROM reports")] == ["genuine"]
