"""Host inputs: ``file()`` and ``tree()``, fingerprinted at run start, copied per item.

The engine may run as root and the workflow folder may hold a checkout someone
else controls, so nothing here follows a link (see ``beneath``): a path
is walked from a descriptor of the workflow's folder, and only regular files
with one name are hashed and copied, each from the descriptor it was checked
on. ``file()`` refuses anything else outright. ``tree()`` copies the regular
files at their git-tracked paths and reports every tracked path it refused
(a tracked symlink, a folder on the path swapped for a symlink, a fifo, a
device, a hard link, a submodule, a missing file); a path that was copied at
run start but refused or changed at copy time fails the item.

git runs on that checkout with its programs switched off: no system or global
config, ``core.fsmonitor`` and hooks overridden (a repository's own config can
name programs to run), no optional locks, and in the folder the engine opened,
not the path (which may have changed since).

Must not import the runner, the sandbox or the CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.errors import TamperedArtifact, UserError
from stockade.workspace.beneath import (
    DIR_FLAGS,
    Refused,
    Walker,
    copy_fd,
    create_file,
    make_folders,
    open_folder,
    parts_of,
    sha256_fd,
    write_all,
)

#: How many refused paths a message names before it says "and N more".
SHOWN_REFUSALS = 10


@contextmanager
def _base(base: Path, fn: str, rel: str) -> Iterator[int]:
    """A descriptor of the workflow's folder (reached as the user named it)."""
    try:
        fd = os.open(base, DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError as exc:
        raise UserError(f"{fn}({rel!r}): cannot open the workflow's folder {base}: {exc.strerror}") from None
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def _tree_root(base: Path, rel: str) -> Iterator[int]:
    """A descriptor of the folder ``tree(rel)`` names, reached through no symlink."""
    with _base(base, "tree", rel) as base_fd:
        try:
            fd = open_folder(base_fd, rel)
        except Refused as r:
            raise UserError(f"tree({rel!r}): {r.why}; tree() follows no symlink") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _open_host_file(base: Path, rel: str) -> int:
    """A descriptor of the regular file ``rel`` below ``base``; raises ``Refused``."""
    with _base(base, "file", rel) as base_fd, Walker(base_fd) as w:
        return w.open_file(rel)[0]


def records_folder(path: Path) -> Path | None:
    """``path`` itself if it is a stockade root (it holds ``runs/`` and the
    store or the reuse key) or a run's folder (``runs/<id>``, holding its
    ``manifest.json``); else None. Any root's, not only the one in use."""
    if (path / "manifest.json").is_file() and path.parent.name == "runs":
        return path
    if (path / "runs").is_dir() and ((path / "stockade.db").exists()
                                     or (path / "reuse.key").exists()):
        return path
    return None


def records_on_the_way(base: Path, rel: str, *, tree: bool) -> str | None:
    """The first folder below ``base`` on the way to ``rel`` (``rel`` itself
    for a tree) that holds stockade's runs, as a path relative to ``base``; or
    None. Such a path would hand a step another run's outputs with none of
    their provenance: the seed of yesterday's report published as today's."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    for n in range(1, len(parts) + (1 if tree else 0)):
        if records_folder(base.joinpath(*parts[:n])) is not None:
            return "/".join(parts[:n])
    return None


def host_path_problem(base: Path, rel: str, *, tree: bool) -> str | None:
    """Why ``file(rel)`` (or ``tree(rel)``) would be refused at run start, in
    the words the run would use, or None. Opens the path as the run does (a
    symlink on the way, a hard link) and reads no file; for ``tree()`` git
    lists the checkout's tracked paths (a folder that is not a checkout)."""
    if (held := records_on_the_way(base, rel, tree=tree)) is not None:
        return (f"{held} holds stockade's run records; a step reads the outputs of this "
                "run's steps (steps.<id>.outputs), never another run's, which carry no "
                "provenance here")
    try:
        if tree:
            with _tree_root(base, rel) as fd:
                tracked_paths(fd, rel)
                return None
        os.close(_open_host_file(base, rel))
    except Refused as r:
        return f"{r.why}; file() reads only a regular file below the workflow's folder, " \
               "through no symlink"
    except UserError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


@dataclass(frozen=True)
class HostFile:
    """A regular file below the workflow's folder, fingerprinted at run start."""

    rel: str
    base: Path
    sha256: str

    def open(self) -> int:
        """A descriptor of the file (the caller closes it), reached through no link."""
        try:
            return _open_host_file(self.base, self.rel)
        except Refused as r:
            raise TamperedArtifact(f"host file {self.rel} changed since the run started: {r.why}") from None

    def read_bytes(self) -> bytes:
        fd = self.open()
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise TamperedArtifact(
                f"host file {self.rel} changed since the run started "
                f"(sha256 {digest[:12]} != {self.sha256[:12]})"
            )
        return data

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8", errors="replace")

    def __str__(self) -> str:
        return self.read_text()

    def __stockade_json__(self) -> dict[str, Any]:
        return {"$file": self.rel, "sha256": self.sha256}


@dataclass(frozen=True)
class HostTree:
    """The regular files at the git-tracked paths of a host checkout, at run start.

    ``files`` is what is copied, ``refused`` the tracked paths that were not
    (each with why). The fingerprint covers exactly the files copied.
    """

    rel: str
    base: Path
    files: tuple[tuple[str, str], ...]  # (relative path, sha256)
    refused: tuple[tuple[str, str], ...] = field(default=())  # (relative path, why)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.files).encode()).hexdigest()

    def __stockade_json__(self) -> dict[str, Any]:
        return {"$tree": self.rel, "sha256": self.sha256}

    def refusal_message(self) -> str | None:
        """One line naming the refused paths (the first ``SHOWN_REFUSALS``), or None."""
        if not self.refused:
            return None
        shown = "; ".join(f"{p} ({why})" for p, why in self.refused[:SHOWN_REFUSALS])
        more = len(self.refused) - SHOWN_REFUSALS
        tail = f"; and {more} more (all in the manifest)" if more > 0 else ""
        n = len(self.refused)
        return (f"tree({self.rel!r}): {n} tracked path{'s' if n != 1 else ''} not copied "
                f"(only regular files at their tracked paths are): {shown}{tail}")

    def copy_into(self, dest_fd: int) -> None:
        """Copy the files into the folder ``dest_fd``; each must hash as at run start."""
        with _tree_root(self.base, self.rel) as root_fd, Walker(root_fd) as w:
            for rel, digest in self.files:
                try:
                    src, _ = w.open_file(rel)
                except Refused as r:
                    raise TamperedArtifact(
                        f"tree({self.rel!r}): {rel} changed since the run started: {r.why}") from None
                try:
                    try:
                        dst = create_file(dest_fd, rel)
                    except Refused as r:
                        raise UserError(f"tree({self.rel!r}): cannot write {rel}: {r.why}") from None
                    try:
                        got, _ = copy_fd(src, dst)
                    finally:
                        os.close(dst)
                finally:
                    os.close(src)
                if got != digest:
                    raise TamperedArtifact(f"tree({self.rel!r}): {rel} changed since the run started "
                                           f"(sha256 {got[:12]} != {digest[:12]})")


def host_file(base: Path, rel: str) -> HostFile:
    """Fingerprint ``file(rel)``: a regular file below ``base``, reached through no symlink."""
    try:
        fd = _open_host_file(base, rel)
    except Refused as r:
        raise UserError(f"file({rel!r}): {r.why}; file() reads only a regular file below the "
                        "workflow's folder, through no symlink") from None
    try:
        digest, _ = sha256_fd(fd)
    finally:
        os.close(fd)
    return HostFile(rel, base, digest)


# -- tree() ---------------------------------------------------------------------

#: Settings that would make git run a program or write into the checkout.
GIT_OVERRIDES = (
    "core.fsmonitor=false",      # a program (or daemon) git asks which files changed
    "core.hooksPath=/dev/null",  # no hook of the repository runs
    "core.untrackedCache=false",
)

NOT_UTF8 = "not-utf-8"
#: Index modes (``git ls-files --stage``) that are never copied, and why.
_NOT_FILES = {"120000": "tracked symlink", "160000": "submodule; its files are not copied",
              NOT_UTF8: "its name is not UTF-8"}


def git_env() -> dict[str, str]:
    """The whole environment git runs with: none of the host's GIT_* settings."""
    return {
        "PATH": os.environ.get("PATH") or os.defpath,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
    }


def git_command(*args: str) -> list[str]:
    cmd = ["git", "--no-pager"]
    for setting in GIT_OVERRIDES:
        cmd += ["-c", setting]
    return [*cmd, *args]


def tracked_paths(root_fd: int, rel: str) -> list[tuple[str, str]]:
    """``(path, index mode)`` of each git-tracked path below the folder ``root_fd``."""
    if shutil.which("git", path=git_env()["PATH"]) is None:
        raise UserError("tree() needs git: install it (apt-get install git)")
    try:
        listed = subprocess.run(
            git_command("ls-files", "-z", "--stage"),
            # The folder the engine opened, not the path: that may have been swapped.
            cwd=f"/proc/self/fd/{root_fd}", pass_fds=(root_fd,), env=git_env(),
            check=True, capture_output=True, stdin=subprocess.DEVNULL,
        ).stdout
    except subprocess.CalledProcessError as exc:
        err = exc.stderr.decode(errors="replace").strip()
        if "dubious ownership" in err:
            owner = os.fstat(root_fd).st_uid
            raise UserError(
                f"tree({rel!r}): the checkout belongs to uid {owner}, not to the user running "
                f"stockade (uid {os.geteuid()}); git will not read a repository another user "
                "controls, because its config can name programs to run. Run stockade as the "
                "checkout's owner, or give the checkout to this user (chown -R)") from None
        if "not a git repository" in err:
            raise UserError(f"tree({rel!r}): not in a git checkout; tree() copies the files git "
                            "tracks there (git init and git add them), file() reads one "
                            "file") from None
        raise UserError(f"tree({rel!r}): not a git checkout: {err}") from None
    entries: dict[str, str] = {}
    for record in listed.split(b"\0"):
        if not record:
            continue
        meta, _, raw = record.partition(b"\t")
        try:
            path, mode = raw.decode("utf-8"), meta.split(b" ", 1)[0].decode("ascii")
        except UnicodeDecodeError:
            # Records and messages are UTF-8 JSON; such a name cannot be shown as it is.
            path, mode = raw.decode("utf-8", errors="backslashreplace"), NOT_UTF8
        entries.setdefault(path, mode)  # a conflict lists a path once per stage
    return sorted(entries.items())


def host_tree(base: Path, rel: str, *, _before_open: Callable[[str], None] | None = None) -> HostTree:
    """Fingerprint ``tree(rel)``: the regular files at its git-tracked paths.

    ``_before_open`` (tests only) runs before each tracked path is opened, so a
    test can swap something in between the listing and the open.
    """
    files: list[tuple[str, str]] = []
    refused: list[tuple[str, str]] = []
    with _tree_root(base, rel) as root_fd:
        listed = tracked_paths(root_fd, rel)
        with Walker(root_fd) as w:
            for path, mode in listed:
                if mode in _NOT_FILES:
                    refused.append((path, _NOT_FILES[mode]))
                    continue
                if _before_open is not None:
                    _before_open(path)
                try:
                    fd, _ = w.open_file(path)
                except Refused as r:
                    refused.append((path, r.why))
                    continue
                try:
                    files.append((path, sha256_fd(fd)[0]))
                finally:
                    os.close(fd)
    return HostTree(rel, base, tuple(files), tuple(refused))


def materialise_tree(tree: HostTree, work: Path, name: str) -> None:
    """Copy ``tree`` to ``work/name``, a folder made for it, never through a link."""
    work_fd = os.open(work, DIR_FLAGS)
    try:
        try:
            dest = make_folders(work_fd, parts_of(name), name)
        except Refused as r:
            raise UserError(f"input {name!r}: {r.why}") from None
    finally:
        os.close(work_fd)
    try:
        tree.copy_into(dest)
    finally:
        os.close(dest)


def write_new_file(work: Path, name: str, data: bytes) -> None:
    """Write ``work/name`` as a new file, never through a link."""
    work_fd = os.open(work, DIR_FLAGS)
    try:
        try:
            fd = create_file(work_fd, name)
        except Refused as r:
            raise UserError(f"input {name!r}: {r.why}") from None
    finally:
        os.close(work_fd)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
