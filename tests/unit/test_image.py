"""``image:`` sources: layers applied with whiteouts, unsafe entries refused,
OCI layouts and ``docker save`` tarballs unpacked once by config digest, and
the plan of bwrap's root. Every image here is written by the test."""

from __future__ import annotations

import gzip
import io
import json
import os
import secrets
import stat
import tarfile
from pathlib import Path

import pytest

from stockade.errors import InfraError
from stockade.sandbox import Policy, Resources
from stockade.sandbox._bwrap_argv import bwrap_argv, image_limits, image_points
from stockade.sandbox._host import HostLayout
from stockade.sandbox._layers import LayerRefused, Tree, resolve_in
from stockade.sandbox.image import ImageError, RootOp, open_image, root_plan
from tests.images import Entry, docker_save, layer, oci_layout

SH = Entry("bin/sh", data=b"#!fake shell\n", mode=0o755)


def unpack(tmp_path: Path, *layers: bytes) -> Path:
    """Layers through an OCI layout and ``open_image``: the unpacked root."""
    layout = tmp_path / f"oci-{secrets.token_hex(4)}"
    oci_layout(layout, [layer([Entry("bin", "dir", mode=0o755), SH]), *layers])
    return Path(open_image(str(layout), tmp_path / "cache").rootfs)


def test_whiteouts_remove_what_lower_layers_made(tmp_path: Path) -> None:
    lower = layer([
        Entry("etc", "dir"), Entry("etc/keep", data=b"k"), Entry("etc/gone", data=b"g"),
        Entry("var", "dir"), Entry("var/cache", "dir"), Entry("var/cache/a", data=b"a"),
        Entry("opt", "dir"), Entry("opt/old", data=b"o"), Entry("opt/sub", "dir"),
        Entry("opt/sub/deep", data=b"d"),
    ])
    upper = layer([
        Entry("etc/.wh.gone"),
        Entry("var/.wh.cache"),
        # The opaque marker after and before entries of the same layer: they stay.
        Entry("opt/new", data=b"n"),
        Entry("opt/.wh..wh..opq"),
        Entry("opt/sub", "dir"),
        Entry("opt/sub/fresh", data=b"f"),
    ])
    root = unpack(tmp_path, lower, upper)
    assert sorted(os.listdir(root / "etc")) == ["keep"]
    assert os.listdir(root / "var") == []
    assert sorted(os.listdir(root / "opt")) == ["new", "sub"]
    assert os.listdir(root / "opt" / "sub") == ["fresh"]
    assert not any(n.startswith(".wh.") for _, ds, fs in os.walk(root) for n in ds + fs)


def test_later_layers_replace_entries_of_any_kind(tmp_path: Path) -> None:
    root = unpack(
        tmp_path,
        layer([Entry("a", "dir"), Entry("a/x", data=b"1"), Entry("b", data=b"file"),
               Entry("c", "symlink", link="b")]),
        layer([Entry("a", data=b"now a file"), Entry("b", "dir"), Entry("c", data=b"file c"),
               Entry("h", "hardlink", link="c")]),
    )
    assert (root / "a").read_bytes() == b"now a file"
    assert (root / "b").is_dir()
    assert not (root / "c").is_symlink() and (root / "c").read_bytes() == b"file c"
    assert os.stat(root / "h").st_ino == os.stat(root / "c").st_ino


def test_modes_lose_set_id_and_group_or_other_write(tmp_path: Path) -> None:
    root = unpack(tmp_path, layer([
        Entry("su", data=b"x", mode=0o4777), Entry("secret", data=b"x", mode=0o600),
        Entry("tool", data=b"x", mode=0o700), Entry("d", "dir", mode=0o1777),
    ]))
    assert stat.S_IMODE(os.stat(root / "su").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "secret").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(root / "tool").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "d").st_mode) == 0o755
    assert os.stat(root / "su").st_uid == os.geteuid()


UNSAFE = [
    ("absolute", [Entry("/abs-escape", data=b"x")], "is an absolute path"),
    ("dotdot", [Entry("../dotdot-escape", data=b"x")], "contains '..'"),
    ("dotdot-inner", [Entry("a/../../dotdot-escape", data=b"x")], "contains '..'"),
    ("symlink-climbs", [Entry("up", "symlink", link="../../"),
                        Entry("up/link-escape", data=b"x")], "leads above the image's root"),
    ("below-symlink", [Entry("abs", "symlink", link="/"),
                       Entry("abs/below-escape", data=b"x")], "which is not a folder"),
    ("hardlink-outside", [Entry("h", "hardlink", link="../outside.txt")], "contains '..'"),
    ("hardlink-absolute", [Entry("h", "hardlink", link="/etc/hostname")],
     "is an absolute path"),
    ("hardlink-missing", [Entry("h", "hardlink", link="nothere")], "no such entry"),
    ("device", [Entry("null", "chr")], "is a device"),
    ("fifo", [Entry("pipe", "fifo")], "is a fifo"),
]


