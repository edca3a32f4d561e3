"""Toolchains through the real CLI: ``mounts:`` (a venv, a conda-like folder),
``image:`` (a busybox root filesystem as a folder, an OCI layout and a
``docker save`` tarball, built here), their place in the reuse key, and
the errors a user gets before anything runs."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.images import busybox_rootfs, docker_save, oci_layout, tree_layer
from tests.integration.conftest import Project


def make_venv(path: Path, python: str) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True)
    # A console script, as pip would install one: its shebang is the venv's python.
    tool = path / "bin" / "greet"
    tool.write_text(f"#!{path}/bin/python\nimport sys\nprint('greet from', sys.prefix)\n")
    tool.chmod(0o755)
    return path


def conda_like(path: Path, marker: str) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "lib" / "tool").mkdir(parents=True)
    (path / "lib" / "tool" / "data.txt").write_text(marker + "\n")
    tool = path / "bin" / "ctool"
    tool.write_text(f'#!/bin/sh\ncat "{path}/lib/tool/data.txt"\n')
    tool.chmod(0o755)
    return path


def manifest(project: Project, run_id: str) -> dict:  # type: ignore[type-arg]
    return json.loads((project.root / "runs" / run_id / "manifest.json").read_text())


def _reused(project: Project, run_id: str) -> dict[str, list[str | None]]:
    show = project.run("show", run_id, "--json").json()
    return {s["id"]: [(i["reused_from"] or {}).get("run_id") for i in s["items"]]
            for s in show["steps"]}


BASES = {"running": os.path.realpath(sys._base_executable), "system": "/usr/bin/python3"}


@pytest.mark.parametrize("base", sorted(BASES))
def test_tools_in_a_venv_and_a_conda_like_folder_run_via_mounts(project: Project,
                                                                base: str) -> None:
    """``running``: a venv of the interpreter running the tests, whose base may
    sit in a root-only folder (a pyenv build under /root): mounted as well.
    ``system``: a venv whose python is a symlink to /usr/bin/python3."""
    python = BASES[base]
    if not os.path.exists(python):
        pytest.fail(f"{python} is missing")
    marker = f"conda-{secrets.token_hex(6)}"
    venv = make_venv(project.path / "tools" / "venv", python)
    conda_like(project.path / "tools" / "conda", marker)
    wf = project.write("wf.yaml", """
        name: tools
        mounts: [tools/conda]
        steps:
          - id: use
            mounts: [tools/venv]
            run: |
              greet
              ctool
              python3 -c 'import sys, json; print(json.dumps([sys.prefix, sys.executable]))'
              command -v python3
    """)
    r = project.run("run", str(wf), "--run-id", "t1")
    assert r.code == 0, r.err
    out = project.run("logs", "t1", "use").out.splitlines()
    assert out[0] == f"greet from {venv}"
    assert out[1] == marker
    assert json.loads(out[2]) == [str(venv), f"{venv}/bin/python3"]  # python3 is the venv's
    assert out[3] == f"{venv}/bin/python3"
    mounts = manifest(project, "t1")["toolchains"]["use"]["mounts"]
    assert [m["path"] for m in mounts[:2]] == [str(venv), str(project.path / "tools" / "conda")]
    assert all(m["fingerprint"].startswith("stat-sha256:") for m in mounts)
    home = os.path.realpath(os.path.dirname(os.path.dirname(python)))
    implied = [m for m in mounts if m.get("implied_by")]
    if not home.startswith(("/usr", "/bin", "/lib")):
        assert [(m["path"], m["implied_by"]) for m in implied] == [(home, str(venv))]
        assert f"also mounting, read-only, what its venv runs: {home}" in r.err
    else:
        assert implied == []


def test_changing_a_mounted_folder_reruns_only_its_items(project: Project) -> None:
    conda = conda_like(project.path / "conda", "v1")
    wf = project.write("wf.yaml", """
        name: fp
        steps:
          - id: tool
            mounts: [conda]
            run: ctool
          - id: plain
            run: echo plain
    """)
    assert project.run("run", str(wf), "--run-id", "f1").code == 0
    r = project.run("run", str(wf), "--run-id", "f2", "--reuse")
    assert r.code == 0, r.err
    assert _reused(project, "f2") == {"tool": ["f1"], "plain": ["f1"]}
    # An install into the folder: a new file the step never reads.
    (conda / "lib" / "tool" / "extra.py").write_text("# installed\n")
    r = project.run("run", str(wf), "--run-id", "f3", "--reuse")
    assert r.code == 0, r.err
    got = _reused(project, "f3")
    assert got["tool"] == [None] and got["plain"][0] in ("f1", "f2")
    assert manifest(project, "f3")["toolchains"]["tool"]["mounts"][0]["fingerprint"] != \
        manifest(project, "f1")["toolchains"]["tool"]["mounts"][0]["fingerprint"]
    # Nothing changed since: reused from the run that saw the new folder.
    assert project.run("run", str(wf), "--run-id", "f4", "--reuse").code == 0
    assert _reused(project, "f4")["tool"] == ["f3"]


def test_mounts_and_images_are_checked_before_anything_runs(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: bad
        mounts: [/nonexistent/toolchain]
        steps:
          - id: a
            mounts: [missing-venv]
            image: missing-image.tar
            run: echo hi
    """)
    r = project.run("validate", str(wf))
    assert r.code == 2
    assert f"{wf}:3:10: mounts: /nonexistent/toolchain: no such file or folder" in r.err
    assert f"{wf}:6:14: mounts: missing-venv: no such file or folder (relative to the " \
           "workflow's folder)" in r.err
    assert f"{wf}:7:12: image: missing-image.tar: no such file or folder" in r.err
    r = project.run("run", str(wf))
    assert r.code == 2 and not (project.root / "runs").exists()
    near = project.write("near.yaml", """
        name: near
        steps:
          - id: a
            mounts: [.]
            run: echo hi
    """)
    r = project.run("run", str(near))
    assert r.code == 2
    assert f"{near}:5:14: mounts: . holds the stockade root {project.root}" in r.err
    assert not (project.root / "runs").exists()


