"""Jail lifetime through the real ``stockade run``: no jail process outlives a
SIGKILLed or interrupted engine, on every backend and launcher and under
each mechanism; ``doctor`` and the manifest say which mechanism is in use;
resources apply without a sandbox (``--sandbox none``, ``isolate: false``)
and what cannot be applied is said.

Jail processes carry ``MARK=<token>`` (the step's ``env``, composed here at
run time) in their environment. The time from the engine's death to the
last jail process's is measured by ``bench/bench_lifetime.py``; here the
bound is a generous 10 s.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Project
from tests.sandbox.lifetime_helpers import (
    ALL_BACKENDS,
    LAUNCHER_ENV,
    await_,
    end_all,
    kill_marked,
    marked,
    sandbox_of,
)

pytestmark = pytest.mark.sandbox

#: 8 items, 4 at a time, each a shell whose child sleeps in the background.
FANOUT = """
name: fan
steps:
  - id: slow
    for_each: [1, 2, 3, 4, 5, 6, 7, 8]
    env: {{MARK: "{marker}"}}
    run: "sh -c 'sleep 45 & sleep 45; wait'"
"""
#: A stockade engine with the lifetime protection switched off (the test-only
#: switch): the positive control.
UNPROTECTED = (
    "import sys\n"
    "from stockade.sandbox import _lifetime\n"
    "_lifetime.use('off')\n"
    "from stockade.cli.main import main\n"
    "sys.argv[0] = 'stockade'\n"
    "main()\n"
)


def _available(sandbox: str) -> None:
    from stockade.sandbox import get_backend

    avail = get_backend(sandbox).availability()
    if not avail.available:
        pytest.skip(f"{sandbox} is not available here: {avail.reason}")


def _start_fanout(
    project: Project, name: str, mode: str | None, *, protected: bool = True
) -> tuple[subprocess.Popen[str], str]:
    _available(sandbox_of(name))
    marker = secrets.token_hex(8)
    wf = project.write("wf.yaml", FANOUT.format(marker=marker))
    env = {**project.env, **LAUNCHER_ENV[name], "STOCKADE_SANDBOX": sandbox_of(name)}
    if mode is not None:
        env["STOCKADE_JAIL_LIFETIME"] = mode
    args = ["run", str(wf), "--jobs", "4"]
    cmd = project.cmd(*args) if protected else [sys.executable, "-c", UNPROTECTED, *args]
    engine = subprocess.Popen(
        cmd, cwd=project.path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        # Four items run, each with two sleeps: the jails really started.
        await_(lambda: len(marked(marker, "sleep")) >= 8, "four items' sleeps", timeout=60)
    except AssertionError:
        engine.kill()
        _, err = engine.communicate()
        kill_marked(marker)
        raise AssertionError(f"the jails did not start: {err}") from None
    return engine, marker


CASES = [(name, None) for name in ALL_BACKENDS] + [
    (name, mode) for mode in ("cgroup1", "pgroup") for name in ("bwrap", "landlock", "none")
]


@pytest.mark.parametrize(("name", "mode"), CASES, ids=[f"{n}-{m or 'auto'}" for n, m in CASES])
def test_no_jail_process_outlives_a_sigkilled_engine(
    tmp_path: Path, name: str, mode: str | None
) -> None:
    project = Project(tmp_path)
    engine, marker = _start_fanout(project, name, mode)
    try:
        engine.send_signal(signal.SIGKILL)
        engine.wait(30)
        await_(lambda: not marked(marker), "every jail process to end", timeout=10)
        if mode != "pgroup":
            # The watchdog removed the dead engine's cgroups too.
            await_(lambda: not _cgroups_of(engine.pid), "the engine's cgroups to go", timeout=10)
    finally:
        end_all(engine, marker)


def _cgroups_of(pid: int) -> list[str]:
    """The engine's cgroup folders (below this process's own cgroups, as the
    engine is its child)."""
    from stockade.sandbox import _cgroup

    with open("/proc/self/mountinfo") as f, open("/proc/self/cgroup") as g:
        hs = _cgroup.find_hierarchies(f.read(), g.read())
    return [
        name for h in hs.values() for name in os.listdir(h.own)
        if name.startswith("stockade-") and f"-{pid}-" in name
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["landlock", "landlock-python", "none", "none-helper"])
def test_positive_control_orphans_survive_an_unprotected_engine(
    tmp_path: Path, name: str
) -> None:
    # The same run with the protection switched off: the sleeps the items'
    # shells started outlive the SIGKILLed engine (as the issue reproduced).
    # bwrap has no such control: its pid namespace dies with its init.
    project = Project(tmp_path)
    engine, marker = _start_fanout(project, name, None, protected=False)
    try:
        engine.send_signal(signal.SIGKILL)
        engine.wait(30)
        time.sleep(3)  # far longer than the protected engine's jails take to go
        assert len(marked(marker, "sleep")) >= 4, "the positive control: orphans survive"
    finally:
        end_all(engine, marker)


@pytest.mark.parametrize("name", ALL_BACKENDS)
def test_ctrl_c_ends_with_130_and_no_jail_process(tmp_path: Path, name: str) -> None:
    project = Project(tmp_path)
    engine, marker = _start_fanout(project, name, None)
    try:
        os.killpg(engine.pid, signal.SIGINT)
        _, err = engine.communicate(timeout=30)
        assert engine.returncode == 130, err
        await_(lambda: not marked(marker), "every jail process to end", timeout=10)
    finally:
        end_all(engine, marker)


def test_doctor_and_the_manifest_name_the_mechanism(tmp_path: Path) -> None:
    project = Project(tmp_path)
    r = project.run("doctor", "--json")
    assert r.code == 0, r.err
    life = json.loads(r.out)["lifetime"]
    assert life["mechanism"] in ("cgroup2", "cgroup1", "pgroup")
    assert life["watchdog"] and life["limitations"]
    text = project.run("doctor")
    assert f"jail lifetime: {life['mechanism']}" in text.out
    forced = project.run("doctor", "--json", env={"STOCKADE_JAIL_LIFETIME": "pgroup"}).json()
    assert forced["lifetime"]["mechanism"] == "pgroup"
    assert any("no cgroup" in line for line in forced["limitations"])
    wf = project.write("wf.yaml", "name: one\nsteps:\n  - id: a\n    run: echo hi\n")
    assert project.run("run", str(wf), "--run-id", "m1").code == 0
    manifest = json.loads((project.root / "runs" / "m1" / "manifest.json").read_text())
    assert manifest["sandbox"]["lifetime"]["mechanism"] == life["mechanism"]


def _resource_run(
    project: Project, sandbox: str, isolate: bool, resources: str, script: str,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:  # fmt: skip
    wf = project.write("wf.yaml", textwrap.dedent(f"""\
        name: res
        steps:
          - id: a
            isolate: {"true" if isolate else "false"}
            resources: {resources}
            run: {json.dumps(script)}
    """))
    run_id = f"r{secrets.token_hex(4)}"
    r = project.run("run", str(wf), "--run-id", run_id, "--json", "--sandbox", sandbox,
                    env=env)  # fmt: skip
    show = project.run("show", run_id, "a/0", "--json").json()
    return r.code, show["items"][0]["message"], r.err


@pytest.mark.parametrize(("sandbox", "isolate"), [("none", True), ("bwrap", False)])
def test_file_size_applies_without_a_sandbox(tmp_path: Path, sandbox: str, isolate: bool) -> None:
    _available(sandbox)
    project = Project(tmp_path)
    write = "head -c 5000000 /dev/zero > out/big"
    code, message, err = _resource_run(project, sandbox, isolate, "{file_size: 1K}", write)
    # The shell reports its child killed by SIGXFSZ as 128 + 25, which the
    # runner's readable failure names.
    assert code == 1 and message == "exceeded file_size 1K (killed by SIGXFSZ)", (message, err)
    # Positive control: the same write without the limit goes through.
    code, message, err = _resource_run(project, sandbox, isolate, "{cpu_seconds: 60}", write)
    assert code == 0, (message, err)


@pytest.mark.parametrize(("sandbox", "isolate"), [("none", True), ("bwrap", False)])
def test_memory_applies_without_a_sandbox(tmp_path: Path, sandbox: str, isolate: bool) -> None:
    _available(sandbox)
    project = Project(tmp_path)
    alloc = "python3 -c 'b = bytearray(1 << 30); print(\"allocated\")'"
    code, message, err = _resource_run(project, sandbox, isolate, "{memory: 256M}", alloc)
    assert code == 1 and message == "exceeded memory 256M (an allocation failed)", (message, err)
    code, message, err = _resource_run(project, sandbox, isolate, "{cpu_seconds: 60}", alloc)
    assert code == 0, (message, err)


def test_what_cannot_be_applied_is_said(tmp_path: Path) -> None:
    project = Project(tmp_path)
    ok = "echo ok"
    # Without a cgroup, a root engine cannot limit its own processes' count.
    _, _, err = _resource_run(project, "none", True, "{processes: 20}", ok,
                              env={"STOCKADE_JAIL_LIFETIME": "pgroup"})  # fmt: skip
    expected = "resources.processes is not enforced" if os.geteuid() == 0 else \
        "resources.processes counts every process"  # fmt: skip
    assert f"a: {expected}" in err, err
    assert "resources.memory limits each process's address space only" not in err
    _, _, err = _resource_run(project, "none", True, "{memory: 1G}", ok,
                              env={"STOCKADE_JAIL_LIFETIME": "pgroup"})  # fmt: skip
    assert "a: resources.memory limits each process's address space only" in err, err


def test_an_unknown_mechanism_is_one_clear_error(tmp_path: Path) -> None:
    project = Project(tmp_path)
    wf = project.write("wf.yaml", "name: one\nsteps:\n  - id: a\n    run: echo hi\n")
    bad = {"STOCKADE_JAIL_LIFETIME": "cgroup3"}
    r = project.run("run", str(wf), env=bad)
    assert r.code == 2 and "STOCKADE_JAIL_LIFETIME='cgroup3': expected one of" in r.err, r.err
    assert "Traceback" not in r.err
    doctor = project.run("doctor", env=bad)
    assert "Traceback" not in doctor.err and "STOCKADE_JAIL_LIFETIME='cgroup3'" in doctor.out


def _lower_hard_limits() -> None:
    """In the engine's child before exec: hard limits below what the workflow
    asks for, as a host's ``ulimit -H`` or a container's would be."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (100000, 100000))


