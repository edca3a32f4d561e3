"""Inputs in constant memory: streamed copies checked by sha256, and large
artifacts shared without a copy (a bind placeholder, an engine-owned
read-only hard link), accepted back from ``out/`` when a step hands one on."""

from __future__ import annotations

import hashlib
import os
import stat
import tracemalloc
from pathlib import Path

import pytest

from stockade.errors import TamperedArtifact
from stockade.sandbox import _uids
from stockade.workspace.artifacts import (
    Artifact,
    OutputRefused,
    collect_outputs,
    host_file,
    materialise,
)
from stockade.workspace.placing import SHARE_MIN

BIG = SHARE_MIN + 12345


def artifact(tmp_path: Path, data: bytes, run_id: str = "r1") -> Artifact:
    p = tmp_path / "producer" / "out" / "big.bin"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return Artifact(run_id, "make", 0, 1, "big.bin", hashlib.sha256(data).hexdigest(),
                    len(data), p)


def fresh_work(tmp_path: Path, name: str = "work") -> Path:
    work = tmp_path / name
    (work / "out").mkdir(parents=True)
    return work


@pytest.mark.parametrize("kind", ["artifact", "file"])
def test_a_large_input_is_copied_in_constant_memory(tmp_path: Path, kind: str) -> None:
    data = os.urandom(1 << 20) * 48  # 48 MiB
    art = artifact(tmp_path, data)
    value = art if kind == "artifact" else host_file(art.path.parent, "big.bin")
    work = fresh_work(tmp_path)
    tracemalloc.start()
    try:
        m = materialise(work, "big.bin", value, "r1", sharing="copy")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes allocated to copy {len(data)}"
    assert (m.sha256, m.size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert (work / "big.bin").read_bytes() == data
    assert os.stat(work / "big.bin").st_ino != os.stat(art.path).st_ino


@pytest.mark.parametrize("sharing", ["copy", "link", "bind"])
def test_a_changed_artifact_is_refused_and_nothing_is_left(tmp_path: Path, sharing: str) -> None:
    art = artifact(tmp_path, b"a" * BIG)
    art.path.write_bytes(b"b" * BIG)  # same size, other bytes
    work = fresh_work(tmp_path)
    with pytest.raises(TamperedArtifact, match="changed after it was recorded"):
        materialise(work, "big.bin", art, "r1", sharing=sharing)  # type: ignore[arg-type]
    assert sorted(os.listdir(work)) == ["out"]


def test_a_changed_host_file_is_refused_and_removed(tmp_path: Path) -> None:
    (tmp_path / "wf").mkdir()
    (tmp_path / "wf" / "data.csv").write_text("a,b\n" * 1000)
    value = host_file(tmp_path / "wf", "data.csv")
    (tmp_path / "wf" / "data.csv").write_text("a,c\n" * 1000)
    work = fresh_work(tmp_path)
    with pytest.raises(TamperedArtifact, match="changed since the run started"):
        materialise(work, "data.csv", value, "r1")
    assert sorted(os.listdir(work)) == ["out"]


def test_bind_sharing_leaves_a_read_only_placeholder(tmp_path: Path) -> None:
    data = os.urandom(BIG)
    art = artifact(tmp_path, data)
    work = fresh_work(tmp_path)
    m = materialise(work, "in/big.bin", art, "r1", sharing="bind")
    assert m.bind_source == art.path and m.source["shared"] == "bind"
    assert (work / "in" / "big.bin").stat().st_size == 0
    assert stat.S_IMODE((work / "in" / "big.bin").stat().st_mode) == 0o444
    # The artifact itself is made read-only for everyone (it is what jails read).
    assert stat.S_IMODE(art.path.stat().st_mode) & 0o222 == 0
    assert art.path.read_bytes() == data


def test_small_artifacts_are_always_copied(tmp_path: Path) -> None:
    art = artifact(tmp_path, b"small")
    work = fresh_work(tmp_path)
    m = materialise(work, "s.txt", art, "r1", sharing="bind")
    assert m.bind_source is None and "shared" not in m.source
    assert (work / "s.txt").read_bytes() == b"small"


def test_link_sharing_hard_links_an_engine_owned_read_only_file(tmp_path: Path) -> None:
    data = os.urandom(BIG)
    art = artifact(tmp_path, data)
    jail = 60999
    root = os.geteuid() == 0  # only a root engine's jails run as another uid
    if root:
        os.chown(art.path, jail, jail)  # as a jail left it, had the engine not taken it back
    os.chmod(art.path, 0o664)
    works = [fresh_work(tmp_path, f"work{i}") for i in range(3)]
    for w in works:
        m = materialise(w, "big.bin", art, "r1", sharing="link")
        assert m.source["shared"] in ("hardlink", "reflink")
        if m.source["shared"] == "hardlink":
            assert m.inode == (art.path.stat().st_dev, art.path.stat().st_ino)
    st = art.path.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o444)
    if m.source["shared"] == "hardlink" and root:
        assert st.st_nlink == 4
        # Handing work/ to a jail uid leaves the shared inode the engine's.
        _uids.hand_to(works[0], jail, jail)
        assert (works[0] / "big.bin").stat().st_uid == 0
        assert (works[0] / "out").stat().st_uid == jail
    assert art.path.read_bytes() == data


def test_a_shared_input_moved_into_out_is_accepted_other_hard_links_are_not(
        tmp_path: Path) -> None:
    data = os.urandom(BIG)
    art = artifact(tmp_path, data)
    work = fresh_work(tmp_path)
    other = tmp_path / "elsewhere.bin"
    other.write_bytes(b"not shared")
    st = art.path.stat()
    os.link(art.path, work / "out" / "passed.bin")  # as a step's mv of its linked input
    shared = {(st.st_dev, st.st_ino)}
    outs = collect_outputs(work / "out", shared)
    assert [(o.name, o.sha256) for o in outs] == [("passed.bin",
                                                   hashlib.sha256(data).hexdigest())]
    os.link(other, work / "out" / "sneaky.bin")
    with pytest.raises(OutputRefused, match=r"sneaky.bin \(hard link\)"):
        collect_outputs(work / "out", shared)
    # Positive control: without the shared set the moved input is refused too.
    os.unlink(work / "out" / "sneaky.bin")
    with pytest.raises(OutputRefused, match=r"passed.bin \(hard link\)"):
        collect_outputs(work / "out")
