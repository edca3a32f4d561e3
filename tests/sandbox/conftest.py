"""Real jails for the escape suite: a realistic run tree with canaries around it.

Every file outside the item's world holds the canary and is world-readable,
every directory outside it is world-writable: nothing but the sandbox may be
what stops an attempt. When tests run as root, a ``world``'s jails run as a
jail uid leased for the test (``World.jail_uid``), so a host process the test
starts with that uid is protected by the sandbox alone, not by a uid apart.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stockade.sandbox import (
    Backend,
    EgressProxy,
    ExtraMount,
    Policy,
    Resources,
    _direct,
    _uids,
    get_backend,
)
from stockade.sandbox.bwrap import BwrapBackend
from stockade.sandbox.landlock import LandlockBackend
from stockade.sandbox.policy import NetworkMode
from tests.loopback_http import serve

ENFORCED = ("bwrap", "landlock")

# Which engine identity a file is about: a root engine switches jails to
# another uid (test_root_engine); an ordinary one is what test_non_root_engine
# reproduces from a root run. Each applies to one case only, so the other is
# not collected rather than skipped (CI turns skips into failures).
collect_ignore = ["test_non_root_engine.py"] if os.geteuid() != 0 else []
if os.geteuid() != 0:
    collect_ignore += ["test_root_engine.py", "test_jail_uids.py", "test_landlock_netns.py"]
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "dumb", "SHELL": "/bin/sh"}


@dataclass
class Result:
    status: int | None
    out: str
    err: str

    @property
    def both(self) -> str:
        return self.out + self.err


@dataclass
class World:
    backend: Backend
    canary: str
    base: Path
    runs: Path
    item: Path
    work: Path
    meta: Path
    neighbour: Path
    workflow: Path
    host_tmp: Path
    home_file: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    #: The uid the jails run as (a root engine's; ``None`` otherwise).
    jail_uid: int | None = None

    def policy(
        self,
        argv: Sequence[str],
        *,
        network: NetworkMode = "none",
        proxy: EgressProxy | None = None,
        resources: Resources | None = None,
        mounts: tuple[ExtraMount, ...] = (),
        env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> Policy:
        return Policy(
            argv=tuple(argv),
            work_dir=self.work,
            scratch_dir=self.base / "scratch",
            env={**ENV, **self.extra_env, **(env or {})},
            mounts=mounts,
            network=network,
            proxy_socket=proxy.socket_path if proxy is not None else None,
            proxy_token=proxy.token if proxy is not None else None,
            resources=resources or Resources(),
            pass_fds=pass_fds,
        )

    def run(self, script: str, *args: str, timeout: float = 30, **kw: object) -> Result:
        return self.run_argv(["/bin/sh", "-c", script, "sh", *args], timeout=timeout, **kw)

    def run_argv(self, argv: Sequence[str], *, timeout: float = 30, **kw: object) -> Result:
        policy = self.policy(argv, **kw)  # type: ignore[arg-type]
        out_path, err_path = self.meta / "stdout", self.meta / "stderr"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            running = self.backend.start(policy, stdout=out, stderr=err)
            status = running.wait(timeout)
            if status is None:
                running.kill(0.5)
                status = running.wait(5)
        return Result(
            status,
            out_path.read_text(errors="replace"),
            err_path.read_text(errors="replace"),
        )

    def py(self, code: str, *args: str, **kw: object) -> Result:
        return self.run_argv(["/usr/bin/python3", "-I", "-S", "-c", code, *args], **kw)


def _open_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)


def _canary_file(path: Path, canary: str, *, own_parent: bool = True) -> None:
    if own_parent:
        _open_dir(path.parent)
    path.write_text(f"{canary}\n")
    path.chmod(0o666)


@contextmanager
def placed_world(backend: Backend, placement: str, tmp_path: Path,
                 prefix: str) -> Iterator[World]:
    """A world in a world-readable folder (``open``) or below a 0700 one
    (``private``: pytest's tmp_path), removed afterwards."""
    if placement == "private":
        base = tmp_path / "run"
        base.mkdir()
    else:
        base = Path(tempfile.mkdtemp(prefix=prefix))
    w = make_world(backend, base)
    try:
        yield w
    finally:
        w.host_tmp.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _remove_host_canaries() -> Iterator[None]:
    """Every canary ``make_world`` put in the host's /tmp goes at session end,
    whichever fixture or test made the world and however it ended (they are
    named after this process)."""
    yield
    for path in Path("/tmp").glob(f"stockade-canary-{os.getpid()}-*"):
        path.unlink(missing_ok=True)


def make_world(backend: Backend, base: Path) -> World:
    canary = f"CANARY-{secrets.token_hex(12)}"
    base.chmod(0o755)
    runs = base / "runs"
    item = runs / "r1" / "analyse" / "0"
    work, meta = item / "work", item / "meta"
    for d in (runs, runs / "r1", runs / "r1" / "analyse", item, work, work / "out", meta):
        _open_dir(d)
    (work / "input.txt").write_text("my own input\n")
    _canary_file(meta / "attempt-1.json", canary)
    neighbour = runs / "r1" / "analyse" / "1"
    _canary_file(neighbour / "work" / "notes.md", canary)
    _canary_file(runs / "r1" / "gather" / "0" / "work" / "out" / "x", canary)
    workflow = base / "wf"
    _canary_file(workflow / "analysis_notes.md", canary)
    # Never chmod /tmp itself (it keeps its sticky bit).
    host_tmp = Path("/tmp") / f"stockade-canary-{os.getpid()}-{secrets.token_hex(6)}"
    _canary_file(host_tmp, canary, own_parent=False)
    # The engine's HOME: a world-readable stand-in (the real one may be 0700,
    # which would hide it by permissions rather than by the sandbox).
    home_file = base / "hosthome" / f".stockade-canary-{secrets.token_hex(6)}"
    _canary_file(home_file, canary)
    return World(
        backend, canary, base, runs, item, work, meta, neighbour, workflow, host_tmp, home_file
    )


def host_daemon_socket(path: Path) -> socket.socket:
    """A listening pathname socket like a container daemon's: world-writable,
    outside every item; ``accept`` gives up after half a second."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    path.chmod(0o777)
    srv.listen(4)
    srv.settimeout(0.5)
    return srv


def needs_c_launcher() -> None:
    """Skip where ``stockade.sandbox._jail`` was not built (CI installs gcc, and
    turns this skip into a failure)."""
    if not _direct.available():
        pytest.skip("stockade.sandbox._jail is not built (no C compiler at install time)")


@pytest.fixture(scope="session")
def landlock_python() -> Iterator[Backend]:
    """landlock with the fallback launcher (the helper forks Python), as on a
    machine where the C launcher was not built."""
    b = LandlockBackend(launcher="python")
    yield b
    b.close()


@pytest.fixture(scope="session")
def bwrap_helper() -> Iterator[Backend]:
    """bwrap started through the exec helper, as on a machine where the C
    launcher was not built (or for a jail whose paths need bridges)."""
    b = BwrapBackend(launcher="helper")
    yield b
    b.close()


#: Parameters naming a backend with its fallback launcher.
FALLBACKS = {"landlock-python": "landlock_python", "bwrap-helper": "bwrap_helper"}


def available_backend(request: pytest.FixtureRequest, name: str) -> Backend:
    """The backend a parameter names (``landlock-python``, ``bwrap-helper``:
    the fallback launchers); skipped with the reason where it is unavailable."""
    b = request.getfixturevalue(FALLBACKS[name]) if name in FALLBACKS else get_backend(name)
    avail = b.availability()
    if not avail.available:
        pytest.skip(f"{name} is not available here: {avail.reason}")
    return b


@pytest.fixture(params=(*ENFORCED, *FALLBACKS))
def backend(request: pytest.FixtureRequest) -> Backend:
    return available_backend(request, request.param)


def jail_ids(backend: Backend) -> _uids.JailIds:
    """The identity chooser of an enforced backend (``pinned`` is test-only)."""
    ids = getattr(backend, "_ids", None)
    assert isinstance(ids, _uids.JailIds), backend
    return ids


@pytest.fixture
def world(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield from world_at(backend, Path(tempfile.mkdtemp(prefix="stockade-escape-")), monkeypatch)


def world_at(backend: Backend, base: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A world in ``base`` (removed afterwards); a root engine's jails run as a
    leased uid of their own, as the engine's would."""
    w = make_world(backend, base)
    monkeypatch.setenv("HOME", str(w.home_file.parent))
    # The none backend has no jail uid: its jails run as the engine.
    jailed = os.geteuid() == 0 and backend.name != "none"
    lease = _uids.jail_uids().acquire() if jailed else None
    if lease is not None:
        monkeypatch.setattr(jail_ids(backend), "pinned", (lease.uid, lease.gid))
        w.jail_uid = lease.uid
    try:
        yield w
    finally:
        if lease is not None:
            lease.release()
        for p in (w.host_tmp, w.home_file):
            p.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def none_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    base = Path(tempfile.mkdtemp(prefix="stockade-control-"))
    w = make_world(get_backend("none"), base)
    monkeypatch.setenv("HOME", str(w.home_file.parent))
    try:
        yield w
    finally:
        for p in (w.host_tmp, w.home_file):
            p.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def allowed_server() -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on host loopback that an allowlist may name: ``(port, paths asked)``."""
    with serve(b"allowed-content") as served:
        yield served.port, served.paths
