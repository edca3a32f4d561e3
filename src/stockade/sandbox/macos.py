"""The ``sandbox-exec`` backend (macOS): a generated deny-by-default SBPL profile.

``sbpl_profile`` is a pure function from a policy to the profile text; unit
tests check its content (there is no macOS machine in CI, so the backend
itself is untested on a real kernel and says so in ``limitations``). The
environment reaches the process through ``sandbox-exec``'s own environment,
never its command line.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import shutil
import sys
from typing import IO

from stockade.errors import InfraError
from stockade.sandbox import _lifetime
from stockade.sandbox._launch import proxy_env, proxy_url, ulimit_prefix
from stockade.sandbox._popen import PopenJail
from stockade.sandbox.base import Availability, Backend, Running
from stockade.sandbox.policy import Policy

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
#: What a process needs to start on macOS: the dyld shared cache, system
#: frameworks and libraries, the standard binaries.
SYSTEM_READ: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/System",
    "/Library/Apple",
    "/private/var/db/dyld",
    "/private/var/db/timezone",
    "/opt/homebrew",
    "/usr/local",
)
ETC_READ: tuple[str, ...] = (
    "/private/etc/hosts",
    "/private/etc/passwd",
    "/private/etc/group",
    "/private/etc/localtime",
    "/private/etc/shells",
    "/private/etc/resolv.conf",
)
ETC_DIRS: tuple[str, ...] = ("/private/etc/ssl",)
#: The loopback port the in-jail HTTP proxy listens on (``network: proxy``).
PROXY_PORT = 3128


def sbpl_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbpl_profile(policy: Policy, *, proxy_port: int | None = None) -> str:
    """The SBPL profile for ``policy``. Pure."""
    work = sbpl_quote(str(policy.work_dir))
    scratch = sbpl_quote(str(policy.scratch_dir))
    lines = [
        "(version 1)",
        "(deny default)",
        "(allow process-fork)",
        "(allow signal (target same-sandbox))",
        "(allow sysctl-read)",
        "(allow mach-lookup (global-name \"com.apple.system.opendirectoryd.libinfo\"))",
        "(allow file-read-metadata (literal \"/\") (literal \"/private\") (literal \"/var\")"
        " (literal \"/etc\") (literal \"/tmp\"))",
        "(allow file-read* process-exec "
        + " ".join(f"(subpath {sbpl_quote(p)})" for p in SYSTEM_READ)
        + ")",
        "(allow file-read* " + " ".join(f"(literal {sbpl_quote(p)})" for p in ETC_READ)
        + " " + " ".join(f"(subpath {sbpl_quote(p)})" for p in ETC_DIRS) + ")",
        "(allow file-read* file-write-data (literal \"/dev/null\") (literal \"/dev/zero\")"
        " (literal \"/dev/dtracehelper\"))",
        "(allow file-read* (literal \"/dev/urandom\") (literal \"/dev/random\"))",
        f"(allow file-read* file-write* process-exec (subpath {work}) (subpath {scratch}))",
    ]  # fmt: skip
    for m in policy.mounts:
        rights = "file-read* file-write*" if m.writable else "file-read* process-exec"
        lines.append(f"(allow {rights} (subpath {sbpl_quote(str(m.source))}))")
        if m.source.suffix == ".sock" or "sock" in m.source.name:
            lines.append(
                f"(allow network-outbound (remote unix-socket (path-literal "
                f"{sbpl_quote(str(m.source))})))"
            )
    if policy.network == "open":
        lines.append("(allow network* system-socket)")
    elif policy.network == "proxy":
        port = proxy_port if proxy_port is not None else PROXY_PORT
        lines.append(f'(allow network-outbound (remote tcp "localhost:{port}"))')
        lines.append("(allow system-socket)")
    return "\n".join(lines) + "\n"


def sandbox_exec_argv(policy: Policy, *, proxy_port: int | None = None) -> list[str]:
    """The full command line. Pure."""
    return [
        SANDBOX_EXEC,
        "-p",
        sbpl_profile(policy, proxy_port=proxy_port),
        *ulimit_prefix(policy.resources),
        *policy.argv,
    ]


class SandboxExecBackend(Backend):
    name = "sandbox-exec"

    def availability(self) -> Availability:
        if sys.platform != "darwin":
            return Availability(False, "sandbox-exec exists only on macOS")
        if shutil.which("sandbox-exec") is None:
            return Availability(False, "sandbox-exec not found (part of macOS)")
        return Availability(True)

    def limitations(self) -> tuple[str, ...]:
        return (
            "untested in CI (no macOS machine); the profile is checked by content only",
            "no pid namespace: other processes are visible",
            "network: proxy is not wired on macOS yet (the profile allows only a loopback port)",
            "the keychain is unreachable, so tools that log in through it fail",
        )

    def start(self, policy: Policy, *, stdout: IO[bytes] | int, stderr: IO[bytes] | int) -> Running:
        if policy.image_root is not None or policy.shared_inputs:
            raise InfraError("sandbox-exec cannot change a jail's root or bind files: image: "
                             "needs the bwrap backend")
        policy.scratch_dir.mkdir(parents=True, exist_ok=True)
        env = dict(policy.env)
        env["HOME"] = str(policy.scratch_dir)
        env["TMPDIR"] = str(policy.scratch_dir)
        if policy.network == "proxy":
            env.update(proxy_env(proxy_url(policy, PROXY_PORT)))
        # A process group, registered with the watchdog.
        running, _ = _lifetime.get().start(lambda _g: PopenJail(
            sandbox_exec_argv(policy), cwd=policy.work_dir, env=env, stdout=stdout,
            stderr=stderr, fds=policy.pass_fds,
        ))  # fmt: skip
        return running
