"""One agent item on the host: broker up, jail launch described, gate at the end.

``start_agent(job)`` returns an ``AgentSession``. Entering it snapshots
``work/``, makes the socketpair between broker and jail and starts the broker
on its end; ``launch`` then names what to run in the jail: the interpreter
with ``ship.BOOT`` (no path of the engine's, no config) and the jail's end as
``pass_fds``. Over it the jail receives its code and config
(``ship.image``). Nothing of the item's agent exists on disk outside
``work/`` and ``meta/``.
``finish(exit_code)`` compares ``work/`` with the snapshot (the name-list
gate), writes ``meta/changes.diff`` and ``meta/outcome.json``, and returns the
``AgentOutcome``.

Must not import the runner, workspace or cli.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from stockade._show import printable
from stockade.agent import AgentJob, AgentLaunch, AgentOutcome, endpoints, gate, patch, ship, wire
from stockade.agent.broker import Broker, BrokerConfig, BrokerServer
from stockade.agent.record import Recorder
from stockade.sandbox.policy import ExtraMount

_TTY_LOCK = threading.Lock()


def ask_on_tty(path: str) -> bool:
    """Ask the operator on the controlling terminal; anything but y/yes is no."""
    with _TTY_LOCK:
        try:
            fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        except OSError:
            return False
        try:
            # The broker refuses such names; escaping here still keeps one that
            # got through from rewriting the question (a CR, an escape sequence).
            os.write(fd, f"Allow the agent to write {printable(path)}? [y/N] ".encode())
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


def _endpoint_record(endpoint: Any) -> dict[str, Any] | None:
    """A step's ``endpoint:`` for agent.json: a base URL without its credentials."""
    if endpoint is None:
        return None
    out: dict[str, Any] = endpoint.model_dump(exclude_none=True)
    if out.get("base_url"):
        out["base_url"] = endpoints.shown(out["base_url"])
    return out


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


def jail_launch(broker_fd: int) -> AgentLaunch:
    """The jail's command line (isolated, no site, no bytecode writes) and what it needs."""
    exe, prefix = interpreter()
    return AgentLaunch(
        argv=(exe, "-I", "-S", "-B", "-c", ship.BOOT),
        mounts=(ExtraMount(prefix, str(prefix)),),
        env={},  # -I ignores PYTHON* variables anyway; nothing of the host is needed
        pass_fds=(broker_fd,),  # lands on ship.BROKER_FD, the first passed fd
    )


class AgentSession:
    """A context manager around the broker; see the module docstring."""

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
        self._jail_end: socket.socket | None = None
        self._launch: AgentLaunch | None = None
        self._before: gate.Snapshot = {}
        self.diff = ""

    @property
    def launch(self) -> AgentLaunch:
        """What to run in the jail; its ``pass_fds`` is open only inside the with-block."""
        if self._launch is None:
            raise RuntimeError("launch is known only inside the session's with-block")
        return self._launch

    def __enter__(self) -> AgentSession:
        job, cfg = self.job, self.job.config
        provider, model = wire.split_model(cfg.model)
        job.meta_dir.mkdir(parents=True, exist_ok=True)
        work = job.work_dir.resolve()
        self._before = gate.snapshot(work)
        jail_config = {
            "prompt": cfg.prompt,
            "tools": list(cfg.tools),
            "writes": list(cfg.writes),
            "max_turns": cfg.max_turns,
        }
        params = cfg.params.model_dump(exclude_none=True)
        step_endpoint = endpoints.step_endpoint(cfg.endpoint)
        record = {
            **jail_config,
            "model": cfg.model,
            "approve": cfg.approve,
            "run_id": job.run_id,
            "step": job.step,
            "item": job.item,
            "attempt": job.attempt,
            "timeout": job.timeout,
            "request_timeout": cfg.request_timeout,
            "params": params,
            # the variable's name only: the key itself never leaves the broker
            "endpoint": _endpoint_record(cfg.endpoint),
            "budget": cfg.budget.model_dump() if cfg.budget else None,
            "outputs": list(job.outputs),
        }
        (job.meta_dir / "agent.json").write_text(json.dumps(record, indent=2))
        keys = [v for k, v in job.host_env.items() if k.endswith(("_KEY", "_TOKEN", "_SECRET"))]
        target = endpoints.resolve(provider, model, step_endpoint, job.host_env)
        if target.key:
            keys.append(target.key)
        # A password or token in the base URL is a key too, should a server quote it.
        recorder = Recorder(job.meta_dir, keys, (*job.secrets, *endpoints.url_secrets(target.url)))
        exe, _prefix = interpreter()
        preamble = ship.image(jail_config, code=ship.reads_our_bytecode(exe))
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
                request_timeout=float(cfg.request_timeout),
                settings=wire.Settings(
                    max_tokens=cfg.params.max_tokens,
                    temperature=cfg.params.temperature,
                    reasoning_effort=cfg.params.reasoning_effort,
                    tool_choice=cfg.params.tool_choice,
                    thinking=(cfg.params.thinking.model_dump(exclude_none=True)
                              if cfg.params.thinking else None),
                ),
                endpoint=step_endpoint,
                budget_tokens=cfg.budget.tokens if cfg.budget else None,
                outputs=tuple(job.outputs),
            ),
            host_env=job.host_env,
            recorder=recorder,
            snapshot=self._before,
            echo=job.echo,
            ask=self._ask,
            clock=self._clock,
            http=self._http,
        )
        # The broker's only line: one end here, the other inherited by the
        # item's jail alone (close-on-exec in the engine, so no other child
        # of the engine gets it). No path, no name, nothing to connect to.
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._jail_end = there
        self._launch = jail_launch(there.fileno())
        self._server = BrokerServer(self._broker, here, preamble)
        self._server.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._jail_end is not None:
            self._jail_end.close()
            self._jail_end = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    def finish(self, exit_code: int | None) -> AgentOutcome:
        """The outcome after the jail exited (``None``: it was killed or timed out)."""
        broker = self._broker
        if broker is None:
            raise RuntimeError("finish() called outside the session's with-block")
        work = self.job.work_dir.resolve()
        after = gate.snapshot(work)
        changed = set(gate.changed(self._before, after))
        st, desk = broker.state, broker.desk
        writes = tuple(sorted(desk.written))
        extras = set(changed - set(desk.written))
        for path, digest in desk.written.items():
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
        reasons.extend(desk.problems)
        if exit_code is None:
            reasons.append("the agent was stopped (timeout or cancel)")
        elif exit_code != 0 and not fin.get("message"):
            reasons.append(f"the agent process exited with status {exit_code}")
        if not st.finished:
            if st.failure:
                reasons.append(st.failure)
            elif exit_code is not None:
                reasons.append("the agent ended without a final answer")
        elif not fin.get("ok"):
            reasons.append(str(fin.get("message") or "the agent failed"))
        self.diff = "".join(
            patch.unified(p, desk.before.get(p), (work / p).read_bytes() if (work / p).is_file() else None)
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
            usage=dict(st.usage),
            # Only the model side's own verdicts (a refused request, a stop
            # reason) make a retry pointless; a timeout may go differently.
            retryable=st.retryable,
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
                    "usage": st.usage,
                    "failure": st.failure,
                    "retryable": outcome.retryable,
                    "fallbacks": st.fallbacks,
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
