"""The engine as an ordinary user: no uid switch, no bridges, the common case.

The rest of the suite runs as root here; this file starts a small engine as
``nobody`` (system Python, the sandbox package is stdlib-only) and checks
that both backends still prove enforcement and contain a fork bomb, and
that landlock states what it cannot enforce of ``network: proxy`` without
a network namespace of its own (``test_landlock_netns``). The
engine imports a world-readable copy of the package: the checkout may sit
in a folder only root can enter (a private clone, ``/root/...``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.nobody import AS_NOBODY, need_nobody, readable_package

pytestmark = pytest.mark.sandbox


SCRIPT = """
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from stockade.sandbox import Policy, Resources, get_backend, probe
out = {}
for name in ("bwrap", "landlock"):
    b = get_backend(name)
    report = probe(b)
    base = Path(tempfile.mkdtemp(dir=sys.argv[2]))
    (base / "work").mkdir(); (base / "scratch").mkdir()
    code = ("import os, time\\nn = 0\\nwhile n < 300:\\n    try:\\n        pid = os.fork()\\n"
            "    except OSError:\\n        break\\n    if pid == 0:\\n        time.sleep(2)\\n"
            "        os._exit(0)\\n    n += 1\\nprint(n)\\n")
    pol = Policy(argv=("/usr/bin/python3", "-c", code), work_dir=base / "work",
                 scratch_dir=base / "scratch", env={"PATH": "/usr/bin:/bin"},
                 resources=Resources(processes=20))
    with open(base / "out", "wb") as f:
        b.start(pol, stdout=f, stderr=f).wait(60)
    out[name] = {"enforced": report.enforced, "uid": os.getuid(),
                 "forked": (base / "out").read_text().strip(),
                 "limitations": list(report.limitations),
                 "network_gaps": list(b.network_gaps("proxy"))}
    b.close()
print(json.dumps(out))
"""


def test_backends_work_for_an_unprivileged_engine() -> None:
    need_nobody()
    scratch = Path(tempfile.mkdtemp(prefix="stockade-nonroot-"))
    scratch.chmod(0o777)
    try:
        with readable_package() as src:
            p = subprocess.run(
                [*AS_NOBODY, "/usr/bin/python3", "-I", "-c", SCRIPT, str(src), str(scratch)],
                env={"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch)},
                cwd=scratch, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.splitlines()[-1])
    for name in ("bwrap", "landlock"):
        assert result[name]["enforced"] is True, result
        assert result[name]["uid"] == 65534
        assert int(result[name]["forked"]) < 25, result
    assert result["bwrap"]["network_gaps"] == []
    (gap,) = result["landlock"]["network_gaps"]
    assert "the engine is not root" in gap and "any address on the relay's port" in gap
    assert any(
        line.startswith("network: proxy runs on the host's network stack (the engine is not root)")
        for line in result["landlock"]["limitations"]
    ), result


SHARED_SCRIPT = """
import hashlib, json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from stockade.sandbox import ExtraMount, Policy, get_backend
from stockade.workspace.artifacts import Artifact, materialise
out = {}
data = os.urandom(2 << 20)
digest = hashlib.sha256(data).hexdigest()
for name in ("bwrap", "landlock"):
    b = get_backend(name)
    base = Path(tempfile.mkdtemp(dir=sys.argv[2]))
    (base / "work").mkdir(); (base / "scratch").mkdir()
    src = base / "producer" / "big.bin"
    src.parent.mkdir()
    src.write_bytes(data)
    tool = base / "tool"
    (tool / "bin").mkdir(parents=True)
    (tool / "bin" / "mytool").write_text("#!/bin/sh\\necho tool-ran\\n")
    (tool / "bin" / "mytool").chmod(0o755)
    art = Artifact("r", "make", 0, 1, "big.bin", digest, len(data), src)
    m = materialise(base / "work", "big.bin", art, "r", sharing=b.input_sharing())
    shared = (ExtraMount(m.bind_source, str(base / "work" / "big.bin")),) if m.bind_source else ()
    script = ("mytool; sha256sum big.bin; chmod 666 big.bin; echo x >> big.bin; "
              "echo append=$?; touch $1/bin/planted; echo plant=$?")
    pol = Policy(argv=("/bin/sh", "-c", script, "sh", str(tool)), work_dir=base / "work",
                 scratch_dir=base / "scratch", env={"PATH": f"{tool}/bin:/usr/bin:/bin"},
                 mounts=(ExtraMount(tool, str(tool)),), shared_inputs=shared)
    with open(base / "out", "wb") as f:
        b.start(pol, stdout=f, stderr=f).wait(60)
    out[name] = {"sharing": b.input_sharing(), "shared": m.source.get("shared", "copy"),
                 "out": (base / "out").read_text(),
                 "intact": hashlib.sha256(src.read_bytes()).hexdigest() == digest,
                 "planted": (tool / "bin" / "planted").exists()}
    b.close()
