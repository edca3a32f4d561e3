"""Toolchain mounts: the stat fingerprint that enters the reuse key, what a
venv needs outside itself, and how a step's toolchain shapes PATH and mounts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stockade.runner.toolchains import MountUse, Toolchain, changed
from stockade.sandbox import ExtraMount
from stockade.sandbox.bwrap import BwrapBackend
from stockade.sandbox.image import Image
from stockade.sandbox.policy import SYSTEM_DIRS
from stockade.sandbox.toolchain import (
    OutsideLink,
    fingerprint,
    needs_of,
    venv_base,
)


def conda_like(root: Path, files: int = 200) -> Path:
    for i in range(files):
        d = root / "lib" / f"pkg{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i}.py").write_text(f"x = {i}\n")
    (root / "bin").mkdir(exist_ok=True)
    (root / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    (root / "bin" / "tool").chmod(0o755)
    return root


def test_every_kind_of_install_changes_the_fingerprint(tmp_path: Path) -> None:
    env = conda_like(tmp_path / "env")
    base = fingerprint(str(env))
    assert base.entries == 1 + 20 + 200 + 2 + 1  # itself, folders, files, bin/, bin/tool
    assert fingerprint(str(env)) == base
    seen = {base.digest}

    def step(change: str) -> None:
        got = fingerprint(str(env)).digest
        assert got not in seen, f"{change} did not change the fingerprint"
        seen.add(got)

    (env / "lib" / "pkg3" / "new.py").write_text("new\n")
    step("a new file")
    (env / "lib" / "pkg4" / "m4.py").unlink()
    step("a removed file")
    target = env / "lib" / "pkg5" / "m5.py"
    st = target.stat()
    target.write_text("x = 9\n")  # same size
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime
    step("a file rewritten in place with its size and mtime kept")
    replacement = env / "lib" / "pkg6" / ".m6.tmp"
    replacement.write_text((env / "lib" / "pkg6" / "m6.py").read_text())
    os.replace(replacement, env / "lib" / "pkg6" / "m6.py")  # what pip does
    step("a file replaced by rename")
    (env / "bin" / "tool").chmod(0o700)
    step("a mode change")
    (env / "bin" / "python").symlink_to("/usr/bin/python3")
    step("a new symlink")


def test_fingerprint_reads_no_contents_and_handles_many_files(tmp_path: Path) -> None:
    env = conda_like(tmp_path / "env", files=5000)
    (env / "big.bin").write_bytes(b"\0" * (8 << 20))
    t0 = time.process_time()
    fp = fingerprint(str(env))
    # Not a timing assertion (the machine is shared): a content hash of 8 MiB
    # alone would take far longer than reading 5,000 stat results.
    assert fp.entries == 1 + 20 + 5000 + 2 + 1 + 1
    assert time.process_time() - t0 < 20
    # A single file works too.
    assert fingerprint(str(env / "big.bin")).entries == 1


def test_a_venvs_base_interpreter_is_an_implied_mount(tmp_path: Path) -> None:
    base = tmp_path / "pyenv" / "versions" / "3.11.7"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python3.11").write_text("")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base}/bin\ninclude-system-site-packages = false\n")
    (venv / "bin" / "python").symlink_to(base / "bin" / "python3.11")
    (venv / "bin" / "python3").symlink_to("python")
    assert venv_base(str(venv)) == str(base)
    implied, missing = needs_of([str(venv)], SYSTEM_DIRS)
    assert implied == [(str(base), str(venv))]
    assert missing == []
    # Already visible (a system python): nothing implied.
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert needs_of([str(venv)], SYSTEM_DIRS)[0] == []


def test_bin_links_that_lead_out_of_the_jail_are_named(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "real-tool").write_text("")
    env = conda_like(tmp_path / "env", files=1)
    (env / "bin" / "out").symlink_to(elsewhere / "real-tool")
    (env / "bin" / "dangling").symlink_to(tmp_path / "gone")
    (env / "bin" / "sys").symlink_to("/usr/bin/env")
    (env / "bin" / "own").symlink_to("tool")
    _implied, missing = needs_of([str(env)], SYSTEM_DIRS)
    assert missing == [OutsideLink(str(env / "bin" / "out"), str(elsewhere / "real-tool"))]
    # Under an image the host's /usr is not there either.
    _, missing = needs_of([str(env)], [])
    assert [m.link for m in missing] == [str(env / "bin" / "out"), str(env / "bin" / "sys")]
    # Mounting the other folder too settles it.
    assert needs_of([str(env), str(elsewhere)], SYSTEM_DIRS)[1] == []


def test_a_toolchain_puts_its_bins_first_and_keys_its_fingerprints(tmp_path: Path) -> None:
    venv, conda = tmp_path / "venv", tmp_path / "conda"
    for p in (venv / "bin", conda / "bin"):
        p.mkdir(parents=True)
    (tmp_path / "nobin").mkdir()
    tc = Toolchain((
        MountUse(str(venv), str(venv), "stat-sha256:a", 3),
        MountUse(str(conda), "/opt/conda", "stat-sha256:b", 3),
        MountUse(str(tmp_path / "nobin"), str(tmp_path / "nobin"), "stat-sha256:c", 1),
        MountUse(str(tmp_path / "base"), str(tmp_path / "base"), "stat-sha256:d", 9,
                 implied_by=str(venv)),
    ))
    assert tc.path_for(f"/usr/bin:{venv}/bin:/bin") == \
        f"{venv}/bin:{conda}/bin:/usr/bin:/bin"
    assert tc.key() == {"mounts": [[str(venv), str(venv), "stat-sha256:a"],
                                   ["/opt/conda", str(conda), "stat-sha256:b"],
                                   [str(tmp_path / "nobin")] * 2 + ["stat-sha256:c"],
                                   [str(tmp_path / "base")] * 2 + ["stat-sha256:d"]]}
    # A backend that can show a folder elsewhere also gets the declared path.
    assert ExtraMount(conda, "/opt/conda") in tc.mounts_for(True)
    assert all(m.target == str(m.source) for m in tc.mounts_for(False))
    image = Image("/img", "oci", "sha256:" + "0" * 64, "/cache/0", "/bin:/usr/bin")
    with_image = Toolchain(tc.mounts[:1], image)
    assert with_image.path_for("/usr/local/bin:/usr/bin") == f"{venv}/bin:/bin:/usr/bin"
    assert with_image.key()["image"] == "sha256:" + "0" * 64
    assert Toolchain().key() == {} and not Toolchain()


def test_resume_notices_a_changed_toolchain() -> None:
    tc = Toolchain((MountUse("/opt/t", "/opt/t", "stat-sha256:new", 2),),
                   Image("/img", "folder", "stat-sha256:i2", "/img"))
    before = {"s": {"mounts": [{"path": "/opt/t", "fingerprint": "stat-sha256:old"}],
                    "image": {"digest": "stat-sha256:i1"}}}
    assert changed(before, {"s": tc}) == ["s: mounts /opt/t", "s: image /img"]
    same = {"s": {"mounts": [{"path": "/opt/t", "fingerprint": "stat-sha256:new"}],
                  "image": {"digest": "stat-sha256:i2"}}}
    assert changed(same, {"s": tc}) == []


@pytest.mark.parametrize("where", ["inside", "holding"])
def test_a_mount_may_not_show_the_run_root(tmp_path: Path, where: str) -> None:
    from stockade.errors import UserError
    from stockade.runner.toolchains import resolve
    from stockade.spec import load_workflow

    root = tmp_path / "proj" / ".stockade"
    root.mkdir(parents=True)
    mount = ".stockade/runs" if where == "inside" else "."
    (root / "runs").mkdir()
    wf = f"name: w\nsteps:\n  - id: a\n    mounts: [{mount}]\n    run: x\n"
    spec = load_workflow(wf.encode(), "wf.yaml")
    with pytest.raises(UserError, match=r"wf.yaml:4:14: mounts: .* holds the stockade root"):
        resolve(spec, tmp_path / "proj", root, BwrapBackend, lambda _: None)
