"""Large files through ``--artifacts`` (an fsspec URL), checked by sha256 on arrival."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import daskcluster
import pytest

from stockade.runner.jobs import BlobMismatch
from stockade.runner.transfer import pack, unpack
from tests.integration.conftest import Project

BIG = """\
name: big
steps:
  - id: make
    run: head -c 3145728 /dev/urandom > out/blob.bin; sha256sum out/blob.bin | cut -c1-64
  - id: use
    needs: [make]
    inputs:
      blob.bin: "{{ steps.make.outputs['blob.bin'] }}"
    run: sha256sum blob.bin | cut -c1-64
"""


def test_large_inputs_and_outputs_travel_through_the_artifacts_url(
        dask_cluster: daskcluster.Cluster, project: Project, tmp_path: Path) -> None:
    shared = dask_cluster.base.parent / "shared store"
    shared.mkdir()
    project.write("wf.yaml", BIG)
    r = project.run("run", "wf.yaml", "--executor", dask_cluster.url, "--artifacts",
                    shared.as_uri(), "--json", timeout=300)
    assert r.code == 0, r.err
    run_id = r.json()["run_id"]
    run_dir = project.root / "runs" / run_id
    blob = (run_dir / "make" / "0" / "work" / "out" / "blob.bin").read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    assert len(blob) == 3 << 20
    # The worker's own hash, the engine's copy and the consumer's input agree.
    assert (run_dir / "make" / "0" / "meta" / "1.out").read_text().strip() == digest
    assert (run_dir / "use" / "0" / "meta" / "1.out").read_text().strip() == digest
    # The input went through the shared store (kept by hash); outputs were taken out of it.
    stored = [p for p in shared.rglob("*") if p.is_file()]
    assert [p.name for p in stored] == [digest], stored
    assert project.provenance(run_id, "use/0")["inputs"][0]["sha256"] == digest


def test_a_blob_changed_in_the_store_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * (2 << 20))
    store = tmp_path / "store"
    blob = pack(src, "in/src.bin", store.as_uri(), "run1", limit=1024)
    assert blob.data is None and blob.url is not None
    good = tmp_path / "good"
    good.mkdir()
    unpack(blob, good)  # positive control: an untouched blob arrives
    assert (good / "in" / "src.bin").read_bytes() == src.read_bytes()
    stored = next(p for p in store.rglob("*") if p.is_file())
    stored.write_bytes(b"y" + stored.read_bytes()[1:])
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(BlobMismatch, match=r"not the .* that was sent; refused"):
        unpack(blob, bad)
    assert not (bad / "in" / "src.bin").exists()


def test_a_path_that_leaves_its_folder_is_refused(tmp_path: Path) -> None:
    from stockade.runner.jobs import blob_of

    for path in ("../x", "/etc/x", "a/../../x", "a//b"):
        with pytest.raises(BlobMismatch, match="not a plain relative path"):
            unpack(blob_of(path, b"data"), tmp_path)
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir())) == "[]"


def test_a_large_input_reaches_the_worker_whole_without_an_artifacts_url(
        dask_cluster: daskcluster.Cluster, project: Project) -> None:
    """An input of 1 MiB or more is shared on a local run (a bind or a link);
    on a worker it must still arrive whole, by content through the scheduler."""
    project.write("wf.yaml", BIG)
    r = project.run("run", "wf.yaml", "--executor", dask_cluster.url, "--json", timeout=300)
    assert r.code == 0, r.err
    run_id = r.json()["run_id"]
    run_dir = project.root / "runs" / run_id
    digest = hashlib.sha256((run_dir / "make" / "0" / "work" / "out" / "blob.bin")
                            .read_bytes()).hexdigest()
    assert (run_dir / "use" / "0" / "meta" / "1.out").read_text().strip() == digest
    assert project.provenance(run_id, "use/0")["inputs"][0]["sha256"] == digest
