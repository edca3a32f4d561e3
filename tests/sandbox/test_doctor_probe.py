"""``doctor``, ``probe`` and selection against the real backends of this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from stockade.cli.doctor_cmd import doctor as doctor_cmd
from stockade.errors import InfraError
from stockade.sandbox import get_backend, probe, select_backend, start_line

pytestmark = pytest.mark.sandbox


def _available(name: str) -> None:
    b = get_backend(name)
    if not b.availability().available:
        pytest.skip(f"{name} is not available here: {b.availability().reason}")


@pytest.mark.parametrize("name", ["bwrap", "landlock"])
def test_probe_proves_enforcement(name: str) -> None:
    _available(name)
    report = probe(get_backend(name))
    assert report.enforced, report.reason
    assert report.checks == {
        "jail_ran": True,
        "read_canary_blocked": True,
        "write_outside_blocked": True,
        "host_env_hidden": True,
    }


def test_none_is_never_enforced() -> None:
    report = probe(get_backend("none"))
    assert report.available and not report.enforced
    assert report.checks["read_canary_blocked"] is False  # the probe saw the escape


def test_doctor_json_reports_the_enforced_backend() -> None:
    _available("bwrap")
    result = CliRunner().invoke(doctor_cmd, ["--json"], env={"STOCKADE_SANDBOX": ""})
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["active"] == "bwrap" and data["enforced"] is True
    names = {b["name"]: b for b in data["backends"]}
    assert set(names) == {"bwrap", "landlock", "sandbox-exec", "none"}
    assert names["sandbox-exec"]["available"] is False
    assert names["none"]["enforced"] is False
    assert data["start_line"] == "sandbox: bwrap (enforced)"


def test_doctor_human_output() -> None:
    result = CliRunner().invoke(doctor_cmd, [], env={"STOCKADE_SANDBOX": ""})
    assert result.exit_code == 0
    assert "sandbox:" in result.output and "none" in result.output


@pytest.mark.parametrize(
    ("requested", "env", "expected"),
    [
        ("landlock", {}, "landlock"),
        (None, {"STOCKADE_SANDBOX": "landlock"}, "landlock"),
        ("none", {"STOCKADE_SANDBOX": "bwrap"}, "none"),
        (None, {}, "bwrap"),
    ],
)
def test_selection(requested: str | None, env: dict[str, str], expected: str) -> None:
    _available("bwrap")
    _available("landlock")
    sel = select_backend(requested, env)
    assert sel.backend.name == expected
    line = start_line(sel)
    if expected == "none":
        assert line == "sandbox: none (NOT ENFORCED: steps can read and write the whole host)"
    else:
        assert line == f"sandbox: {expected} (enforced)"


@pytest.mark.parametrize(("name", "hint"), [("sandbox-exec", "macOS"), ("nosuch", "choose one")])
def test_unavailable_or_unknown_backend_is_refused(name: str, hint: str) -> None:
    with pytest.raises(InfraError, match=hint):
        select_backend(name, {})


def test_a_tmpdir_below_a_private_folder_keeps_bwrap_enforced(tmp_path: Path) -> None:
    """A root engine's jails run as uids of their own, and bwrap (as that
    uid) must reach the bridge points the backend makes in a temp folder: a
    TMPDIR below a private folder, as a `mktemp -d` or a Dask worker's is,
    made the probe fail and the backend fall back without a word."""
    _available("bwrap")
    private = tmp_path / "private"
    (private / "tmp").mkdir(parents=True)
    private.chmod(0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_")}
    env |= {"TMPDIR": str(private / "tmp"), "STOCKADE_HOME": str(private / "root")}
    cmd = [sys.executable, "-m", "stockade.cli.main"]
    doctor = subprocess.run([*cmd, "doctor", "--json"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert doctor.returncode == 0, doctor.stderr
    names = {b["name"]: b for b in json.loads(doctor.stdout)["backends"]}
    assert names["bwrap"]["enforced"] is True, names["bwrap"]
    wf = tmp_path / "wf.yaml"
    wf.write_text("name: t\nsteps:\n  - id: a\n    run: echo hi > out/x.txt\n")
    run = subprocess.run([*cmd, "run", str(wf), "--sandbox", "bwrap", "--run-id", "p1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert (private / "root/runs/p1/a/0/work/out/x.txt").read_text() == "hi\n"


def test_landlock_names_the_metadata_it_cannot_govern_for_an_unprivileged_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Landlock has no right for chmod, chown, utime or setxattr: a jail of an
    unprivileged engine (its own uid) can change them on the engine's files."""
    _available("landlock")
    backend = get_backend("landlock")
    said = "Landlock does not govern a file's metadata"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert any(said in line for line in backend.limitations())
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert not any(said in line for line in backend.limitations())
