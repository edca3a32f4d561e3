"""One agent item on the host: broker up, jail launch described, gate at the end.

``start_agent(job)`` returns an ``AgentSession``. Entering it snapshots
``work/``, writes the jail's config into ``runtime_dir`` (mounted read-only,
never inside ``work/``), and starts the broker on a unix socket there.
``finish(exit_code)`` compares ``work/`` with the snapshot (the name-list
gate), writes ``meta/changes.diff`` and ``meta/outcome.json``, and returns the
``AgentOutcome``.

Must not import the runner, workspace or cli.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx

import stockade
from stockade.agent import AgentJob, AgentLaunch, AgentOutcome, gate, patch, wire
from stockade.agent.broker import Broker, BrokerConfig, BrokerServer, Recorder
from stockade.sandbox.policy import ExtraMount

_TTY_LOCK = threading.Lock()

#: The jail's entry: isolated mode, no site, no bytecode writes; the package
#: directory is put on sys.path explicitly because site (and .pth) are off.
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


def _interpreter() -> tuple[str, tuple[Path, ...]]:
    """The real interpreter binary and the prefixes the jail must see read-only."""
    exe = os.path.realpath(sys.executable)
    roots: list[Path] = [Path(sys.base_prefix).resolve()]
    exe_root = Path(exe).parent.parent
    if not any(exe_root == r or r in exe_root.parents for r in roots):
        roots.append(exe_root)
    return exe, tuple(roots)


def jail_launch(config_path: Path, socket_path: Path) -> AgentLaunch:
    exe, prefixes = _interpreter()
    pkg = Path(stockade.__file__).resolve().parent
    mounts = [ExtraMount(p, str(p)) for p in prefixes]
    # The folder holding the package, not just the package: the import
    # system lists the sys.path entry itself, and landlock would refuse that.
    mounts.append(ExtraMount(pkg.parent, str(pkg.parent)))
    # The socket and the config file themselves, not their folder: the
    # landlock backend re-allows AF_UNIX only when a mounted path is a socket.
    mounts.append(ExtraMount(socket_path, str(socket_path)))
    mounts.append(ExtraMount(config_path, str(config_path)))
    return AgentLaunch(
        argv=(exe, "-I", "-S", "-B", "-c", _BOOT, str(pkg.parent), str(config_path)),
        mounts=tuple(mounts),
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
        self.launch = jail_launch(self._config_path, self._socket_path)

    def __enter__(self) -> AgentSession:
        job, cfg = self.job, self.job.config
        provider, model = wire.split_model(cfg.model)
        job.runtime_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(job.runtime_dir, 0o711)
        self._rt.mkdir(mode=0o711)
        os.chmod(self._rt, 0o711)
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
