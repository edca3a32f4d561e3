"""One agent item on the host: broker up, jail launch described, gate at the end.

``start_agent(job)`` returns an ``AgentSession``. Entering it snapshots
``work/``, puts the jail's config, a copy of the jail's (stdlib-only)
modules and the broker's unix socket in an unguessable folder under
``runtime_dir`` (each mounted read-only, never inside ``work/``), and starts
the broker.
``finish(exit_code)`` compares ``work/`` with the snapshot (the name-list
gate), writes ``meta/changes.diff`` and ``meta/outcome.json``, and returns the
``AgentOutcome``.

Must not import the runner, workspace or cli.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import py_compile
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx

from stockade.agent import AgentJob, AgentLaunch, AgentOutcome, gate, patch, wire
from stockade.agent.broker import Broker, BrokerConfig, BrokerServer, Recorder
from stockade.sandbox.policy import ExtraMount

_TTY_LOCK = threading.Lock()

#: The jail's entry: isolated mode, no site, no bytecode writes; the folder
#: with the jail's modules is put on sys.path explicitly (site is off).
_BOOT = "import sys;sys.path.insert(0,sys.argv.pop(1));from stockade.agent.jail import main;sys.exit(main())"


def ask_on_tty(path: str) -> bool:
    """Ask the operator on the controlling terminal; anything but y/yes is no."""
    with _TTY_LOCK:
        try:
            fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        except OSError:
            return False
        try:
            os.write(fd, f"Allow the agent to write {path}? [y/N] ".encode())
            line = b""
            while not line.endswith(b"\n"):
                chunk = os.read(fd, 256)
                if not chunk:
                    break
                line += chunk
            return line.decode(errors="replace").strip().lower() in ("y", "yes")
        except OSError:
            return False
        finally:
            os.close(fd)


#: What the jail runs: stdlib-only modules, copied into the item's private
#: runtime folder so the jail needs no path of the engine's installation (and
#: sees none of the engine besides them).
JAIL_MODULES = ("__init__.py", "fs.py", "guard.py", "jail.py", "loop.py", "patch.py", "tools.py")
_PACKAGE_STUB = '"""stockade, as the agent jail sees it: only stockade.agent\'s jail side."""\n'


def _reachable(path: Path) -> bool:
    """Whether any uid can reach ``path`` (a jail may run as nobody)."""
    try:
        return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))
    except OSError:
        return False


