"""Path checks the bwrap and landlock backends run before every item."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stockade.sandbox._host import resolve
from stockade.sandbox._uids import hand_to, take_back


@pytest.mark.parametrize(
    "make",
    [
        # (what to build under tmp, the path asked about) -> compare with realpath
        lambda t: (t / "step" / "0" / "work", []),
        lambda t: (t / "step" / "1" / "work", [("step/1", "step/real1")]),  # item folder a link
        lambda t: (t / "link" / "2" / "work", [("link", "step")]),  # step folder a link
        lambda t: (t / "step" / "3" / "lwork", [("step/3/lwork", "step/3/w")]),  # work a link
        lambda t: (t / "step" / "4" / "missing", []),
    ],
)
def test_resolve_matches_realpath(tmp_path: Path, make: object) -> None:
    path, links = make(tmp_path)  # type: ignore[operator]
    (tmp_path / "step").mkdir(exist_ok=True)
    for link, target in links:
        (tmp_path / target).mkdir(parents=True, exist_ok=True)
        os.symlink(tmp_path / target, tmp_path / link)
    if path.name != "missing":
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        got = resolve(str(path))
    except FileNotFoundError:
        got = "missing"
    expected = os.path.realpath(path) if path.name != "missing" else "missing"
    assert got == expected


def test_hand_to_never_follows_links(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    outside = tmp_path / "outside"
    outside.write_text("host")
    work = tmp_path / "work"
    (work / "out" / "deep").mkdir(parents=True)
    (work / "out" / "deep" / "f").write_text("x")
    os.symlink(outside, work / "out" / "link")
    hand_to(work, 65534, 65534)
    for p in (work, work / "out", work / "out" / "deep", work / "out" / "deep" / "f"):
        assert os.lstat(p).st_uid == 65534, p
    assert os.lstat(work / "out" / "link").st_uid == 65534
    assert os.stat(outside).st_uid == os.geteuid()  # the link's target is untouched


def test_take_back_gives_only_what_the_jail_owns(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    jail = 60999
    work = tmp_path / "work"
    (work / "out" / "d").mkdir(parents=True)
    hand_to(work, jail, jail)
    made = work / "out" / "d" / "made"
    made.write_text("x")
    os.chown(made, jail, jail)
    suid = work / "out" / "suid"
    suid.write_bytes(b"#!/bin/sh\n")
    os.chown(suid, jail, jail)
    suid.chmod(0o6755)
    foreign = work / "out" / "foreign"  # a name for something the jail does not own
    foreign.write_text("y")
    os.chown(foreign, 12345, 12345)
    os.symlink("/etc/passwd", work / "out" / "link")
    os.lchown(work / "out" / "link", jail, jail)
    take_back(work, jail, jail, 0, 0)
    for p in (work, work / "out", work / "out" / "d", made, suid, work / "out" / "link"):
        st = os.lstat(p)
        assert (st.st_uid, st.st_gid) == (0, 0), p
    # The kernel drops set-id bits when a file changes owner: no set-uid root file.
    assert os.stat(suid).st_mode & 0o6000 == 0
    assert (os.stat(foreign).st_uid, os.stat(foreign).st_gid) == (12345, 12345)
    assert os.stat("/etc/passwd").st_uid == 0
    take_back(tmp_path / "gone", jail, jail, 0, 0)  # a missing tree is nothing to do
