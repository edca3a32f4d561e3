"""Run ids, the attempt layout, output collection and input materialisation."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest

from stockade.errors import StaleOutput, TamperedArtifact, UserError
from stockade.refs import unescape_key
from stockade.workspace.artifacts import (
    Artifact,
    ForgedReference,
    OutputRefused,
    collect_outputs,
    materialise,
    payload_value,
    to_json_value,
)
from stockade.workspace.ids import check_run_id, uuid7
from stockade.workspace.layout import ItemDir, RunDir


def test_uuid7_is_version_7_and_time_ordered() -> None:
    a = uuid7(now=lambda: 1000.0)
    b = uuid7(now=lambda: 1000.001)
    assert uuid.UUID(a).version == 7
    assert uuid.UUID(a).variant == uuid.RFC_4122
    assert a < b


@pytest.mark.parametrize(
    ("run_id", "ok"),
    [
        ("nightly-2026-09-14", True),
        ("a", True),
        ("A.b_c-1", True),
        ("x" * 128, True),
        ("x" * 129, False),
        (".hidden", False),
        ("-flag", False),
        ("", False),
        ("a/b", False),
        ("..", False),
        ("a b", False),
        ("é", False),
        ("a\nb", False),
    ],
)
def test_run_id_rules(run_id: str, ok: bool) -> None:
    if ok:
        assert check_run_id(run_id) == run_id
    else:
        with pytest.raises(UserError, match="invalid run id"):
            check_run_id(run_id)


def test_run_dir_is_never_reused(tmp_path: Path) -> None:
    RunDir(tmp_path, "r1").create()
    with pytest.raises(UserError, match="never reused"):
        RunDir(tmp_path, "r1").create()


def test_retry_gets_a_fresh_work_dir_and_the_old_one_moves_to_meta(tmp_path: Path) -> None:
    idir = RunDir(tmp_path, "r").item("s", 0)
    assert idir.begin_attempt(1) == 1
    (idir.out / "report.json").write_text("from attempt 1")
    (idir.work / "scratch.txt").write_text("left behind")
    assert idir.begin_attempt(2) == 2
    assert sorted(os.listdir(idir.work)) == ["out"]
    assert os.listdir(idir.out) == []
    old = idir.attempt_dir(1) / "work"
    assert (old / "out" / "report.json").read_text() == "from attempt 1"
    assert (old / "scratch.txt").exists()


def test_attempts_that_wrote_nothing_are_still_found_on_disk(tmp_path: Path) -> None:
    # Captures are made on the first byte: a silent attempt leaves none, and
    # a crashed engine's resume must still count it (resume.record_lost_attempts).
    idir = RunDir(tmp_path, "r").item("s", 0)
    assert idir.attempt_numbers() == []
    idir.begin_attempt()
    assert idir.attempt_numbers() == [1]  # only work/ says so
    assert idir.begin_attempt() == 2  # the next, not attempt 1 again
    assert idir.attempt_numbers() == [1, 2]
    idir.stderr(2).write_text("oops\n")
    (idir.attempt_dir(3)).mkdir()  # an agent's records of an attempt, say
    assert idir.attempt_numbers() == [1, 2, 3]
    assert idir.begin_attempt() == 4
    assert idir.attempt_numbers() == [1, 2, 3, 4]
    assert (idir.attempt_dir(3) / "work" / "out").is_dir()


def test_a_premade_item_begins_by_renaming_its_ready_work_dir(tmp_path: Path) -> None:
    idir = RunDir(tmp_path, "r").item("s", 0)
    idir.premake()
    ready = os.stat(idir.ready)
    assert os.stat(idir.meta).st_mode & 0o777 == 0o700
    assert sorted(os.listdir(idir.path)) == [".next", "meta"]
    assert os.listdir(idir.ready) == ["out"]
    # Made ahead, not begun: no attempt on disk (resume counts none).
    assert idir.attempt_numbers() == []
    idir.premake()  # again: nothing changes
    assert os.stat(idir.ready).st_ino == ready.st_ino
    assert idir.begin_attempt(1) == 1
    assert os.stat(idir.work).st_ino == ready.st_ino  # renamed, not made
    assert sorted(os.listdir(idir.path)) == ["meta", "work"]
    assert os.listdir(idir.work) == ["out"]
    assert idir.attempt_numbers() == [1]
    idir.premake()  # a begun item gets no second ready folder
    assert not os.path.lexists(idir.ready)
    assert idir.begin_attempt(2) == 2
    assert (idir.attempt_dir(1) / "work" / "out").is_dir()


def test_a_half_made_ready_folder_is_never_taken(tmp_path: Path) -> None:
    # A crash inside premake leaves .next.tmp (no out/ yet, say): never renamed
    # into place; the next premake starts it again, begin_attempt makes its own.
    idir = RunDir(tmp_path, "r").item("s", 0)
    os.makedirs(f"{idir.ready}.tmp")
    assert idir.begin_attempt(1) == 1
    assert os.listdir(idir.work) == ["out"]
    other = RunDir(tmp_path, "r").item("s", 1)
    os.makedirs(f"{other.ready}.tmp/junk")
    other.premake()
    assert sorted(os.listdir(other.ready)) == ["out"]
    assert not os.path.lexists(f"{other.ready}.tmp")
    other.drop_ready()
    assert sorted(os.listdir(other.path)) == ["meta"]


def test_an_item_reused_from_another_run_has_no_attempt_on_disk(tmp_path: Path) -> None:
    idir = RunDir(tmp_path, "r").item("s", 0)
    idir.out.mkdir(parents=True)  # what reuse.place makes: no meta/
    assert idir.attempt_numbers() == []


def _write(p: Path, data: bytes) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def test_collect_outputs_hashes_regular_files(tmp_path: Path) -> None:
    _write(tmp_path / "a.txt", b"hello")
    _write(tmp_path / "sub" / "b.bin", b"\x00\x01")
    got = {o.name: (o.sha256, o.size) for o in collect_outputs(tmp_path)}
    assert got == {
        "a.txt": (hashlib.sha256(b"hello").hexdigest(), 5),
        "sub/b.bin": (hashlib.sha256(b"\x00\x01").hexdigest(), 2),
    }


@pytest.mark.parametrize("kind", ["symlink", "dirlink", "fifo", "hardlink"])
def test_collect_outputs_refuses_links_and_special_files(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    host = tmp_path / "host-secret"
    host.write_text("secret")
    if kind == "symlink":
        (out / "x").symlink_to(host)
    elif kind == "dirlink":
        (out / "d").symlink_to(tmp_path)
    elif kind == "fifo":
        os.mkfifo(out / "x")
    else:
        os.link(host, out / "x")
    with pytest.raises(OutputRefused, match="refused"):
        collect_outputs(out)


@pytest.mark.parametrize("kind", ["link-to-folder", "file"])
def test_collect_outputs_refuses_an_out_that_is_not_a_folder(tmp_path: Path, kind: str) -> None:
    host = tmp_path / "host"
    _write(host / "key.txt", b"secret")
    out = tmp_path / "out"
    if kind == "link-to-folder":
        out.symlink_to(host)
    else:
        out.write_text("x")
    with pytest.raises(OutputRefused, match="out/ itself"):
        collect_outputs(out)


def test_collect_outputs_order_and_missing_out(tmp_path: Path) -> None:
    for name in ("b.txt", "a/z.txt", "a/y/x.txt", "c.txt", "0/d.txt"):
        _write(tmp_path / "out" / name, b"x")
    names = [o.name for o in collect_outputs(tmp_path / "out")]
    # a folder's files by name, then its subfolders by name (os.walk top-down)
    assert names == ["b.txt", "c.txt", "0/d.txt", "a/z.txt", "a/y/x.txt"]
    assert collect_outputs(tmp_path / "gone") == []


def _artifact(tmp_path: Path, run_id: str, data: bytes, consumer: str = "") -> Artifact:
    p = tmp_path / "out" / "report.json"
    _write(p, data)
    return Artifact(run_id, "gather", 0, 1, "report.json", hashlib.sha256(data).hexdigest(),
                    len(data), p, consumer)


@pytest.mark.parametrize("swap", ["folder", "file"])
def test_collect_outputs_does_not_follow_a_swap_during_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    # A jail process still dying swaps out/d (or out/f) for a symlink to a
    # host folder (file) between the listing and the descent: the walk must
    # refuse it, never hash the host's bytes as an output.
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("host bytes\n")
    out = tmp_path / "out"
    (out / "d").mkdir(parents=True)
    (out / "d" / "x").write_text("mine\n")
    (out / "f").write_text("mine\n")
    real_scandir = os.scandir

    def racing_scandir(fd):  # type: ignore[no-untyped-def]
        entries = list(real_scandir(fd))
        for e in entries:
            e.stat(follow_symlinks=False)  # listed and looked at: a folder, a file
        if any(e.name == "d" for e in entries):
            if swap == "folder":
                os.rename(out / "d", tmp_path / "moved")
                os.symlink(host, out / "d")
            else:
                os.unlink(out / "f")
                os.symlink(host / "secret", out / "f")

        class Listing:
            def __enter__(self) -> list[os.DirEntry[str]]:
                return entries

            def __exit__(self, *exc: object) -> None:
                return None

        return Listing()

    monkeypatch.setattr(os, "scandir", racing_scandir)
    with pytest.raises(OutputRefused, match="changed while it was read"):
        collect_outputs(out)


def test_an_unreadable_output_is_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A jail can leave a mode-000 file that a non-root engine cannot open
    # (root reads it anyway, so the refusal is injected here): the message
    # names the reason, not a race.
    out = tmp_path / "out"
    _write(out / "locked", b"x")
    _write(out / "fine", b"y")
    real_open = os.open

    def refusing_open(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if path == "locked":
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(OutputRefused, match=r"locked \(Permission denied\)"):
        collect_outputs(out)


def test_materialise_copies_an_artifact_of_this_run(tmp_path: Path) -> None:
    art = _artifact(tmp_path, "run-b", b'{"rows": 3}')
    work = tmp_path / "work"
    work.mkdir()
    m = materialise(work, "report.json", art, "run-b")
    assert (work / "report.json").read_bytes() == b'{"rows": 3}'
    assert m.source["run_id"] == "run-b"


def test_cross_run_artifact_read_fails_loudly(tmp_path: Path) -> None:
    art = _artifact(tmp_path, "run-a", b'{"rows": 3}')
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(StaleOutput, match="run-a"):
        materialise(work, "report.json", art, "run-b")
    assert not (work / "report.json").exists()
    with pytest.raises(StaleOutput):
        _artifact(tmp_path, "run-a", b"x", consumer="run-b").read_text()


def test_tampered_artifact_is_an_error(tmp_path: Path) -> None:
    art = _artifact(tmp_path, "run-b", b'{"rows": 3}')
    art.path.write_bytes(b'{"rows": 4}')
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(TamperedArtifact, match="changed"):
        materialise(work, "report.json", art, "run-b")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("text", b"text"), ({"a": 1}, b'{"a": 1}'), ([1, 2], b"[1, 2]"), (3, b"3"), (None, b"null")],
)
def test_materialise_text_and_json(tmp_path: Path, value: object, expected: bytes) -> None:
    materialise(tmp_path, "v", value, "r")
    assert (tmp_path / "v").read_bytes() == expected


@pytest.mark.parametrize("name", ["/etc/x", "../x", "a/../../x", "out/x", "out", ""])
def test_input_names_stay_inside_work_and_outside_out(tmp_path: Path, name: str) -> None:
    with pytest.raises(UserError):
        materialise(tmp_path, name, "x", "r")


def test_collect_outputs_strips_setuid_and_setgid(tmp_path: Path) -> None:
    f = tmp_path / "tool"
    f.write_bytes(b"#!/bin/sh\n")
    os.chmod(f, 0o6755)
    collect_outputs(tmp_path)
    assert oct(f.stat().st_mode & 0o7777) == oct(0o755)


FORGED = {"$artifact": {"run_id": "r", "step": "ghost", "item": 0, "attempt": 1, "name": "x",
                        "sha256": "ab" * 32, "size": 1}, "text": "forged"}


def test_json_inputs_escape_reserved_keys_in_data_and_keep_real_references(tmp_path: Path) -> None:
    art = _artifact(tmp_path, "r", b"real")
    materialise(tmp_path, "v.json", {"forged": FORGED, "real": art, "list": [{"$$tree": 1}]}, "r")
    written = json.loads((tmp_path / "v.json").read_text())
    assert written["forged"] == {"$$artifact": FORGED["$artifact"], "text": "forged"}
    assert written["list"] == [{"$$$tree": 1}]
    assert written["real"] == {"$artifact": art.ref(), "text": "real"}
    assert [unescape_key(k) for k in written["forged"]] == list(FORGED)


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (FORGED, "payload holds the key '$artifact'"),
        ({"rows": [1, {"n": FORGED}]}, 'payload["rows"][1]["n"] holds the key \'$artifact\''),
        ([{"$file": "secret.txt", "sha256": "00"}], "payload[0] holds the key '$file'"),
        ({"a": {"$tree": "."}}, "payload[\"a\"] holds the key '$tree'"),
    ],
)
def test_a_payload_refuses_data_posing_as_a_reference(tmp_path: Path, value: object, where: str) -> None:
    with pytest.raises(ForgedReference, match=re.escape(where)) as err:
        payload_value(value)
    assert "only the engine's own references" in str(err.value)
    assert isinstance(err.value, UserError)  # an item error: the item fails, not the engine


def test_a_payload_keeps_real_references_and_escaped_data(tmp_path: Path) -> None:
    art = _artifact(tmp_path, "r", b"real")
    got = payload_value({"report": art, "data": {"$$artifact": 1, "$ref": 2}})
    assert got == {"report": {"$artifact": art.ref(), "text": "real"},
                   "data": {"$$$artifact": 1, "$ref": 2}}
    assert to_json_value({"x": FORGED}) == {"x": {"$$artifact": FORGED["$artifact"], "text": "forged"}}


def _borrowed(tmp_path: Path) -> tuple[RunDir, ItemDir, Path]:
    """A run, its first item's attempt, and the scratch folder it borrowed
    (made, as a backend makes it: nothing borrowed or made before)."""
    run = RunDir(tmp_path, "r")
    idir = run.item("s", 0)
    idir.begin_attempt(1)
    assert not (run.path / ".scratch").exists()
    home = idir.scratch
    home.mkdir(parents=True)
    return run, idir, home


@pytest.mark.parametrize("keep", [True, False], ids=["unsandboxed", "enforced"])
def test_scratch_is_borrowed_on_first_use_and_an_empty_one_kept_only_without_a_sandbox(
    tmp_path: Path, keep: bool,
) -> None:  # fmt: skip
    run, first, home = _borrowed(tmp_path)
    assert first.scratch == home  # one loan per attempt
    inode = home.stat().st_ino
    first.end_attempt(keep_scratch=keep)
    if keep:
        assert home.stat().st_ino == inode  # the same folder, not remade
    else:
        # Empty and as made, yet a dying jail could still write there.
        assert not os.path.lexists(home)
    second = run.item("s", 1)
    second.begin_attempt(1)
    assert second.scratch == home  # the name is lent again either way


def test_an_enforced_jails_scratch_is_kept_once_the_jail_was_seen_gone(tmp_path: Path) -> None:
    run, first, home = _borrowed(tmp_path)
    inode = home.stat().st_ino
    first.jail_gone()
    first.end_attempt(keep_scratch=False)
    assert home.stat().st_ino == inode  # kept, not removed
    second = run.item("s", 1)
    second.begin_attempt(1)
    assert second.scratch == home
    # The mark is the attempt's own: the next attempt's folder goes again.
    second.end_attempt(keep_scratch=False)
    assert not os.path.lexists(home)


def test_a_scratch_of_a_jail_seen_gone_is_still_removed_if_it_came_back_used(
    tmp_path: Path,
) -> None:  # fmt: skip
    _, idir, home = _borrowed(tmp_path)
    _left_file(home)
    idir.jail_gone()
    idir.end_attempt()
    assert not os.path.lexists(home)


def _with_mount_point(home: Path, name: str = "x") -> Path:
    """What a bwrap jail with work/ below /tmp leaves: one empty folder, its mount point."""
    point = home / name
    point.mkdir()
    os.chmod(point, stat.S_IMODE(home.stat().st_mode))
    return point


def test_a_scratch_holding_only_its_jails_empty_mount_point_is_kept(tmp_path: Path) -> None:
    run, first, home = _borrowed(tmp_path)
    _with_mount_point(home)
    inode = home.stat().st_ino
    first.jail_gone(frozenset({"x"}))
    first.end_attempt(keep_scratch=False)
    assert home.stat().st_ino == inode  # kept, mount point and all
    assert os.listdir(home) == ["x"]
    # The names are the attempt's own: a later jail that declares none
    # gets the folder removed.
    second = run.item("s", 1)
    second.begin_attempt(1)
    assert second.scratch == home
    second.jail_gone()
    second.end_attempt()
    assert not os.path.lexists(home)


@pytest.mark.parametrize("change", ["a file in it", "another name", "its mode", "undeclared"])
def test_a_mount_point_the_jail_could_have_touched_gets_the_scratch_removed(
    tmp_path: Path, change: str,
) -> None:  # fmt: skip
    # bwrap shows the scratch at /tmp, HOME and /dev/shm; the cover hides
    # the mount point only at /tmp, so through HOME a jail could write into
    # it or change it: that folder is never lent again.
    _, idir, home = _borrowed(tmp_path)
    point = _with_mount_point(home)
    declared = frozenset({"x"})
    if change == "a file in it":
        (point / "note").write_text("the answer")
    elif change == "another name":
        _with_mount_point(home, "y")
    elif change == "its mode":
        point.chmod(0o777)
    else:
        declared = frozenset()
    idir.jail_gone(declared)
    idir.end_attempt()
    assert not os.path.lexists(home)


def test_an_attempt_that_never_asks_for_scratch_borrows_nothing(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "r")
    idir = run.item("s", 0)
    idir.begin_attempt(1)
    idir.end_attempt()
    idir.end_attempt()  # twice is harmless (an error path may end it again)
    assert not (run.path / ".scratch").exists()


def _left_file(p: Path) -> None:
    (p / "left").write_text("from the last attempt")


def _left_tree(p: Path) -> None:
    (p / "d" / "e").mkdir(parents=True)
    (p / "d" / "e" / "f").write_text("x")


def _opened_to_all(p: Path) -> None:
    p.chmod(0o777)


def _replaced_by_link(p: Path) -> None:
    outside = p.parent.parent / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the run's")
    p.rmdir()
    p.symlink_to(outside)


def _replaced_by_file(p: Path) -> None:
    p.rmdir()
    p.write_text("a file")


@pytest.mark.parametrize("change", [_left_file, _left_tree, _opened_to_all, _replaced_by_link,
                                    _replaced_by_file])
def test_a_scratch_that_comes_back_changed_is_removed_before_it_is_lent_again(
    tmp_path: Path, change: Any,
) -> None:  # fmt: skip
    run, idir, home = _borrowed(tmp_path)
    change(home)
    idir.end_attempt(keep_scratch=True)
    assert not os.path.lexists(home)
    if change is _replaced_by_link:  # the link went, not what it pointed at
        assert (run.path / "outside" / "keep").read_text() == "not the run's"
    nxt = run.item("s", 1)
    nxt.begin_attempt(1)
    assert nxt.scratch == home  # the name is lent again, for the backend to create afresh


def test_a_scratch_left_by_a_crashed_engine_is_cleared_before_its_first_loan(
    tmp_path: Path,
) -> None:
    run = RunDir(tmp_path, "r")
    stale = run.path / ".scratch" / "0"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "planted").write_text("from before the crash")
    idir = RunDir(tmp_path, "r").item("s", 0)
    idir.begin_attempt(1)
    assert idir.scratch == stale and not stale.exists()


def test_attempts_at_once_borrow_different_folders(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "r")
    dirs = [run.item("s", i) for i in range(3)]
    for d in dirs:
        d.begin_attempt(1)
    lent = [d.scratch for d in dirs]
    assert len(set(lent)) == 3
    for d in dirs:
        d.end_attempt(keep_scratch=True)
    again = run.item("s", 3)
    again.begin_attempt(1)
    assert again.scratch in lent  # no fourth name while three are free


def test_a_scratch_that_cannot_be_removed_is_never_lent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # What a jail's folder it may not read does to a non-root engine's
    # rmtree, without needing a non-root engine: the removal leaves it there.
    from stockade.workspace import layout

    run = RunDir(tmp_path, "r")
    idir = run.item("s", 0)
    idir.begin_attempt(1)
    home = idir.scratch
    (home / "locked").mkdir(parents=True)
    monkeypatch.setattr(layout.shutil, "rmtree", lambda path, ignore_errors=False: None)
    idir.end_attempt(keep_scratch=True)
    assert (home / "locked").is_dir()  # still there, so ...
    nxt = run.item("s", 1)
    nxt.begin_attempt(1)
    assert nxt.scratch != home  # ... its name is retired
    # and a stale name a crashed engine left that cannot be cleared is skipped
    stale = run.path / ".scratch" / "2"
    (stale / "planted").mkdir(parents=True)
    later = [run.item("s", i) for i in (2, 3)]
    for d in later:
        d.begin_attempt(1)
    assert stale not in {d.scratch for d in later}