def _version_ok(exe: str) -> bool:
    try:
        r = subprocess.run([exe, "-I", "-S", "-c", "import sys; print(sys.version_info >= (3, 10))"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.stdout.strip() == "True"


@functools.cache
def interpreter() -> tuple[str, Path]:
    """An interpreter for the jail and the prefix it needs read-only.

    The engine's own when every uid can reach it; otherwise (say a pyenv
    build under a 0700 /root while bwrap runs jails as nobody) a system
    python3 >= 3.10, which the jail code is written for.
    """
    own = os.path.realpath(sys.executable)
    own_prefix = Path(sys.base_prefix).resolve()
    if _reachable(own_prefix) and _reachable(Path(own).parent):
        return own, own_prefix
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3") or ""):
        if not cand or not os.path.exists(cand):
            continue
        exe = os.path.realpath(cand)
        prefix = Path(exe).parent.parent
        if _reachable(Path(exe).parent) and _version_ok(exe):
            return exe, prefix
    return own, own_prefix


@functools.cache
def _jail_code_template() -> Path:
    """The jail's modules with bytecode, built once per engine process.

    Bytecode is compiled as unchecked-hash pycs, so the jail (run with -B,
    on a read-only mount) loads them without compiling: about half its
    import time. A jail interpreter of another version ignores them.
    """
    root = Path(tempfile.mkdtemp(prefix="stockade-jail-code-"))
    atexit.register(shutil.rmtree, root, True)
    src = Path(__file__).resolve().parent
    dest = root / "stockade" / "agent"
    dest.mkdir(parents=True)
    (root / "stockade" / "__init__.py").write_text(_PACKAGE_STUB)
    for name in JAIL_MODULES:
        shutil.copyfile(src / name, dest / name)
    for f in [root / "stockade" / "__init__.py", *(dest / n for n in JAIL_MODULES)]:
        py_compile.compile(str(f), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return root


def install_jail_code(lib: Path) -> None:
    """Copy the jail's modules (and their bytecode) into ``lib``, readable by any uid."""
    shutil.copytree(_jail_code_template(), lib)
    for dirpath, _dirs, filenames in os.walk(lib):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


def jail_launch(config_path: Path, socket_path: Path, lib: Path) -> AgentLaunch:
    exe, prefix = interpreter()
    return AgentLaunch(
        argv=(exe, "-I", "-S", "-B", "-c", _BOOT, str(lib), str(config_path)),
        mounts=(
            ExtraMount(prefix, str(prefix)),
            ExtraMount(lib, str(lib)),
            # The socket and the config file themselves, not their folder: the
            # landlock backend re-allows AF_UNIX only when a mounted path is a socket.
            ExtraMount(socket_path, str(socket_path)),
            ExtraMount(config_path, str(config_path)),
        ),
        env={},  # -I ignores PYTHON* variables anyway; nothing of the host is needed
    )


class AgentSession:
    """A context manager around the broker; see the module docstring."""

    launch: AgentLaunch

    def __init__(
        self,
        job: AgentJob,
        *,
        ask: Callable[[str], bool] = ask_on_tty,
        clock: Callable[[], float] = time.monotonic,
        http: httpx.Client | None = None,
    ) -> None:
        self.job = job
        self._ask = ask
        self._clock = clock
        self._http = http
        self._server: BrokerServer | None = None
        self._broker: Broker | None = None
        self._before: gate.Snapshot = {}
        self.diff = ""
        # The jail may run as another uid (bwrap runs it as nobody when the
        # engine is root), so the socket must be connectable by it. The
        # unguessable directory name keeps other local users from finding it:
        # runtime_dir itself is made traversable but not listable.
        self._rt = job.runtime_dir.resolve() / secrets.token_hex(12)
        self._config_path = self._rt / "agent.json"
        self._socket_path = self._rt / "broker.sock"
        self._lib = self._rt / "lib"
        self.launch = jail_launch(self._config_path, self._socket_path, self._lib)

    def __enter__(self) -> AgentSession:
        job, cfg = self.job, self.job.config
        provider, model = wire.split_model(cfg.model)
        job.runtime_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(job.runtime_dir, 0o711)
        self._rt.mkdir(mode=0o711)
        os.chmod(self._rt, 0o711)
        install_jail_code(self._lib)
        job.meta_dir.mkdir(parents=True, exist_ok=True)
        work = job.work_dir.resolve()
        self._before = gate.snapshot(work)
        jail_config = {
            "socket": str(self._socket_path),
            "prompt": cfg.prompt,
            "tools": list(cfg.tools),
            "writes": list(cfg.writes),
            "max_turns": cfg.max_turns,
        }
        self._config_path.write_text(json.dumps(jail_config))
        os.chmod(self._config_path, 0o644)
        record = {
            **jail_config,
            "model": cfg.model,
            "approve": cfg.approve,
            "run_id": job.run_id,
            "step": job.step,
            "item": job.item,
            "attempt": job.attempt,
            "timeout": job.timeout,
        }
        record.pop("socket")
        (job.meta_dir / "agent.json").write_text(json.dumps(record, indent=2))
        keys = [v for k, v in job.host_env.items() if k.endswith(("_KEY", "_TOKEN", "_SECRET"))]
        recorder = Recorder(job.meta_dir, keys)
        self._broker = Broker(
            BrokerConfig(
                provider=provider,
                model=model,
                prompt=cfg.prompt,
                tools=tuple(cfg.tools),
                writes=tuple(cfg.writes),
                max_turns=cfg.max_turns,
                approve=cfg.approve,
                interactive=job.interactive,
                timeout=job.timeout,
                work_dir=work,
            ),
            host_env=job.host_env,
            recorder=recorder,
            snapshot=self._before,
            echo=job.echo,
            ask=self._ask,
            clock=self._clock,
            http=self._http,
        )
        self._server = BrokerServer(self._broker, self._socket_path)
        self._server.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        for p in (self._config_path, self._socket_path):
            p.unlink(missing_ok=True)
        shutil.rmtree(self._lib, ignore_errors=True)
        with contextlib.suppress(OSError):
            self._rt.rmdir()

    def finish(self, exit_code: int | None) -> AgentOutcome:
        """The outcome after the jail exited (``None``: it was killed or timed out)."""
        broker = self._broker
        if broker is None:
            raise RuntimeError("finish() called outside the session's with-block")
        work = self.job.work_dir.resolve()
        after = gate.snapshot(work)
        changed = set(gate.changed(self._before, after))
        st = broker.state
        writes = tuple(sorted(st.written))
        extras = set(changed - set(st.written))
        for path, digest in st.written.items():
            entry = after.get(path)
            if entry is not None and (entry.kind != "file" or entry.digest != digest):
                extras.add(path)  # changed again after the tool wrote it
            if entry is None:
                extras.add(path)  # removed after the tool wrote it
        extra_paths = tuple(sorted(extras))
        fin = st.finished or {}
        reasons: list[str] = []
        if extra_paths:
            reasons.append("files changed without the write tools: " + ", ".join(extra_paths))
        reasons.extend(st.problems)
        if exit_code is None:
            reasons.append("the agent was stopped (timeout or cancel)")
        elif exit_code != 0 and not fin.get("message"):
            reasons.append(f"the agent process exited with status {exit_code}")
        if not st.finished:
            if exit_code is not None:
                reasons.append("the agent ended without a final answer")
        elif not fin.get("ok"):
            reasons.append(str(fin.get("message") or "the agent failed"))
        self.diff = "".join(
            patch.unified(p, st.before.get(p), (work / p).read_bytes() if (work / p).is_file() else None)
            for p in writes
            if p not in extras
        )
        (self.job.meta_dir / "changes.diff").write_text(self.diff)
        outcome = AgentOutcome(
            ok=not reasons,
            result=str(fin.get("result") or ""),
            message="; ".join(reasons),
            writes=writes,
            extra_paths=extra_paths,
            diff=self.diff,
        )
        (self.job.meta_dir / "outcome.json").write_text(
            json.dumps(
                {
                    "ok": outcome.ok,
                    "message": outcome.message,
                    "writes": list(writes),
                    "extra_paths": list(extra_paths),
                    "model_calls": st.calls,
                    "turns": fin.get("turns"),
                    "exit_code": exit_code,
                },
                indent=2,
            )
        )
        return outcome


def start_agent(
    job: AgentJob,
    *,
    ask: Callable[[str], bool] = ask_on_tty,
    clock: Callable[[], float] = time.monotonic,
    http: httpx.Client | None = None,
) -> AgentSession:
    """The session for one agent item; use it as a context manager."""
    return AgentSession(job, ask=ask, clock=clock, http=http)
