"""Runs on a Dask cluster: fan-out and join, the same results as locally, workers refused.

Every test drives the real ``stockade`` command line against real
``dask scheduler`` and ``dask worker`` processes (``tests/daskcluster.py``).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import daskcluster

from tests.dask.conftest import all_attempts, item_provenance, run_json
from tests.integration.conftest import Project

FAN = """\
name: fanjoin
vars:
  n: 40
steps:
  - id: gather
    run: seq 1 {{ vars.n }} | awk 'BEGIN{printf "["} {printf "%s%s", (NR>1?",":""), $0} END{print "]"}' > out/items.json
  - id: square
    needs: [gather]
    for_each: "{{ steps.gather.outputs['items.json'] | from_json }}"
    inputs:
      n.txt: "{{ item }}"
    run: |
      n=$(cat n.txt)
      echo $((n * n)) > out/sq.txt
      mkdir -p out/deep && printf 'item %s\\n' "$n" > out/deep/note.txt
      echo $((n * n))
  - id: join
    needs: [square]
    inputs:
      first.txt: "{{ steps.square.items[0].outputs['sq.txt'] }}"
      results.json: "{{ steps.square.result }}"
    run: |
      python3 -c "import json; print(sum(int(x) for x in json.load(open('results.json'))))"
"""


def _strip(prov: dict[str, Any]) -> dict[str, Any]:
    """Provenance without what differs between two runs of the same work (ids, times, worker)."""
    out = {k: v for k, v in prov.items()
           if k not in ("run_id", "started_at", "ended_at", "worker")}
    out["inputs"] = [{**i, "source": {k: v for k, v in i["source"].items() if k != "run_id"}}
                     for i in prov["inputs"]]
    out["outputs"] = [{k: v for k, v in o.items() if k != "run_id"} for o in prov["outputs"]]
    return out


def test_fanout_and_join_on_two_workers(dask_cluster: daskcluster.Cluster,
                                        project: Project) -> None:
    project.write("wf.yaml", FAN)
    code, data, err = run_json(project, "run", "wf.yaml", "--executor", dask_cluster.url)
    assert code == 0, err
    assert data["status"] == "succeeded" and data["items"]["square"] == {"succeeded": 40}
    assert data["sandbox"] == {"backend": "bwrap", "enforced": True}
    run_id = data["run_id"]
    run_dir = project.root / "runs" / run_id
    assert (run_dir / "join" / "0" / "meta" / "1.out").read_text() == \
        f"{sum(n * n for n in range(1, 41))}\n"
    # Provenance names the worker of every attempt, and both workers took part.
    workers = set()
    square = [a for a in all_attempts(project, run_id) if a["step"] == "square"]
    assert len(square) == 40
    for a in square:
        prov = a["provenance"]
        assert a["outcome"] == "succeeded" and prov["worker"]["name"] in ("w1", "w2")
        assert prov["sandbox"] == {"backend": "bwrap", "enforced": True, "isolate": True}
        workers.add(prov["worker"]["name"])
        assert {o["name"] for o in prov["outputs"]} == {"sq.txt", "deep/note.txt"}
    assert workers == {"w1", "w2"}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["executor"]["kind"] == "dask"
    assert set(manifest["executor"]["attempts"].values()) == {"w1", "w2"}
    assert manifest["executor"]["attempts"]["square/0/1"] in ("w1", "w2")
    # The engine wrote the run tree: outputs arrived and verify.
    assert (run_dir / "square" / "3" / "work" / "out" / "sq.txt").read_text() == "16\n"
    # The workers' scratch holds nothing once the run is over, and nothing of the
    # engine's paths is anywhere under a worker's own folders.
    engine_paths = [str(project.root).encode(), str(project.path).encode()]
    for w in dask_cluster.workers.values():
        assert list(w.scratch.iterdir()) == []
        for p in w.folder.rglob("*"):
            if p.is_file() and not p.is_symlink() and p.name != "worker.log":
                data_ = p.read_bytes()
                assert not any(e in data_ for e in engine_paths), p


def test_outputs_and_provenance_match_the_local_executor(dask_cluster: daskcluster.Cluster,
                                                          project: Project) -> None:
    project.write("wf.yaml", FAN.replace("n: 40", "n: 6"))
    local_code, local, err = run_json(project, "run", "wf.yaml", "--executor", "local",
                                      "--sandbox", "bwrap")
    assert local_code == 0, err
    remote_code, remote, err = run_json(project, "run", "wf.yaml", "--executor", dask_cluster.url,
                                        "--sandbox", "bwrap")
    assert remote_code == 0, err
    assert local["items"] == remote["items"]
    for target in ["gather/0", *(f"square/{k}" for k in range(1, 7)), "join/0"]:
        a = item_provenance(project, local["run_id"], target)
        b = item_provenance(project, remote["run_id"], target)
        assert "worker" not in a and b["worker"]["name"] in ("w1", "w2")
        assert _strip(a) == _strip(b), target
    # The run trees hold the same files with the same bytes (meta/ and work/ alike).
    ra = project.root / "runs" / local["run_id"]
    rb = project.root / "runs" / remote["run_id"]

    def tree(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and p.name not in ("manifest.json", "engine.lock")}

    assert tree(ra) == tree(rb)


def test_require_refuses_a_worker_whose_sandbox_is_not_enforced(
        private_cluster: daskcluster.Cluster, project: Project) -> None:
    private_cluster.add("good", 2, wait=False)
    private_cluster.add("open", 2, {"STOCKADE_SANDBOX": "none"}, wait=False)
    private_cluster.wait_for(2)
    project.write("wf.yaml", FAN.replace("n: 40", "n: 12"))
    # Positive control: without require, the unenforced worker takes items (recorded so).
    code, data, err = run_json(project, "run", "wf.yaml", "--executor", private_cluster.url)
    assert code == 0, err
    assert data["sandbox"]["enforced"] is False
    seen = {a["provenance"]["worker"]["name"]: a["provenance"]["sandbox"]
            for a in all_attempts(project, data["run_id"])}
    assert seen.get("open") == {"backend": "none", "enforced": False, "isolate": True}
    # With require, the run uses the enforced worker only and says which it refused.
    r = project.run("run", "wf.yaml", "--executor", private_cluster.url, "--require-sandbox",
                    "--json", timeout=300)
    assert r.code == 0, r.err
    assert "refused (not enforced): " in r.err and private_cluster.address.split(":")[1] in r.err
    data = r.json()
    assert data["sandbox"] == {"backend": "bwrap", "enforced": True}
    for a in all_attempts(project, data["run_id"]):
        assert a["provenance"]["worker"]["name"] == "good"
        assert a["provenance"]["sandbox"]["enforced"] is True
    # A cluster with no enforced worker at all: refused before the run exists.
    private_cluster.kill("good")
    r = project.run("run", "wf.yaml", "--executor", private_cluster.url, "--require-sandbox",
                    timeout=300)
    assert r.code == 2
    assert "no worker of the Dask cluster has one" in r.err and "open" in r.err
    assert len(list((project.root / "runs").iterdir())) == 2


def test_a_worker_refuses_a_job_that_requires_enforcement_it_lacks(tmp_path: Path,
                                                                    monkeypatch: Any) -> None:
    """The worker side checks again (a worker may change after the engine's survey)."""
    from stockade.runner.jobs import Job
    from stockade.runner.worker import run_job
    from stockade.sandbox.policy import Resources

    monkeypatch.setenv("STOCKADE_WORKER_SCRATCH", str(tmp_path / "scratch"))
    marker = tmp_path / f"ran-{secrets.token_hex(4)}"

    def job(require: bool) -> Job:
        return Job(id="r/s/0/1", kind="run", attempt=1, command=f"touch {marker}", env={},
                   files=(), folders=("out",), network="none", allow=(), resources=Resources(),
                   timeout=30, sandbox="none", isolate=True, require_enforced=require)

    refused = run_job(job(True))
    assert refused.status == "refused" and "has no enforced sandbox" in refused.message
    assert not marker.exists()
    ran = run_job(job(False))  # positive control: the same job runs when not required
    assert ran.status == "ran" and ran.exit_code == 0 and marker.exists()
    assert ran.worker.backend == "none" and ran.worker.enforced is False
    assert list((tmp_path / "scratch").iterdir()) == []


def test_doctor_reports_each_worker(dask_cluster: daskcluster.Cluster, project: Project) -> None:
    r = project.run("doctor", "--executor", dask_cluster.url, "--json", timeout=300)
    assert r.code == 0, r.err
    data = r.json()
    names = {w["name"]: w for w in data["workers"].values()}
    assert set(names) == {"w1", "w2"}
    for w in names.values():
        assert w["backend"] == "bwrap" and w["enforced"] is True
        by_name = {b["name"]: b for b in w["backends"]}
        assert by_name["none"]["enforced"] is False and by_name["bwrap"]["enforced"] is True
        assert w["scratch"].startswith(str(dask_cluster.base))
    text = project.run("doctor", "--executor", dask_cluster.url, timeout=300)
    assert text.code == 0 and "w1" in text.out and "w2" in text.out


def test_an_unreachable_scheduler_is_one_message(project: Project) -> None:
    project.write("wf.yaml", FAN)
    port = daskcluster.free_port()
    # Nothing listens there: refused at once. Dask's own connect timeout is
    # set far beyond the test's, so only the refusal can end it in time.
    r = project.run("run", "wf.yaml", "--executor", f"dask://127.0.0.1:{port}", timeout=120,
                    env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "600s"})
    assert r.code == 2, r.err
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}: nothing is listening" \
        in r.err
    assert "Traceback" not in r.err
    assert not (project.root / "runs").exists() or not list((project.root / "runs").iterdir())
    r = project.run("run", "wf.yaml", "--executor", "dusk://x")
    assert r.code == 2 and "expected local or dask://HOST:PORT" in r.err
    assert os.environ.get("STOCKADE_EXECUTOR") is None


