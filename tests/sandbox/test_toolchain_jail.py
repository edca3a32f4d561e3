"""Toolchains, images and shared inputs in real jails, on every launcher.

A mounted toolchain runs but cannot be changed; an ``image:`` replaces the
host's system folders under bwrap and stays read-only; a large input shared
without a copy (a bind, an engine-owned read-only hard link) can be read
but never changed. Each ``*_control`` runs the same attempt without the
protection (under ``none``) and sees it succeed.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

import pytest

from stockade.errors import InfraError
from stockade.sandbox import ExtraMount, Policy, Resources, get_backend
from stockade.sandbox._host import scan_host
from stockade.sandbox.landlock import landlock_request
from stockade.workspace.artifacts import Artifact, materialise
from stockade.workspace.placing import SHARE_MIN
from tests.images import busybox_rootfs
from tests.sandbox.conftest import World

pytestmark = pytest.mark.sandbox

ATTACK_TOOL = (
    'echo "x" >> "$1/bin/mytool"; echo "append=$?"; '
    'touch "$1/planted"; echo "touch=$?"; '
    'rm -f "$1/bin/mytool"; echo "rm=$?"; '
    'chmod 777 "$1/bin/mytool"; echo "chmod=$?"'
)


def toolchain(w: World) -> tuple[Path, str]:
    """A conda-like folder below a folder only root (or the engine) may search."""
    private = w.base / "private"
    private.mkdir(mode=0o700)
    tool = private / "conda env"
    (tool / "bin").mkdir(parents=True)
    (tool / "lib").mkdir()
    marker = f"tool-ran-{secrets.token_hex(8)}"
    (tool / "lib" / "message").write_text(marker + "\n")
    script = tool / "bin" / "mytool"
    script.write_text(f'#!/bin/sh\ncat "{tool}/lib/message"\n')
    script.chmod(0o755)
    for p in (tool, tool / "bin", tool / "lib"):
        p.chmod(0o755)
    return tool, marker


def mounted(w: World, tool: Path, script: str) -> tuple[str, int | None]:
    env = {"PATH": f"{tool}/bin:/usr/bin:/bin"}
    r = w.run(script, str(tool), mounts=(ExtraMount(tool, str(tool)),), env=env)
    return r.both, r.status


def test_a_mounted_toolchain_runs_and_cannot_be_changed(world: World) -> None:
    tool, marker = toolchain(world)
    before = (tool / "bin" / "mytool").read_bytes()
    out, status = mounted(world, tool, f"mytool; command -v mytool; {ATTACK_TOOL}")
    assert marker in out, out  # the jail ran the tool, found on PATH
    assert f"{tool}/bin/mytool" in out
    for attempt in ("append", "touch", "rm", "chmod"):
        assert f"{attempt}=0" not in out, out
    assert (tool / "bin" / "mytool").read_bytes() == before
    assert not (tool / "planted").exists()
    assert status == 0


def test_a_mounted_toolchain_control(none_world: World) -> None:
    tool, marker = toolchain(none_world)
    out, _ = mounted(none_world, tool, f"mytool; {ATTACK_TOOL}")
    assert marker in out
    assert "touch=0" in out and (tool / "planted").exists()


# -- shared inputs ----------------------------------------------------------------


def shared_input(w: World) -> tuple[Artifact, Policy, str]:
    """A large artifact of an upstream item, placed in the world's work/ as
    the world's backend shares it, and the policy that shows it."""
    data = os.urandom(SHARE_MIN + 4096)
    src = w.runs / "r1" / "make" / "0" / "work" / "out" / "big.bin"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    art = Artifact("r1", "make", 0, 1, "big.bin", digest, len(data), src)
    m = materialise(w.work, "big.bin", art, "r1", sharing=w.backend.input_sharing())
    script = (
        'sha256sum big.bin; '
        'echo x >> big.bin; echo "append=$?"; '
        ': > big.bin; echo "truncate=$?"; '
        'chmod 666 big.bin; echo "chmod=$?"; '
        'printf X | dd of=big.bin conv=notrunc 2>/dev/null; echo "dd=$?"'
    )
    shared = (ExtraMount(m.bind_source, str(w.work / "big.bin")),) if m.bind_source else ()
    policy = w.policy(["/bin/sh", "-c", script])
    policy = Policy(**{**policy.__dict__, "shared_inputs": shared})
    return art, policy, digest


def run_policy(w: World, policy: Policy) -> str:
    with open(w.meta / "out", "wb") as out, open(w.meta / "err", "wb") as err:
        running = w.backend.start(policy, stdout=out, stderr=err)
        status = running.wait(60)
        assert status is not None
    return (w.meta / "out").read_text() + (w.meta / "err").read_text()


