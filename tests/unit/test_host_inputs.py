"""``file()`` and ``tree()`` on a hostile checkout: nothing is followed, all is said.

The engine may run as root. Each attack plants a canary, composed at run time,
in a private (0700) folder outside the checkout, points a link at it, and
checks the canary is neither hashed nor copied; a positive control shows the
same plant is live (a path-following read or ``shutil.copytree`` gets the
canary). Swaps between listing, fingerprinting and copying are made through
hooks, never by racing.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from stockade.errors import TamperedArtifact, UserError
from stockade.workspace.artifacts import HostTree, host_file, host_tree, materialise
from stockade.workspace.beneath import Refused, Walker, create_file, parts_of
from stockade.workspace.host import git_command, git_env, write_new_file


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


class Checkout:
    """A workflow folder (with a space in its path) holding a committed checkout, and a vault.

    The vault is a private folder outside the checkout whose file holds the
    canary: what an attacker wants copied into a jail.
    """

    def __init__(self, tmp: Path) -> None:
        self.base = tmp / "work flow"
        self.co = self.base / "checkout"
        self.canary = "canary-" + secrets.token_hex(16)
        self.marker = "marker-" + secrets.token_hex(16)
        self.vault = tmp / "vault"
        self.vault.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(self.vault, 0, 0)
        (self.vault / "settings.txt").write_text(self.canary)
        (self.vault / "settings.txt").chmod(0o600)
        for rel, text in {"cfg/settings.txt": "harmless\n", "docs/readme.txt": self.marker,
                          "top.txt": "top\n"}.items():
            (self.co / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.co / rel).write_text(text)
        git(self.co, "init", "-q")
        git(self.co, "add", ".")
        self.commit()

    def commit(self) -> None:
        git(self.co, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")

    def swap_cfg_for_link(self) -> None:
        """The attack of the issue: a tracked folder replaced by a symlink to the vault."""
        shutil.rmtree(self.co / "cfg")
        (self.co / "cfg").symlink_to(self.vault)

    def tree(self, **kw: Callable[[str], None]) -> HostTree:
        return host_tree(self.base, "checkout", **kw)


@pytest.fixture
def c(tmp_path: Path) -> Checkout:
    return Checkout(tmp_path)


def every_byte_under(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file() and not p.is_symlink())


def test_tree_hashes_and_copies_the_tracked_regular_files(c: Checkout, tmp_path: Path) -> None:
    (c.co / "untracked.txt").write_text("not tracked\n")
    t = c.tree()
    assert [p for p, _ in t.files] == ["cfg/settings.txt", "docs/readme.txt", "top.txt"]
    assert t.refused == ()
    work = tmp_path / "work"
    work.mkdir()
    m = materialise(work, "repo", t, "r")
    # The fingerprint covers exactly the bytes copied.
    copied = tuple((p, hashlib.sha256((work / "repo" / p).read_bytes()).hexdigest()) for p, _ in t.files)
    assert copied == t.files and m.sha256 == t.sha256
    assert (work / "repo/docs/readme.txt").read_text() == c.marker
    assert not (work / "repo/untracked.txt").exists()
    assert m.source == {"kind": "tree", "path": "checkout"}


def test_a_tracked_folder_swapped_for_a_symlink_is_refused_not_followed(c: Checkout, tmp_path: Path) -> None:
    c.swap_cfg_for_link()
    # Positive control: the plant is live; the old path-based check passed it
    # (only the last component was tested for a link) and copytree copies it.
    old = c.co / "cfg/settings.txt"
    assert not old.is_symlink() and old.is_file() and old.read_text() == c.canary
    shutil.copytree(c.co, tmp_path / "naive")
    assert (tmp_path / "naive/cfg/settings.txt").read_text() == c.canary

    t = c.tree()
    assert [p for p, _ in t.files] == ["docs/readme.txt", "top.txt"]
    assert t.refused == (("cfg/settings.txt", "cfg is a symlink, not a folder"),)
    assert t.refusal_message() == (
        "tree('checkout'): 1 tracked path not copied (only regular files at their tracked "
        "paths are): cfg/settings.txt (cfg is a symlink, not a folder)")
    work = tmp_path / "work"
    work.mkdir()
    m = materialise(work, "repo", t, "r")
    assert m.source["refused"] == [{"path": "cfg/settings.txt", "why": "cfg is a symlink, not a folder"}]
    assert c.canary.encode() not in every_byte_under(work)
    assert not (work / "repo/cfg").exists()


def _fifo(c: Checkout, p: Path) -> None:
    os.mkfifo(p)


def _device(c: Checkout, p: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can make a device node")
    os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a /dev/null: only root can make one


def _hard_link(c: Checkout, p: Path) -> None:
    os.link(c.vault / "settings.txt", p)


def _file_link(c: Checkout, p: Path) -> None:
    p.symlink_to(c.vault / "settings.txt")


def _nothing(c: Checkout, p: Path) -> None:
    pass


def _folder(c: Checkout, p: Path) -> None:
    p.mkdir()


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        (_fifo, "cfg/settings.txt is a fifo, not a regular file"),
        (_device, "cfg/settings.txt is a device, not a regular file"),
        (_hard_link, "cfg/settings.txt is a hard link (2 names)"),
        (_file_link, "cfg/settings.txt is a symlink, not a regular file"),
        (_nothing, "cfg/settings.txt is missing"),
        (_folder, "cfg/settings.txt is a folder, not a regular file"),
    ],
    ids=["fifo", "device", "hard-link", "untracked-symlink", "missing", "folder"],
)
def test_a_tracked_path_that_is_not_a_regular_file_is_refused(
    c: Checkout, plant: Callable[[Checkout, Path], None], why: str,
) -> None:
    target = c.co / "cfg/settings.txt"
    target.unlink()
    plant(c, target)
    t = c.tree()  # a fifo must not hang it: it is never opened for reading
    assert t.refused == (("cfg/settings.txt", why),)
    assert [p for p, _ in t.files] == ["docs/readme.txt", "top.txt"]


def test_tracked_symlinks_and_submodules_are_refused_from_the_index(c: Checkout) -> None:
    (c.co / "link").symlink_to("top.txt")
    git(c.co, "add", "link")
    head = git(c.co, "rev-parse", "HEAD").strip()
    git(c.co, "update-index", "--add", "--cacheinfo", f"160000,{head},sub")
    c.commit()
    t = c.tree()
    assert t.refused == (("link", "tracked symlink"), ("sub", "submodule; its files are not copied"))
    assert [p for p, _ in t.files] == ["cfg/settings.txt", "docs/readme.txt", "top.txt"]


def test_a_tracked_name_that_is_not_utf8_is_refused_and_shown_escaped(c: Checkout) -> None:
    with open(os.fsencode(c.co) + b"/bad\xff.txt", "wb") as f:
        f.write(b"x")
    git(c.co, "add", ".")
    c.commit()
    t = c.tree()
    assert t.refused == (("bad\\xff.txt", "its name is not UTF-8"),)
    json.dumps(t.refused, ensure_ascii=False).encode()  # records can hold it


def test_a_swap_between_listing_and_opening_is_refused(c: Checkout) -> None:
    seen: list[str] = []

    def swap(path: str) -> None:
        seen.append(path)
        if path == "cfg/settings.txt":
            c.swap_cfg_for_link()  # git listed a folder; it is a link by the time it is opened
        if path == "top.txt":
            (c.co / "top.txt").unlink()
            (c.co / "top.txt").symlink_to(c.vault / "settings.txt")

    t = c.tree(_before_open=swap)
    assert seen == ["cfg/settings.txt", "docs/readme.txt", "top.txt"]  # listed before the swap
    assert t.refused == (("cfg/settings.txt", "cfg is a symlink, not a folder"),
                         ("top.txt", "top.txt is a symlink, not a regular file"))
    assert [p for p, _ in t.files] == ["docs/readme.txt"]


@pytest.mark.parametrize("swap", ["folder-link", "file-link", "fifo", "content"])
def test_a_change_between_fingerprint_and_copy_fails_the_copy(c: Checkout, tmp_path: Path, swap: str) -> None:
    t = c.tree()
    target = c.co / "cfg/settings.txt"
    if swap == "folder-link":
        c.swap_cfg_for_link()
        why = "cfg/settings.txt changed since the run started: cfg is a symlink, not a folder"
    elif swap == "file-link":
        target.unlink()
        target.symlink_to(c.vault / "settings.txt")
        why = "cfg/settings.txt changed since the run started: cfg/settings.txt is a symlink"
    elif swap == "fifo":
        target.unlink()
        os.mkfifo(target)
        why = "cfg/settings.txt changed since the run started: cfg/settings.txt is a fifo"
    else:
        target.write_text(c.canary)
        why = "cfg/settings.txt changed since the run started (sha256"
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(TamperedArtifact, match=why.replace("(", r"\(")):
        materialise(work, "repo", t, "r")
    if swap != "content":
        assert c.canary.encode() not in every_byte_under(work)


def test_git_runs_no_program_the_checkout_configures(c: Checkout, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ran = tmp_path / f"ran-{secrets.token_hex(4)}"
    git(c.co, "config", "core.fsmonitor", f"touch '{ran}'; false")
    # Positive control: the repository's own config makes plain git run it.
    git(c.co, "ls-files")
    assert ran.exists()
    ran.unlink()
    # The host's GIT_* settings do not redirect git either.
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.fsmonitor'='true'")
    t = c.tree()
    assert not ran.exists()
    assert [p for p, _ in t.files] == ["cfg/settings.txt", "docs/readme.txt", "top.txt"]


def test_git_is_run_with_programs_off_and_no_host_config() -> None:
    assert git_command("ls-files") == [
        "git", "--no-pager", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
        "-c", "core.untrackedCache=false", "ls-files",
    ]
    env = git_env()
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == os.devnull
    assert env["GIT_OPTIONAL_LOCKS"] == "0"
    assert not {k for k in env if k.startswith("GIT_")} - {
        "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL", "GIT_OPTIONAL_LOCKS", "GIT_TERMINAL_PROMPT"}


@pytest.mark.parametrize(
    ("rel", "why"),
    [
        ("link-to-checkout", "link-to-checkout is a symlink, not a folder"),
        ("checkout/cfg", "checkout/cfg is a symlink, not a folder"),
        ("../vault", "the path contains '..'"),
        ("/etc", "the path is absolute"),
        ("missing", "missing is missing"),
    ],
)
def test_the_tree_root_is_reached_through_no_symlink(c: Checkout, rel: str, why: str) -> None:
    (c.base / "link-to-checkout").symlink_to("checkout")
    c.swap_cfg_for_link()
    with pytest.raises(UserError, match=f"tree\\({rel!r}\\): {why}"):
        host_tree(c.base, rel)


def test_a_checkout_of_another_user_is_refused_with_what_to_do(c: Checkout) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give the checkout to another user")
    subprocess.run(["chown", "-R", "65534:65534", str(c.co)], check=True)
    with pytest.raises(UserError, match=r"belongs to uid 65534.*chown"):
        c.tree()


# -- file() ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "why"),
    [
        ("checkout/cfg/settings.txt", "checkout/cfg is a symlink, not a folder"),
        ("final-link", "final-link is a symlink, not a regular file"),
        ("inner-link", "inner-link is a symlink, not a regular file"),
        ("hard", "hard is a hard link (2 names)"),
        ("fifo", "fifo is a fifo, not a regular file"),
        ("checkout", "checkout is a folder, not a regular file"),
        ("../vault/settings.txt", "the path contains '..'"),
        ("checkout/../top.txt", "the path contains '..'"),
        ("/etc/hostname", "the path is absolute"),
        ("nothing.txt", "nothing.txt is missing"),
    ],
)
def test_file_reads_only_a_regular_file_through_no_symlink(c: Checkout, rel: str, why: str) -> None:
    c.swap_cfg_for_link()
    (c.base / "final-link").symlink_to(c.vault / "settings.txt")
    (c.base / "inner-link").symlink_to("checkout/top.txt")  # stays inside: refused all the same
    os.link(c.vault / "settings.txt", c.base / "hard")
    os.mkfifo(c.base / "fifo")
    if rel in ("checkout/cfg/settings.txt", "final-link", "hard", "../vault/settings.txt"):
        # Positive control: a path-following read gets the canary.
        assert (c.base / rel).read_text() == c.canary
    with pytest.raises(UserError, match=f"file\\({rel!r}\\): {why.replace('(', '[(]').replace(')', '[)]')}"):
        host_file(c.base, rel)


def test_file_changed_into_a_link_after_the_fingerprint_is_not_read(c: Checkout, tmp_path: Path) -> None:
    f = host_file(c.base, "checkout/cfg/settings.txt")
    assert f.read_text() == "harmless\n"
    c.swap_cfg_for_link()
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(TamperedArtifact, match="cfg is a symlink") as err:
        materialise(work, "settings.txt", f, "r")
    assert c.canary not in str(err.value)
    assert not (work / "settings.txt").exists()


# -- writing into work/ -----------------------------------------------------------


def test_materialise_never_writes_through_a_link_planted_in_work(c: Checkout, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "planted").symlink_to(c.vault)
    # Positive control: a path-following write would land in the vault.
    assert (work / "planted" / "settings.txt").read_text() == c.canary
    before = sorted(p.name for p in c.vault.iterdir())
    for value in ("text", {"a": 1}, c.tree(), host_file(c.base, "checkout/top.txt")):
        with pytest.raises(UserError, match="planted is a symlink, not a folder"):
            materialise(work, "planted/x", value, "r")
    assert sorted(p.name for p in c.vault.iterdir()) == before
    (work / "plain").write_text("a file")
    with pytest.raises(UserError, match="plain is a regular file, not a folder"):
        materialise(work, "plain/x", "text", "r")
    (work / "exists").write_text("old")
    with pytest.raises(UserError, match="exists already exists"):
        materialise(work, "exists", "new", "r")


def test_walker_reuses_open_folders_and_refuses_bad_paths(tmp_path: Path) -> None:
    (tmp_path / "a/b").mkdir(parents=True)
    for rel in ("a/b/x", "a/b/y", "a/z", "w"):
        (tmp_path / rel).write_text(rel)
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with Walker(root) as w:
            for rel in ("a/b/x", "a/b/y", "a/z", "w"):
                fd, _ = w.open_file(rel)
                with os.fdopen(fd) as f:
                    assert f.read() == rel
            with pytest.raises(Refused, match="names the folder itself"):
                w.open_file(".")
        fd = create_file(root, "new/deep/file")
        os.close(fd)
        assert (tmp_path / "new/deep/file").is_file()
    finally:
        os.close(root)
    assert parts_of("a/./b//c") == ["a", "b", "c"]
    for bad in ("/abs", "a/../b", "a\0b"):
        with pytest.raises(Refused):
            parts_of(bad)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("rel", ["top.txt", "one/two/deep.txt"])
def test_create_file_at_any_depth_refuses_links_and_leaks_no_descriptor(
        tmp_path: Path, rel: str) -> None:
    outside = tmp_path / "outside"
    outside.write_text("host")
    work = tmp_path / "work"
    work.mkdir()
    root = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        before = _open_fds()
        fd = create_file(root, rel)
        os.write(fd, b"new")
        os.close(fd)
        assert (work / rel).read_bytes() == b"new"
        with pytest.raises(Refused, match="already exists"):
            create_file(root, rel)
        (work / rel).unlink()
        (work / rel).symlink_to(outside)
        with pytest.raises(Refused, match="already exists"):
            create_file(root, rel)
        assert outside.read_text() == "host"
        assert _open_fds() == before
    finally:
        os.close(root)


@pytest.mark.parametrize("size", [0, 3, 5_000_000])
def test_write_new_file_writes_every_byte_and_never_through_a_link(tmp_path: Path, size: int) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    data = secrets.token_bytes(size)
    before = _open_fds()
    write_new_file(work, "sub/n.txt", data)
    assert (work / "sub/n.txt").read_bytes() == data
    assert _open_fds() == before
    (work / "planted").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="already exists"):
        write_new_file(work, "planted", b"x")
    assert not (tmp_path / "elsewhere").exists()
    assert _open_fds() == before


def test_refusal_message_names_the_first_paths_and_counts_the_rest(tmp_path: Path) -> None:
    t = HostTree("co", tmp_path, (), tuple((f"f{i:02}", "missing") for i in range(13)))
    msg = t.refusal_message()
    assert msg is not None and msg.startswith("tree('co'): 13 tracked paths not copied")
    assert "f09 (missing); and 3 more (all in the manifest)" in msg and "f10" not in msg
    assert json.loads(json.dumps(t.__stockade_json__()))["$tree"] == "co"