def test_a_service_that_is_not_dask_is_named_not_waited_on(project: Project) -> None:
    """An --executor pointing at an HTTP server printed a traceback after a
    minute (one that answers) or hung (one that waits for a request)."""
    import socket
    import threading

    project.write("wf.yaml", FAN)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        r = project.run("run", "wf.yaml", "--executor", f"dask://127.0.0.1:{port}", timeout=120)
    finally:
        server.close()
    assert r.code == 2 and r.out == "", r.err
    assert r.err.strip() == (
        f"error: the service at tcp://127.0.0.1:{port} is not a Dask scheduler (it greeted "
        "with 'HTTP/1.1'); check --executor / $STOCKADE_EXECUTOR: it takes the address "
        "`dask scheduler` prints")
    r = project.run("run", "wf.yaml", "--executor", "dask://127.0.0.1:99999")
    assert r.code == 2 and r.err.strip() == (
        "--executor 'dask://127.0.0.1:99999': the port must be a number from 1 to 65535")


def test_the_greeting_of_a_dask_scheduler_is_told_from_others() -> None:
    from stockade.runner.dask_cluster import greets_as_dask

    assert greets_as_dask((58).to_bytes(8, "little") + b"\x01") is None
    assert greets_as_dask(b"") == "it sent nothing within 10 s of the connection"
    assert greets_as_dask(b"SSH-2.0-OpenSSH_9.2\r\n") == "it greeted with 'SSH-2.0-OpenSSH_9.2'"
    assert greets_as_dask(b"\x00\x01") == "it greeted with '\\x00\\x01'"


