"""The jail's /etc: ``_host.build_etc`` copies the allowed entries of a host
/etc into one folder that every bwrap jail binds.

On a fake /etc: what is copied, what is left out, and the modes a jail's uid
needs whatever the engine's umask.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.sandbox._host import HostLayout, build_etc


@pytest.fixture(params=[0o077, 0o000], ids=["umask-077", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[None]:
    old = os.umask(request.param)
    try:
        yield
    finally:
        os.umask(old)


def fake_etc(root: Path) -> Path:
    etc = root / "etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "ssl" / "private").mkdir()
    (etc / "ssl" / "private" / "key.pem").write_text("secret")
    (etc / "ssl" / "certs" / "ca.pem").write_text("CA")
    os.symlink("ca.pem", etc / "ssl" / "certs" / "abcd1234.0")
    os.symlink("/nowhere/at/all", etc / "ssl" / "certs" / "dangling.0")
    os.mkfifo(etc / "ssl" / "certs" / "a-fifo")
    (etc / "ssl" / "certs" / "shadow").write_text("never, even below")
    (etc / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (etc / "passwd").chmod(0o600)
    os.symlink("/usr/share/zoneinfo/UTC", etc / "localtime")
    (etc / "alternatives").mkdir(mode=0o700)
    os.symlink("/usr/bin/mawk", etc / "alternatives" / "awk")
    (etc / "alternatives" / "private").mkdir()
    (etc / "alternatives" / "private" / "key").write_text("secret")
    (root / "resolv.conf").write_text("nameserver 10.0.0.1\n")
    return etc


def tree(root: Path) -> dict[str, tuple[str, str]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            mode = os.lstat(p).st_mode
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(mode):
                out[rel] = (oct(stat.S_IMODE(mode)), "dir")
            else:
                out[rel] = (oct(stat.S_IMODE(mode)), Path(p).read_text())
    return out


def test_allowed_entries_are_copied_with_modes_a_jail_can_read(
        tmp_path: Path, umask: None) -> None:
    etc = fake_etc(tmp_path / "host")
    layout = HostLayout(etc=tuple(str(etc / n) for n in ("ssl/certs", "passwd", "localtime",
                                                         "alternatives")),
                        resolv_conf=str(tmp_path / "host" / "resolv.conf"))
    dest = tmp_path / "jail" / "etc"
    built = build_etc(layout, dest, source_root=str(etc))
    assert built.etc_dir == str(dest)
    assert oct(stat.S_IMODE(dest.stat().st_mode)) == "0o755"
    assert tree(dest) == {
        "ssl": ("0o755", "dir"),  # made on the way to ssl/certs, umask or not
        "ssl/certs": ("0o755", "dir"),
        "ssl/certs/ca.pem": ("0o644", "CA"),
        "ssl/certs/abcd1234.0": ("link", "ca.pem"),
        "ssl/certs/dangling.0": ("link", "/nowhere/at/all"),
        "passwd": ("0o644", "root:x:0:0::/root:/bin/sh\n"),
        "localtime": ("link", "/usr/share/zoneinfo/UTC"),
        "alternatives": ("0o755", "dir"),
        "alternatives/awk": ("link", "/usr/bin/mawk"),
        "resolv.conf": ("0o644", "nameserver 10.0.0.1\n"),
    }
    # Not there: ssl/private (not listed), the fifo, and "shadow" and
    # "private" below a listed folder.


def test_no_resolver_file_no_copy(tmp_path: Path) -> None:
    etc = fake_etc(tmp_path / "host")
    dest = tmp_path / "jail" / "etc"
    build_etc(HostLayout(etc=(str(etc / "passwd"),)), dest, source_root=str(etc))
    assert sorted(os.listdir(dest)) == ["passwd"]