@pytest.mark.parametrize(("entries", "why"), [u[1:] for u in UNSAFE], ids=[u[0] for u in UNSAFE])
def test_unsafe_entries_refuse_the_image_and_write_nothing_outside(
        tmp_path: Path, entries: list[Entry], why: str) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("host file\n")
    cache = tmp_path / "deep" / "er" / "cache"
    layout = tmp_path / "oci"
    oci_layout(layout, [layer([SH, *entries])])
    with pytest.raises(ImageError, match=why):
        open_image(str(layout), cache)
    # Nothing under any name: no image, no staging folder; nothing written around it.
    assert os.listdir(cache) == []
    assert outside.read_text() == "host file\n"
    planted = [p for p in tmp_path.rglob("*escape*")]
    assert planted == [], planted


def test_the_same_attacks_escape_a_naive_extraction(tmp_path: Path) -> None:
    """Positive control: extracting those layers with tarfile's trusting filter
    writes outside the target, which is what the refusals above prevent."""
    target = tmp_path / "a" / "b" / "target"
    target.mkdir(parents=True)
    data = layer([Entry("../dotdot-escape", data=b"x"), Entry("up", "symlink", link="../../"),
                  Entry("up/link-escape", data=b"x")])
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        t.extractall(target, filter="fully_trusted")
    assert (tmp_path / "a" / "b" / "dotdot-escape").exists()
    assert (tmp_path / "a" / "link-escape").exists()


def test_a_layer_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    layout = tmp_path / "oci"
    oci_layout(layout, [layer([SH])], compress=False)
    # Change a byte of the layer blob, keep its name (the config's diff_id).
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((layout / "blobs" / "sha256" / index["manifests"][0]["digest"][7:])
                          .read_bytes())
    blob = layout / "blobs" / "sha256" / manifest["layers"][0]["digest"][7:]
    data = bytearray(blob.read_bytes())
    data[data.index(b"#!fake")] = ord("X")
    blob.write_bytes(bytes(data))
    with pytest.raises(ImageError, match=r"hashes to sha256:.*not to sha256:.*as the image's config"):
        open_image(str(layout), tmp_path / "cache")
    assert os.listdir(tmp_path / "cache") == []


@pytest.mark.parametrize("compress", [True, False])
def test_oci_layout_and_docker_save_share_one_cache_entry(tmp_path: Path, compress: bool) -> None:
    layers = [layer([Entry("bin", "dir"), SH, Entry("etc", "dir"),
                     Entry("etc/hello", data=b"hi\n")])]
    digest = oci_layout(tmp_path / "oci", layers, compress=compress, path="/bin:/opt/bin")
    assert docker_save(tmp_path / "image.tar", layers, path="/bin:/opt/bin") == digest
    first = open_image(str(tmp_path / "oci"), tmp_path / "cache")
    second = open_image(str(tmp_path / "image.tar"), tmp_path / "cache")
    assert (first.kind, second.kind) == ("oci", "docker")
    assert first.digest == second.digest == digest
    assert first.unpacked and not second.unpacked
    assert first.rootfs == second.rootfs == str(tmp_path / "cache" / digest[7:])
    assert first.path == "/bin:/opt/bin"
    assert (Path(first.rootfs) / "etc" / "hello").read_text() == "hi\n"
    assert sorted(os.listdir(tmp_path / "cache")) == [digest[7:]]


def test_an_oci_index_gives_the_image_for_this_machine(tmp_path: Path) -> None:
    digest = oci_layout(tmp_path / "oci", [layer([SH])], platforms=["linux/s390x", "windows/amd64"])
    assert open_image(str(tmp_path / "oci"), tmp_path / "cache").digest == digest


def test_images_for_other_machines_and_shell_less_images_are_refused(tmp_path: Path) -> None:
    layout = tmp_path / "oci"
    oci_layout(layout, [layer([SH])])
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0]["platform"] = {"os": "linux", "architecture": "mips64"}
    (layout / "index.json").write_text(json.dumps(index))
    with pytest.raises(ImageError, match=r"has no image for linux/.* \(it has: linux/mips64\)"):
        open_image(str(layout), tmp_path / "cache")
    oci_layout(tmp_path / "nosh", [layer([Entry("etc", "dir")])])
    with pytest.raises(ImageError, match="has no /bin/sh"):
        open_image(str(tmp_path / "nosh"), tmp_path / "cache")
    (tmp_path / "notimage").write_bytes(gzip.compress(b"not a tar"))
    with pytest.raises(ImageError, match=r"neither a folder nor a tar archive|not an image"):
        open_image(str(tmp_path / "notimage"), tmp_path / "cache")


def test_a_folder_is_used_in_place_and_its_digest_follows_its_files(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "busybox").write_text("x")
    (root / "bin" / "sh").symlink_to("busybox")
    one = open_image(str(root), tmp_path / "cache")
    assert (one.kind, one.rootfs) == ("folder", str(root))
    assert open_image(str(root), tmp_path / "cache").digest == one.digest
    (root / "bin" / "tool").write_text("new")
    assert open_image(str(root), tmp_path / "cache").digest != one.digest
    assert not (tmp_path / "cache").exists()


