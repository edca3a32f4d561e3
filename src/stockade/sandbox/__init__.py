"""Sandbox backends, their selection, and the probe that proves enforcement.

``enforced`` is never read from configuration: ``probe`` runs a real jail
that tries to read a canary file outside its world and to write outside it,
and a backend is enforced only if both attempts failed. ``select_backend``
picks the requested backend or the best enforced one (bwrap, then landlock;
sandbox-exec on macOS), else ``none``.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stockade.errors import InfraError
from stockade.sandbox import _lifetime
from stockade.sandbox._direct import launch_here
from stockade.sandbox.base import Availability, Backend, Running
from stockade.sandbox.policy import ENV_ALLOWLIST, ExtraMount, NetworkMode, Policy, Resources

if TYPE_CHECKING:
    from stockade.sandbox.proxy import EgressProxy


def __getattr__(name: str) -> Any:
    # The egress proxy (sockets, threads, HTTP parsing) is imported by the
    # runs whose steps have an allowlist, not on every run's way to its
    # first item.
    if name == "EgressProxy":
        from stockade.sandbox.proxy import EgressProxy

        return EgressProxy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


BACKEND_NAMES: tuple[str, ...] = ("bwrap", "landlock", "sandbox-exec", "none")
INSTALL_HINTS: Mapping[str, str] = {
    "bwrap": "apt-get install bubblewrap (or dnf install bubblewrap)",
    "landlock": "a Linux kernel >= 5.13 with Landlock enabled (lsm=...,landlock)",
    "sandbox-exec": "",  # the reason already says: macOS only
    "none": "",
}

_backends: dict[str, Backend] = {}
_backends_lock = threading.Lock()


def get_backend(name: str) -> Backend:
    """The process-wide instance of backend ``name``; ``InfraError`` if unknown."""
    with _backends_lock:
        if name in _backends:
            return _backends[name]
        backend: Backend
        if name == "bwrap":
            from stockade.sandbox.bwrap import BwrapBackend

            backend = BwrapBackend()
        elif name == "landlock":
            from stockade.sandbox.landlock import LandlockBackend

            backend = LandlockBackend()
        elif name == "sandbox-exec":
            from stockade.sandbox.macos import SandboxExecBackend

            backend = SandboxExecBackend()
        elif name == "none":
            from stockade.sandbox.none import NoneBackend

            backend = NoneBackend()
        else:
            raise InfraError(
                f"unknown sandbox backend {name!r}: choose one of {', '.join(BACKEND_NAMES)}"
            )
        _backends[name] = backend
        return backend


@dataclass(frozen=True)
class ProbeReport:
    backend: str
    available: bool
    enforced: bool
    reason: str
    checks: Mapping[str, bool] = field(default_factory=dict)
    limitations: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "available": self.available,
            "enforced": self.enforced,
            "reason": self.reason,
            "checks": dict(self.checks),
            "limitations": list(self.limitations),
        }


_probe_cache: dict[str, ProbeReport] = {}
_probe_lock = threading.Lock()

_PROBE_SCRIPT = (
    'echo "probe-ran"; '
    'cat "$1" 2>/dev/null; '
    'echo escaped > "$2/escape" 2>/dev/null; '
    'echo "$STOCKADE_PROBE_HOST_ENV"'
)


def _run_probe(backend: Backend) -> ProbeReport:
    avail = backend.availability()
    lims = backend.limitations()
    if not avail.available:
        return ProbeReport(backend.name, False, False, avail.reason, {}, lims)
    try:
        lims += _lifetime.get().limitations()
    except InfraError as e:
        return ProbeReport(backend.name, True, False, str(e), {}, lims)
    token = secrets.token_hex(16)
    base = Path(tempfile.mkdtemp(prefix="stockade-probe-"))
    try:
        # Everything world-accessible: only the sandbox may be what stops the jail.
        base.chmod(0o755)
        canary = base / "canary.txt"
        canary.write_text(f"canary-{token}\n")
        canary.chmod(0o644)
        outside = base / "outside"
        outside.mkdir()
        outside.chmod(0o777)
        work = base / "work"
        work.mkdir()
        scratch = base / "scratch"
        scratch.mkdir()
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        policy = Policy(
            argv=("/bin/sh", "-c", _PROBE_SCRIPT, "probe", str(canary), str(outside)),
            work_dir=work,
            scratch_dir=scratch,
            env=env,
        )
        out_path = base / "stdout"
        err_path = base / "stderr"
        os.environ["STOCKADE_PROBE_HOST_ENV"] = f"hostenv-{token}"
        try:
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                running: Running = backend.start(policy, stdout=out, stderr=err)
                status = running.wait(30)
                if status is None:
                    running.kill(0.5)
                    return ProbeReport(
                        backend.name, True, False, "the probe jail did not finish in 30 s", {}, lims
                    )
        except (OSError, InfraError) as e:
            return ProbeReport(backend.name, True, False, f"the probe jail failed: {e}", {}, lims)
        finally:
            os.environ.pop("STOCKADE_PROBE_HOST_ENV", None)
        stdout = out_path.read_text(errors="replace")
        ran = "probe-ran" in stdout
        checks = {
            "jail_ran": ran,
            "read_canary_blocked": ran and f"canary-{token}" not in stdout,
            "write_outside_blocked": ran and not (outside / "escape").exists(),
            "host_env_hidden": ran and f"hostenv-{token}" not in stdout,
        }
        if not ran:
            detail = err_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
            reason = f"the probe jail did not run (exit {status}): {detail[0]}"
        elif backend.name == "none":
            reason = "the none backend never isolates"
        elif all(checks.values()):
            reason = "a probe jail could not read a canary outside nor write outside"
        else:
            failed = ", ".join(k for k, v in checks.items() if not v)
            reason = f"the probe jail escaped: {failed}"
        enforced = backend.name != "none" and all(checks.values())
        return ProbeReport(backend.name, True, enforced, reason, checks, lims)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def probe(backend: Backend) -> ProbeReport:
    """Run a real probe jail (once per backend per process) and report what it did."""
    with _probe_lock:
        report = _probe_cache.get(backend.name)
        if report is None:
            report = _run_probe(backend)
            _probe_cache[backend.name] = report
        return report


@dataclass(frozen=True)
class Selection:
    backend: Backend
    report: ProbeReport


def preference() -> tuple[str, ...]:
    return ("sandbox-exec",) if sys.platform == "darwin" else ("bwrap", "landlock")


def select_backend(requested: str | None, env: Mapping[str, str]) -> Selection:
    """The requested backend (``--sandbox`` or ``STOCKADE_SANDBOX``), else the best enforced one."""
    name = requested or env.get("STOCKADE_SANDBOX") or None
    if name:
        backend = get_backend(name)
        avail = backend.availability()
        if not avail.available:
            hint = INSTALL_HINTS.get(name, "")
            raise InfraError(
                f"sandbox backend {name!r} is not available here: {avail.reason}"
                + (f" (needs {hint})" if hint and hint not in avail.reason else "")
            )
        return Selection(backend, probe(backend))
    for candidate in preference():
        backend = get_backend(candidate)
        if not backend.availability().available:
            continue
        report = probe(backend)
        if report.enforced:
            return Selection(backend, report)
    none = get_backend("none")
    return Selection(none, probe(none))


def start_line(sel: Selection) -> str:
    if sel.report.enforced:
        return f"sandbox: {sel.backend.name} (enforced)"
    if sel.backend.name == "none":
        return "sandbox: none (NOT ENFORCED: steps can read and write the whole host)"
    return f"sandbox: {sel.backend.name} (NOT ENFORCED: {sel.report.reason})"


def doctor(env: Mapping[str, str]) -> dict[str, Any]:
    """What ``stockade doctor --json`` prints."""
    backends = []
    for name in BACKEND_NAMES:
        backend = get_backend(name)
        report = probe(backend)
        entry = report.to_json()
        entry["name"] = name
        if not report.available:
            entry["install"] = INSTALL_HINTS.get(name, "")
        else:
            # What the backend says of itself (landlock: ABI and launcher).
            entry["detail"] = backend.availability().reason
        backends.append(entry)
    try:
        life = lifetime()
    except InfraError as e:
        life = {"mechanism": None, "error": str(e)}
    result: dict[str, Any] = {"backends": backends, "lifetime": life}
    try:
        sel = select_backend(None, env) if not env.get("STOCKADE_SANDBOX") else None
        if sel is None:
            sel = select_backend(env.get("STOCKADE_SANDBOX"), env)
    except InfraError as e:
        result.update(active=None, enforced=False, error=str(e), limitations=[])
        return result
    for entry in backends:
        entry["active"] = entry["name"] == sel.backend.name
    result.update(
        active=sel.backend.name,
        enforced=sel.report.enforced,
        limitations=list(sel.report.limitations),
        start_line=start_line(sel),
    )
    return result


def lifetime() -> dict[str, Any]:
    """How jails end here (cgroup, process group, watchdog) and what that does
    not cover: ``doctor --json`` and the run manifest record it."""
    return _lifetime.get().report()


def close_all() -> None:
    """Release helpers of every backend created in this process (fork servers)."""
    with _backends_lock:
        for backend in _backends.values():
            backend.close()


__all__ = [
    "BACKEND_NAMES",
    "ENV_ALLOWLIST",
    "Availability",
    "Backend",
    "EgressProxy",
    "ExtraMount",
    "NetworkMode",
    "Policy",
    "ProbeReport",
    "Resources",
    "Running",
    "Selection",
    "close_all",
    "doctor",
    "get_backend",
    "launch_here",
    "lifetime",
    "probe",
    "select_backend",
    "start_line",
]