print(json.dumps(out))
"""


def test_toolchains_and_shared_inputs_for_an_unprivileged_engine() -> None:
    """bwrap binds a large input read-only; landlock (the jail keeps the
    engine's uid, which owns the artifact) copies it. Neither jail changes
    the artifact or the mounted toolchain."""
    need_nobody()
    scratch = Path(tempfile.mkdtemp(prefix="stockade-nonroot-"))
    scratch.chmod(0o777)
    try:
        with readable_package() as src:
            p = subprocess.run(
                [*AS_NOBODY, "/usr/bin/python3", "-I", "-c", SHARED_SCRIPT, str(src), str(scratch)],
                env={"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch)},
                cwd=scratch, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.splitlines()[-1])
    assert (result["bwrap"]["sharing"], result["bwrap"]["shared"]) == ("bind", "bind")
    assert result["landlock"]["sharing"] == "copy"
    for name in ("bwrap", "landlock"):
        r = result[name]
        assert "tool-ran" in r["out"], r  # the jail ran, with the mount on PATH
        assert r["intact"] and not r["planted"], r
        assert "plant=0" not in r["out"], r
    assert "append=0" not in result["bwrap"]["out"]


IMAGE_SCRIPT = """
import json, sys, tempfile
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from stockade.sandbox import Policy, Resources, get_backend
b = get_backend("bwrap")
base = Path(tempfile.mkdtemp(dir=sys.argv[2]))
(base / "work").mkdir(); (base / "scratch").mkdir()
pol = Policy(argv=("/bin/sh", "-c", "cat /etc/passwd; ulimit -v; id -u; touch /bin/x; echo t=$?"),
             work_dir=base / "work", scratch_dir=base / "scratch", env={"PATH": "/bin"},
             image_root=Path(sys.argv[3]), resources=Resources(memory_bytes=128 << 20))
with open(base / "out", "wb") as f:
    status = b.start(pol, stdout=f, stderr=f).wait(60)
print(json.dumps({"status": status, "out": (base / "out").read_text()}))
b.close()
"""


def test_an_image_root_for_an_unprivileged_engine() -> None:
    from tests.images import busybox_rootfs

    need_nobody()
    scratch = Path(tempfile.mkdtemp(prefix="stockade-nonroot-"))
    scratch.chmod(0o777)
    try:
        rootfs = busybox_rootfs(scratch / "rootfs", applets=["cat", "id", "touch"])
        (rootfs / "etc" / "passwd").write_text("image-passwd:x:0:0::/:/bin/sh\n")
        for folder, _dirs, _files in os.walk(scratch):
            os.chmod(folder, 0o755)
        scratch.chmod(0o777)
        with readable_package() as src:
            p = subprocess.run(
                [*AS_NOBODY, "/usr/bin/python3", "-I", "-c", IMAGE_SCRIPT, str(src), str(scratch),
                 str(rootfs)],
                env={"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch)},
                cwd=scratch, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.splitlines()[-1])
    assert result["status"] == 0, result
    lines = result["out"].splitlines()
    assert lines[:3] == ["image-passwd:x:0:0::/:/bin/sh", "131072", "65534"], result
    assert "t=0" not in result["out"]