def test_a_shared_input_can_be_read_but_never_changed(world: World) -> None:
    art, policy, digest = shared_input(world)
    out = run_policy(world, policy)
    assert f"{digest}  big.bin" in out, out  # the jail read the whole input
    assert hashlib.sha256(art.path.read_bytes()).hexdigest() == digest
    if world.backend.input_sharing() != "copy":
        # Shared, not copied: every attempt to change it failed.
        for attempt in ("append", "truncate", "chmod", "dd"):
            assert f"{attempt}=0" not in out, out


def test_a_shared_input_control(none_world: World) -> None:
    """Without a jail the same attempts go through a hard link to the artifact."""
    data = os.urandom(SHARE_MIN + 4096)
    src = none_world.runs / "r1" / "make" / "0" / "work" / "out" / "big.bin"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(data)
    art = Artifact("r1", "make", 0, 1, "big.bin", hashlib.sha256(data).hexdigest(),
                   len(data), src)
    m = materialise(none_world.work, "big.bin", art, "r1", sharing="link")
    assert m.source.get("shared") in ("hardlink", "reflink")
    out = run_policy(none_world, none_world.policy(
        ["/bin/sh", "-c", "chmod 666 big.bin; echo x >> big.bin; echo append=$?"]))
    assert "append=0" in out
    if m.source["shared"] == "hardlink":
        assert src.read_bytes() != data


# -- images -------------------------------------------------------------------------


@pytest.fixture(params=["bwrap", "bwrap-helper"])
def bwrap_world(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                tmp_path: Path) -> World:
    from tests.sandbox.conftest import available_backend, make_world

    backend = available_backend(request, request.param)
    base = Path(os.path.realpath(tmp_path)) / "w"
    base.mkdir()
    return make_world(backend, base)


IMAGE_SCRIPT = (
    'cat /etc/passwd; '
    'test -e /usr/bin/python3 && echo host-python-visible; '
    'test -e "$1" && echo image-path-visible; '
    'touch /bin/planted; echo "touch=$?"; '
    'echo x > /etc/passwd; echo "passwd=$?"; '
    'touch "$1/planted"; echo "hostpath=$?"; '
    'ulimit -v; echo "work=$(pwd)"; echo out > out/o.txt'
)


def test_a_step_runs_in_an_image_root(bwrap_world: World, tmp_path: Path) -> None:
    w = bwrap_world
    image = busybox_rootfs(tmp_path / "rootfs")
    marker = f"image-root-{secrets.token_hex(8)}"
    (image / "etc" / "passwd").write_text(f"{marker}:x:0:0::/:/bin/sh\n")
    policy = w.policy(["/bin/sh", "-c", IMAGE_SCRIPT, "sh", str(image)],
                      env={"PATH": "/bin"}, resources=Resources(memory_bytes=256 << 20))
    policy = Policy(**{**policy.__dict__, "image_root": image})
    out = run_policy(w, policy)
    assert marker in out, out  # the jail ran, with the image's /etc
    assert "host-python-visible" not in out and "image-path-visible" not in out
    for attempt in ("touch", "passwd", "hostpath"):
        assert f"{attempt}=0" not in out, out
    assert f"work={w.work}" in out and (w.work / "out" / "o.txt").read_text() == "out\n"
    assert "262144" in out  # resources as the launcher's rlimits (no prlimit in an image)
    assert (image / "etc" / "passwd").read_text().startswith(marker)
    assert not (image / "bin" / "planted").exists() and not (image / "planted").exists()


def test_an_image_root_control(none_world: World, tmp_path: Path) -> None:
    """Without bwrap the host's system folders and the image folder are right there."""
    image = busybox_rootfs(tmp_path / "rootfs", applets=["true"])
    r = none_world.run('test -e /usr/bin/python3 && echo host-python-visible; '
                       'touch "$1/planted"; echo "hostpath=$?"', str(image))
    assert "host-python-visible" in r.out and "hostpath=0" in r.out


@pytest.mark.parametrize("name", ["landlock", "none"])
def test_backends_without_a_mount_namespace_refuse_an_image(name: str, tmp_path: Path) -> None:
    backend = get_backend(name)
    if not backend.availability().available:
        pytest.skip(f"{name} is not available here")
    # What the runner reads to refuse image: at run start says the same.
    assert not backend.mount_namespace and get_backend("bwrap").mount_namespace
    (tmp_path / "work").mkdir()
    policy = Policy(argv=("/bin/true",), work_dir=tmp_path / "work", scratch_dir=tmp_path / "s",
                    env={"PATH": "/bin"}, image_root=tmp_path)
    with pytest.raises(InfraError, match="image: needs the bwrap backend"):
        if name == "landlock":
            landlock_request(policy, abi=4, layout=scan_host())
        else:
            backend.start(policy, stdout=1, stderr=2)