def test_network_open_and_the_schedulers_host_are_refused_on_dask(project: Project) -> None:
    """A step that can reach the scheduler can have it run code on every
    worker, outside any jail; refused before the cluster is even reached."""
    project.write("wf.yaml", """
        name: net
        steps:
          - id: a
            network: open
            run: echo hi
          - id: b
            network: [api.example.com, "*.corp.example:8786"]
            run: echo hi
    """)
    port = daskcluster.free_port()
    r = project.run("run", "wf.yaml", "--executor", f"dask://sched.corp.example:{port}")
    assert r.code == 2 and r.out == "", r.err
    lines = r.err.splitlines()
    assert lines[0].startswith("wf.yaml:5:") and "step 'a' has network: open, which on a " \
        "Dask cluster reaches its scheduler" in lines[0], lines
    assert lines[1].startswith("wf.yaml:8:") and \
        "may reach '*.corp.example:8786', the Dask scheduler's host" in lines[1], lines
    assert len(lines) == 2
    assert not (project.root / "runs").exists() or not list((project.root / "runs").iterdir())
    # By address: the proxy lets a loopback or private address through when an
    # entry names it as an IP literal, and a name may resolve to the scheduler.
    project.write("wf.yaml", f"""
        name: net
        steps:
          - id: c
            network: ["127.0.0.1:{port}", api.example.com]
            run: echo hi
    """)
    r = project.run("run", "wf.yaml", "--executor", f"dask://localhost:{port}")
    assert r.code == 2 and r.out == "", r.err
    [line] = r.err.splitlines()
    assert line.startswith("wf.yaml:5:") and \
        f"may reach '127.0.0.1:{port}', the Dask scheduler's host" in line, line


def test_a_job_past_its_timeout_is_killed_on_the_worker(tmp_path: Path, monkeypatch: Any) -> None:
    import time

    from stockade.runner.jobs import Job
    from stockade.runner.worker import run_job
    from stockade.sandbox.policy import Resources

    monkeypatch.setenv("STOCKADE_WORKER_SCRATCH", str(tmp_path / "scratch"))
    job = Job(id="r/s/0/1", kind="run", attempt=1, command="echo started; sleep 60", env={},
              files=(), folders=("out",), network="none", allow=(), resources=Resources(),
              timeout=1, sandbox="none", isolate=True, require_enforced=False)
    t0 = time.monotonic()
    r = run_job(job)
    assert r.status == "ran" and r.timed_out and r.exit_code != 0
    assert r.stdout is not None and r.stdout.data == b"started\n"
    assert time.monotonic() - t0 < 45
    assert list((tmp_path / "scratch").iterdir()) == []
    # Cancelled while running: the jail is killed and the result says so.
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 2

    r = run_job(Job(**{**job.__dict__, "timeout": None}), cancelled=cancelled)
    assert r.status == "cancelled" and time.monotonic() - t0 < 90


