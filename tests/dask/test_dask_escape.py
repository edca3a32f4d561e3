"""Escape attempts from an item running on a Dask worker, under every enforcing launcher.

(Rendered values are shell-quoted: the workflow never quotes a template again.)

An attacker item on a worker tries to read the engine's run tree (another
step's output, another item's input), to write into it, to list the
worker's scratch folder and to read a neighbour item's files there while
that neighbour runs. Under bwrap and landlock (each launcher) every attempt
fails and a marker the test composed at run time proves the jail ran; the
positive control runs the same workflow with ``--sandbox none`` and every
attack succeeds.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import daskcluster
import pytest

from tests.agent.conftest import LAUNCHES, jail_backends
from tests.dask.conftest import _machine_folder
from tests.integration.conftest import Project

WORKFLOW = """\
name: escape
vars:
  token: ""
  canary: ""
  neighbour: ""
  root: ""
  machines: ""
  crowd: []
steps:
  - id: secret
    run: printf '%s' "{{ vars.canary }}" > out/canary.txt
  - id: side
    inputs:
      private.txt: "{{ vars.neighbour }}"
    run: "true"
  - id: crowd
    needs: [secret, side]
    key: "{{ item.role }}"
    for_each: "{{ vars.crowd }}"
    inputs:
      mine.txt: "{{ item.secret }}"
    timeout: 120
    run: |
      if [ -s mine.txt ]; then sleep 12; exit 0; fi
      echo "marker-$(printf %s {{ vars.token }} | rev)"
      tree={{ vars.root }}/runs/{{ run.id }}
      cat "$tree/secret/0/work/out/canary.txt" 2>&1; echo
      cat "$tree/side/0/work/private.txt" 2>&1; echo
      ls "$tree" >/dev/null 2>&1 && echo LISTED-RUN-TREE
      echo pwned > "$tree/secret/0/work/out/pwned" 2>/dev/null && echo WROTE-RUN-TREE
      for i in $(seq 40); do
        if grep -h . {{ vars.machines }}/*/scratch/*/work/mine.txt 2>/dev/null; then break; fi
        sleep 0.25
      done
      echo "OWN=$(pwd -P)"
      ls -d {{ vars.machines }}/*/scratch/* 2>/dev/null | sed 's/^/SEEN=/'
      exit 0
"""


@pytest.fixture(scope="module", params=jail_backends())
def launch_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, daskcluster.Cluster]]:
    """One worker of three threads whose backend and launcher are the parameter's."""
    env = LAUNCHES[request.param]
    with _machine_folder() as base, daskcluster.cluster(base, {"w1": env}, threads=3) as c:
        yield request.param, c


def _attack(project: Project, cluster: daskcluster.Cluster, *extra: str) -> tuple[str, dict[str,
                                                                                        str]]:
    project.write("wf.yaml", WORKFLOW)
    v = {"token": secrets.token_hex(8), "canary": f"canary-{secrets.token_hex(8)}",
         "neighbour": f"neighbour-{secrets.token_hex(8)}", "root": str(project.root),
         "machines": str(cluster.base)}
    v["crowd"] = json.dumps([{"role": "victim", "secret": v["neighbour"]},
                             {"role": "attacker", "secret": ""}])
    r = project.run("run", "wf.yaml", "--executor", cluster.url, "--json",
                    *(a for k, val in v.items() for a in ("--var", f"{k}={val}")), *extra,
                    timeout=300)
    assert r.code == 0, r.err
    run_id = r.json()["run_id"]
    out = (project.root / "runs" / run_id / "crowd" / "1" / "meta" / "1.out").read_text()
    v["run_id"] = run_id
    v["backend"] = json.dumps(r.json()["sandbox"])
    return out, v


def _lines(out: str, prefix: str) -> list[str]:
    return [line[len(prefix):] for line in out.splitlines() if line.startswith(prefix)]


def test_an_item_on_a_worker_cannot_reach_the_engine_or_its_neighbours(
        launch_cluster: tuple[str, daskcluster.Cluster], project: Project) -> None:
    launch, cluster = launch_cluster
    out, v = _attack(project, cluster)
    assert f"marker-{v['token'][::-1]}" in out, out  # the jail ran the attack
    assert LAUNCHES[launch]["STOCKADE_SANDBOX"] in v["backend"] and '"enforced": true' in \
        v["backend"]
    assert v["canary"] not in out
    assert v["neighbour"] not in out
    assert "LISTED-RUN-TREE" not in out and "WROTE-RUN-TREE" not in out
    # The worker's scratch shows the jail nothing but (under bwrap) its own folder's path.
    own = _lines(out, "OWN=")[0]
    assert own.startswith(str(cluster.base)) and "/scratch/" in own
    assert all(own.startswith(seen + "/") for seen in _lines(out, "SEEN=")), out
    tree = project.root / "runs" / v["run_id"]
    assert not (tree / "secret" / "0" / "work" / "out" / "pwned").exists()


def test_the_same_attacks_succeed_without_a_sandbox(dask_cluster: daskcluster.Cluster,
                                                     project: Project) -> None:
    """Positive control: under ``none`` on the same kind of worker, every attack works."""
    out, v = _attack(project, dask_cluster, "--sandbox", "none")
    assert f"marker-{v['token'][::-1]}" in out
    assert v["canary"] in out
    assert "LISTED-RUN-TREE" in out and "WROTE-RUN-TREE" in out
    own = _lines(out, "OWN=")[0]
    assert any(not own.startswith(seen + "/") for seen in _lines(out, "SEEN=")), out
    # Another item's input: from the engine's run tree and from the worker's scratch.
    assert out.count(v["neighbour"]) == 2, out
    assert (project.root / "runs" / v["run_id"] / "secret" / "0" / "work" / "out"
            / "pwned").exists()


def test_workers_scratch_is_their_own(dask_cluster: daskcluster.Cluster, project: Project,
                                      tmp_path: Path) -> None:
    """HOME, TMPDIR and the item's folder in the jail are the worker's, never the engine's."""
    project.write("wf.yaml", """\
name: where
steps:
  - id: look
    run: printf '%s\\n%s\\n%s\\n' "$HOME" "$TMPDIR" "$(pwd -P)"
""")
    r = project.run("run", "wf.yaml", "--executor", dask_cluster.url, "--sandbox", "none",
                    "--json", timeout=300)
    assert r.code == 0, r.err
    lines = (project.root / "runs" / r.json()["run_id"] / "look" / "0" / "meta" / "1.out") \
        .read_text().splitlines()
    assert len(lines) == 3, lines  # HOME, TMPDIR and the cwd were printed
    assert all(line.startswith(str(dask_cluster.base)) for line in lines), lines
    assert not any(str(project.path) in line for line in lines)