@pytest.mark.parametrize("sandbox", ["bwrap", "landlock", "none"])
def test_a_limit_above_the_engines_hard_limit_is_that_hard_limit(
    tmp_path: Path, sandbox: str
) -> None:
    # No unprivileged process can raise a hard limit: asked for more than the
    # engine has, the launch failed (EPERM from prlimit or setrlimit) while the
    # host enforced a stricter limit anyway.
    _available(sandbox)
    project = Project(tmp_path)
    wf = project.write("wf.yaml", textwrap.dedent("""\
        name: hard
        steps:
          - id: a
            resources: {file_size: 2G, cpu_seconds: 50000, processes: 4194304}
            run: python3 -c 'import resource as r; print(r.getrlimit(r.RLIMIT_FSIZE)[1], r.getrlimit(r.RLIMIT_CPU)[1])' > out/limits.txt
    """))
    p = subprocess.run(project.cmd("run", str(wf), "--run-id", "h1", "--sandbox", sandbox),
                       cwd=project.path, env=project.env, capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL, preexec_fn=_lower_hard_limits)
    assert p.returncode == 0, p.stdout + p.stderr
    limits = (project.item("h1", "a") / "work" / "out" / "limits.txt").read_text().split()
    # file_size is the host's 1 GiB; cpu_seconds, below the host's, is the step's own.
    assert limits == [str(1 << 30), "50000"], limits


@pytest.mark.parametrize("memory", ["100", "1M"])
def test_a_memory_limit_too_small_to_start_the_program_says_so(
    tmp_path: Path, memory: str
) -> None:
    project = Project(tmp_path)
    code, message, err = _resource_run(project, "none", True, f"{{memory: {memory}}}", "echo hi")
    shown = "100 bytes" if memory == "100" else memory
    assert code == 1, err
    assert message == f"exceeded memory {shown}: too little to load the program (exit status 127)"