def test_mounts_that_lead_to_kernel_interfaces_or_sockets_are_refused(project: Project) -> None:
    """A mount of /proc would show the host's processes in the jail (the jail's
    own /proc shows only its own). Written out, /proc, /sys, /dev and /run are
    refused with the workflow; a link that leads there, and a socket, at
    preflight: validate and run both, before anything runs."""
    import shutil
    import socket
    import tempfile

    (project.path / "procs").symlink_to("/proc/self")
    # In a short folder of its own: a socket's path must fit in 108 bytes.
    short = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    sock = short / "s.sock"
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(sock))
    written = project.write("written.yaml", """
        name: iface
        steps:
          - id: a
            mounts: [/proc]
            run: cat /proc/1/cmdline
    """)
    led = project.write("led.yaml", f"""
        name: iface
        steps:
          - id: a
            mounts: [procs, {sock}]
            run: cat /proc/1/cmdline
    """)
    try:
        for command in ("validate", "run"):
            r = project.run(command, str(written))
            assert (r.code, r.err.splitlines()) == (2, [
                f"{written}:5:14: mounts[0] '/proc' of step 'a' is /proc: mounted, the jail "
                "would see the host's processes and their command lines; mount the "
                "toolchain's own folder (a venv, /opt/tool)"]), r.err
            r = project.run(command, str(led))
            assert r.code == 2, r.err
            first, second = r.err.splitlines()
            assert first.startswith(f"{led}:5:14: mounts: procs: leads to /proc/"), first
            assert second == (f"{led}:5:21: mounts: {sock}: is a socket: a jailed step could "
                              "talk to whatever listens on it; mount the toolchain's own folder")
        assert not (project.root / "runs").exists()
    finally:
        listening.close()
        shutil.rmtree(short)


def image_sources(project: Project) -> dict[str, str]:
    rootfs = busybox_rootfs(project.path / "images" / "rootfs")
    (rootfs / "etc" / "os-release").write_text("NAME=test-busybox\n")
    layers = [tree_layer(rootfs)]
    oci_layout(project.path / "images" / "oci", layers, path="/bin:/usr/bin")
    docker_save(project.path / "images" / "saved.tar", layers, path="/bin:/usr/bin")
    return {"folder": "images/rootfs", "oci": "images/oci", "docker": "images/saved.tar"}


