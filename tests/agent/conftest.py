"""Drive one agent item the way the runner does: inputs in work/, session, jail, finish."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stockade.agent import AgentJob, AgentOutcome, start_agent
from stockade.sandbox.base import Backend
from stockade.sandbox.none import NoneBackend
from stockade.sandbox.policy import Policy
from stockade.spec.model import Agent


def _backend(name: str) -> Backend | None:
    b: Backend
    try:
        from stockade.sandbox import get_backend  # type: ignore[attr-defined]

        b = get_backend(name)
    except Exception:
        return None
    if not b.availability().available:
        return None
    return b if _starts(b) else None


_PROBE: dict[str, bool] = {}


def _starts(b: Backend) -> bool:
    """Whether the backend can run ``true`` in a jail here (probed once)."""
    if b.name not in _PROBE:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o755)
            work, scratch = Path(d) / "w", Path(d) / "s"
            work.mkdir()
            pol = Policy(argv=("/bin/true",), work_dir=work, scratch_dir=scratch, env={"PATH": "/usr/bin:/bin"})
            try:
                with open(os.devnull, "wb") as null:
                    r = b.start(pol, stdout=null, stderr=null)
                    _PROBE[b.name] = r.wait(30) == 0
            except Exception:
                _PROBE[b.name] = False
    return _PROBE[b.name]


def backends() -> list[object]:
    """``none`` always; ``bwrap`` and ``landlock`` where they start a jail (skipped, not hidden, if not)."""
    out: list[object] = [pytest.param("none", id="none")]
    for name in ("bwrap", "landlock"):
        out.append(
            pytest.param(
                name,
                id=name,
                marks=pytest.mark.skipif(_backend(name) is None, reason=f"the {name} backend is missing or cannot start a jail here"),
            )
        )
    return out


#: The enforcing backends with each launcher: how ``stockade run`` picks them.
LAUNCHES: dict[str, dict[str, str]] = {
    "bwrap": {"STOCKADE_SANDBOX": "bwrap", "STOCKADE_BWRAP_LAUNCHER": "direct"},
    "bwrap-helper": {"STOCKADE_SANDBOX": "bwrap", "STOCKADE_BWRAP_LAUNCHER": "helper"},
    "landlock": {"STOCKADE_SANDBOX": "landlock", "STOCKADE_LANDLOCK_LAUNCHER": "native"},
    "landlock-python": {"STOCKADE_SANDBOX": "landlock", "STOCKADE_LANDLOCK_LAUNCHER": "python"},
}


def jail_backends() -> list[object]:
    """Every enforcing backend and launcher (security tests); skipped, not hidden, where missing."""
    out: list[object] = []
    for name, env in LAUNCHES.items():
        base = env["STOCKADE_SANDBOX"]
        missing = _backend(base) is None
        native = name in ("bwrap", "landlock")
        if native and not missing:
            from stockade.sandbox import _direct

            missing = not _direct.available()
        out.append(pytest.param(name, id=name, marks=pytest.mark.skipif(
            missing, reason=f"{name} is missing or cannot start a jail here")))
    return out


_FALLBACKS: dict[str, Backend] = {}


def get(name: str) -> Backend:
    """A backend by name; ``bwrap-helper`` and ``landlock-python`` are the fallback launchers."""
    if name == "none":
        return NoneBackend()
    if name in ("bwrap-helper", "landlock-python"):
        if name not in _FALLBACKS:
            from stockade.sandbox.bwrap import BwrapBackend
            from stockade.sandbox.landlock import LandlockBackend

            _FALLBACKS[name] = BwrapBackend(launcher="helper") if name == "bwrap-helper" else LandlockBackend(launcher="python")
            atexit.register(_FALLBACKS[name].close)
        return _FALLBACKS[name]
    b = _backend(name)
    assert b is not None
    return b


@dataclass
class Item:
    root: Path
    work: Path
    meta: Path
    echoed: list[str] = field(default_factory=list)
    exit_code: int | None = None
    pids: list[int] = field(default_factory=list)
    log: str = ""


def run_item(
    tmp: Path,
    *,
    backend: str,
    agent: Agent,
    host_env: Mapping[str, str],
    inputs: Mapping[str, str] = {},
    item_name: str = "0",
    interactive: bool = False,
    ask: Callable[[str], bool] | None = None,
    timeout: float | None = 60,
    prepare: Callable[[Path], None] | None = None,
    tamper: Callable[[Path], None] | None = None,
) -> tuple[AgentOutcome, Item]:
    root = tmp / "runs" / "r1" / "step" / item_name
    work, meta = root / "work", root / "meta" / "1"
    (work / "out").mkdir(parents=True)
    for rel, text in inputs.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    if prepare:
        prepare(work)
    it = Item(root, work, meta)
    job = AgentJob(
        run_id="r1", step="step", item=0, attempt=1, config=agent, work_dir=work, meta_dir=meta,
        timeout=timeout, host_env=dict(host_env), echo=it.echoed.append,
        interactive=interactive,
    )
    kw = {"ask": ask} if ask else {}
    with start_agent(job, **kw) as s:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"} | dict(s.launch.env)
        policy = Policy(argv=s.launch.argv, work_dir=work, scratch_dir=tmp / "scratch" / item_name,
                        env=env, mounts=s.launch.mounts, network="none", pass_fds=s.launch.pass_fds)
        with open(meta / "jail.log", "wb") as logf:
            running = get(backend).start(policy, stdout=logf, stderr=logf)
            it.pids.append(running.pid)
            code = running.wait(timeout)
            if code is None:
                running.kill()
        if tamper:
            tamper(work)
        it.exit_code = code
        it.log = (meta / "jail.log").read_text()
        outcome = s.finish(code)
    return outcome, it


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short tmp dir (unix socket paths are limited to 108 bytes)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="sa-"))
    # Like a real runs folder: traversable, so a jail uid (bwrap runs jails
    # as nobody when the engine is root) can reach its own work/.
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