def test_resolve_in_follows_links_inside_the_root_only(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "busybox").write_text("x")
    (root / "bin").symlink_to("/usr/bin")  # absolute: inside the jail's root
    (root / "usr" / "bin" / "sh").symlink_to("../../../../../usr/bin/busybox")
    assert resolve_in(str(root), "/bin/sh") == str(root / "usr" / "bin" / "busybox")
    assert resolve_in(str(root), "/bin/python3") is None


def test_root_plan_splits_only_the_folders_on_the_way_to_a_mount(tmp_path: Path) -> None:
    listing = {
        "/img": [("bin", stat.S_IFLNK | 0o777, "usr/bin"), ("etc", stat.S_IFDIR | 0o755, ""),
                 ("home", stat.S_IFDIR | 0o755, ""), ("proc", stat.S_IFDIR | 0o755, ""),
                 ("tmp", stat.S_IFDIR | 0o755, ""), ("usr", stat.S_IFDIR | 0o755, ""),
                 ("work", stat.S_IFREG | 0o644, "")],
        "/img/home": [("user", stat.S_IFDIR | 0o755, "")],
        "/img/usr": [("bin", stat.S_IFDIR | 0o755, ""), ("local", stat.S_IFDIR | 0o755, "")],
        "/img/usr/local": [("share", stat.S_IFDIR | 0o755, "")],
    }
    ops = root_plan("/img", ["/proc", "/tmp", "/home/stockade", "/usr/local/cuda", "/work/x"],
                    lambda folder: listing[folder])
    # /proc and /tmp are mounts of their own; /work is a file where a mount
    # needs a folder, so the mount wins.
    assert ops == [
        RootOp("symlink", "usr/bin", "/bin"),
        RootOp("bind", "etc", "/etc"),
        RootOp("dir", "", "/home"),
        RootOp("bind", "home/user", "/home/user"),
        RootOp("dir", "", "/usr"),
        RootOp("bind", "usr/bin", "/usr/bin"),
        RootOp("dir", "", "/usr/local"),
        RootOp("bind", "usr/local/share", "/usr/local/share"),
    ]


def test_bwrap_argv_with_an_image(tmp_path: Path) -> None:
    work = Path("/runs/r/s/0/work")
    pol = Policy(argv=("/bin/sh", "-c", "x"), work_dir=work, scratch_dir=Path("/scr"),
                 env={"PATH": "/bin"}, image_root=Path("/root/.stockade/images/abc"),
                 resources=Resources(memory_bytes=1 << 30))
    layout = HostLayout(symlinks={"/bin": "usr/bin"}, dirs=("/usr",), etc=("/etc/passwd",),
                        prlimit="/usr/bin/prlimit", python="/usr/bin/python3",
                        etc_dir="/tmp/etc")
    ops = [RootOp("bind", "usr", "/usr"), RootOp("symlink", "usr/bin", "/bin"),
           RootOp("dir", "", "/home")]
    argv = bwrap_argv(pol, layout, seccomp_fd=4, root_ops=ops,
                      sources={"/root/.stockade/images/abc": "/bridge/1"})
    middle = argv[argv.index("stockade") + 1: argv.index("--proc")]
    assert middle == ["--ro-bind", "/bridge/1/usr", "/usr", "--symlink", "usr/bin", "/bin",
                      "--dir", "/home"]
    # No host system folder, no host /etc, no prlimit of the host's.
    assert "/etc" not in argv and "/usr/bin/prlimit" not in argv
    assert argv[argv.index("--") + 1:] == ["/bin/sh", "-c", "x"]
    assert image_points(pol) == ["/proc", "/dev", "/tmp", "/home/stockade", str(work)]
    with pytest.raises(InfraError, match="plan of the jail's root"):
        bwrap_argv(pol, layout, seccomp_fd=4)
    with pytest.raises(InfraError, match="network: proxy cannot be used with image"):
        bwrap_argv(Policy(**{**pol.__dict__, "network": "proxy"}), layout, seccomp_fd=4,
                   root_ops=ops)


def test_image_limits_are_the_launchers() -> None:
    import resource

    r = Resources(memory_bytes=1 << 28, cpu_seconds=5, processes=10, file_size_bytes=1 << 20)
    assert image_limits(r, jail_uid=True) == [
        (resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, 1 << 28), (resource.RLIMIT_CPU, 5),
        (resource.RLIMIT_FSIZE, 1 << 20), (resource.RLIMIT_NPROC, 12)]
    assert (resource.RLIMIT_NPROC, 12) not in image_limits(r, jail_uid=False)


def test_a_whiteout_must_name_an_entry(tmp_path: Path) -> None:
    (tmp_path / "root" / "a").mkdir(parents=True)
    data = layer([Entry("a", "dir"), Entry("a/.wh.")])
    with Tree(str(tmp_path / "root")) as tree, tarfile.open(fileobj=io.BytesIO(data)) as t, \
            pytest.raises(LayerRefused, match="names no entry"):
        tree.whiteouts(t)