IMAGE_WF = """
name: img
steps:
  - id: {kind}
    image: {source}
    resources: {{memory: 256M}}
    run: |
      cat /etc/os-release
      test -e /usr/bin/python3 && echo host-python
      busybox | head -1
      echo "$PATH"
      echo done > out/done.txt
  - id: after
    needs: [{kind}]
    inputs: {{done.txt: "{{{{ steps.{kind}.outputs['done.txt'] }}}}"}}
    run: cat done.txt
"""


@pytest.mark.parametrize("kind", ["folder", "oci", "docker"])
def test_a_step_runs_in_an_image_under_bwrap_and_landlock_refuses(project: Project,
                                                                   kind: str) -> None:
    sources = image_sources(project)
    wf = project.write("wf.yaml", IMAGE_WF.format(kind=kind, source=sources[kind]))
    r = project.run("run", str(wf), "--run-id", "i1")
    if project.env.get("STOCKADE_SANDBOX") == "landlock":
        assert r.code == 2
        assert f"{wf}:5:12: image: the landlock backend cannot give a step another root " \
               "filesystem (it has no mount namespace); image: needs the bwrap backend" in r.err
        assert not (project.root / "runs").exists()  # refused before any item
        return
    assert r.code == 0, r.err
    out = project.run("logs", "i1", kind).out.splitlines()
    assert out[0] == "NAME=test-busybox"
    assert "host-python" not in out
    assert out[1].startswith("BusyBox v")
    assert out[2] == ("/bin:/usr/bin" if kind != "folder"
                      else "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    assert project.run("logs", "i1", "after").out == "done\n"
    image = manifest(project, "i1")["toolchains"][kind]["image"]
    assert image["kind"] == kind
    if kind != "folder":
        assert image["rootfs"] == str(project.root / "images" / image["digest"][7:])


def test_a_changed_image_reruns_its_step_with_reuse(project: Project) -> None:
    if project.env.get("STOCKADE_SANDBOX") == "landlock":
        project.env.pop("STOCKADE_SANDBOX")  # image: is bwrap's; the landlock case is above
    rootfs = busybox_rootfs(project.path / "rootfs")
    layers = [tree_layer(rootfs)]
    first = oci_layout(project.path / "img", layers)
    wf = project.write("wf.yaml", """
        name: imgreuse
        steps:
          - id: s
            image: img
            run: ls /etc
    """)
    assert project.run("run", str(wf), "--run-id", "g1").code == 0
    r = project.run("run", str(wf), "--run-id", "g2", "--reuse")
    assert r.code == 0, r.err
    assert _reused(project, "g2") == {"s": ["g1"]}
    # The same path, another image: one more file in it.
    (rootfs / "etc" / "motd").write_text("new\n")
    import shutil

    shutil.rmtree(project.path / "img")
    second = oci_layout(project.path / "img", [tree_layer(rootfs)])
    assert second != first
    r = project.run("run", str(wf), "--run-id", "g3", "--reuse")
    assert r.code == 0, r.err
    assert _reused(project, "g3") == {"s": [None]}
    assert "motd" in project.run("logs", "g3", "s").out
    assert manifest(project, "g3")["toolchains"]["s"]["image"]["digest"] == second
    assert sorted(os.listdir(project.root / "images")) == sorted([first[7:], second[7:]])


def test_resume_after_a_toolchain_changed_points_to_reuse(project: Project) -> None:
    conda = conda_like(project.path / "conda", "v1")
    wf = project.write("wf.yaml", """
        name: rs
        steps:
          - id: a
            mounts: [conda]
            run: test -e flag || { touch flag; exit 3; }
    """)
    assert project.run("run", str(wf), "--run-id", "r1").code == 1
    (conda / "bin" / "new-tool").write_text("#!/bin/sh\n")
    r = project.run("resume", "r1")
    assert r.code == 2
    assert f"a: mounts {conda} changed since run r1 started" in r.err and "--reuse" in r.err