def test_a_toolchain_on_dask_is_refused_before_the_run(dask_cluster: daskcluster.Cluster,
                                                       project: Project) -> None:
    """mounts: name paths on this machine; a worker's paths are not checked
    against them, so the run is refused instead of running without them."""
    tool = project.path / "tool"
    (tool / "bin").mkdir(parents=True)
    project.write("wf.yaml", f"name: t\nsteps:\n  - id: a\n    mounts: [{json.dumps(str(tool))}]\n"
                  "    run: echo hi\n")
    r = project.run("run", "wf.yaml", "--executor", dask_cluster.url, timeout=300)
    assert r.code == 2, r.err
    assert "steps a declare mounts: or image:" in r.err and "--executor local" in r.err
    assert "Traceback" not in r.err
    assert not (project.root / "runs").exists() or not list((project.root / "runs").iterdir())
    ok = project.run("run", "wf.yaml", timeout=300)  # positive control: local runs it
    assert ok.code == 0, ok.err


def test_an_image_on_dask_is_refused_before_it_is_unpacked(dask_cluster: daskcluster.Cluster,
                                                           project: Project) -> None:
    from tests.images import busybox_rootfs, oci_layout, tree_layer

    oci_layout(project.path / "oci", [tree_layer(busybox_rootfs(project.path / "rootfs"))],
               path="/bin")
    project.write("wf.yaml", "name: t\nsteps:\n  - id: a\n    image: oci\n    run: echo hi\n")
    r = project.run("run", "wf.yaml", "--executor", dask_cluster.url, timeout=300)
    assert r.code == 2, r.err
    assert "steps a declare mounts: or image:" in r.err and "Traceback" not in r.err
    assert "unpacking image" not in r.err
    assert not (project.root / "images").exists()
    # Positive control: run here, the same image is unpacked under the root.
    ok = project.run("run", "wf.yaml", "--sandbox", "bwrap", timeout=300)
    assert ok.code == 0, ok.err
    assert any((project.root / "images").iterdir())


def test_a_large_input_prints_no_dask_warning(dask_cluster: daskcluster.Cluster,
                                              project: Project) -> None:
    """An input sent in the task (no --artifacts) is the documented trade;
    Dask's multi-line "Sending large graph" warning landed in the run's output."""
    big = project.path / "big.bin"
    big.write_bytes(os.urandom(20 << 20))
    project.write("wf.yaml", "name: big\nsteps:\n  - id: a\n"
                  "    inputs: {big.bin: \"{{ file('big.bin') }}\"}\n"
                  "    run: wc -c < big.bin > out/n.txt\n")
    r = project.run("run", "wf.yaml", "--executor", dask_cluster.url, "--run-id", "big1",
                    timeout=300)
    assert r.code == 0, r.err
    assert "large graph" not in r.err and "UserWarning" not in r.err, r.err
    assert (project.item("big1", "a") / "work/out/n.txt").read_text().strip() == str(20 << 20)


def test_job_folders_of_a_killed_worker_are_swept(tmp_path: Path, monkeypatch: Any) -> None:
    """A worker SIGKILLed mid-job left its job folder (the item's inputs) in
    the scratch for good; the next worker process of the user removes the
    folders of processes that are gone, and only those."""
    import subprocess
    import sys

    from stockade.runner import worker
    from stockade.runner.jobs import Job
    from stockade.sandbox.policy import Resources

    scratch = tmp_path / "scratch"
    monkeypatch.setenv("STOCKADE_WORKER_SCRATCH", str(scratch))
    monkeypatch.setattr(worker, "_swept", set())
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    scratch.mkdir()
    for name in (f"job-{gone}-abc", "job-1-alive", f"job-{os.getpid()}-mine", "notes"):
        (scratch / name / "work").mkdir(parents=True)
    job = Job(id="r/s/0/1", kind="run", attempt=1, command="echo hi", env={}, files=(),
              folders=("out",), network="none", allow=(), resources=Resources(), timeout=30,
              sandbox="none", isolate=True, require_enforced=False)
    assert worker.run_job(job).status == "ran"
    assert sorted(p.name for p in scratch.iterdir()) == [
        "job-1-alive", f"job-{os.getpid()}-mine", "notes"]
