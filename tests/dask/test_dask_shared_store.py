"""Two engines on two roots share one PostgreSQL store and one Dask cluster."""

from __future__ import annotations

import json
from pathlib import Path

import daskcluster
import pytest

from tests.integration.conftest import Project

pytestmark = pytest.mark.postgres

WORKFLOW = """\
name: shared
vars:
  who: ""
steps:
  - id: fan
    for_each: [1, 2, 3, 4, 5, 6]
    run: echo "{{ vars.who }} $STOCKADE_ITEM_KEY" > out/x.txt; sleep 1
  - id: publish
    needs: [fan]
    publish:
      to: "{{ vars.sink }}"
      key: "{{ vars.who }}"
      payload: "{{ steps.fan.result }}"
"""


def test_two_engines_share_a_postgres_store_and_a_cluster(
        dask_cluster: daskcluster.Cluster, pg_url: str, tmp_path: Path) -> None:
    sink = f"sqlite:///{tmp_path / 'sink.db'}?table=results"
    engines = []
    for who in ("east", "west"):
        p = Project(tmp_path / f"engine {who}")
        p.path.mkdir()
        p.root = p.path / ".stockade"
        p.env.update(STOCKADE_HOME=str(p.root), STOCKADE_STORE=pg_url)
        p.env.pop("STOCKADE_SANDBOX", None)
        # One workflow name each: the same name would share one publish lease,
        # and whichever run started first would be fenced if it published last.
        p.write("wf.yaml", WORKFLOW.replace("name: shared", f"name: shared-{who}")
                .replace('  who: ""', f'  who: ""\n  sink: "{sink}"'))
        engines.append((who, p, p.popen("run", "wf.yaml", "--executor", dask_cluster.url,
                                        "--var", f"who={who}", "--json")))
    runs = {}
    for who, _p, proc in engines:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        runs[who] = json.loads(out)["run_id"]
    # Either engine sees both runs in the shared store, finished, with their workers.
    for _, p, _ in engines:
        listed = {r["run_id"]: r for r in p.run("runs", "--json").json()}
        assert {runs["east"], runs["west"]} <= set(listed)
        assert all(listed[r]["status"] == "succeeded" for r in runs.values())
    east = engines[0][1]
    for run_id in runs.values():
        prov = east.provenance(run_id, "fan/1")
        assert prov["worker"]["name"] in ("w1", "w2")
        assert prov["run_id"] == run_id
        shown = east.run("show", run_id, "publish/0", "--json")
        assert shown.code == 0, shown.err
    import sqlite3

    with sqlite3.connect(tmp_path / "sink.db") as c:
        rows = dict(c.execute("SELECT key, run_id FROM results").fetchall())
    assert rows == {"east": runs["east"], "west": runs["west"]}
