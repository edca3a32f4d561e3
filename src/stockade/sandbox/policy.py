"""The sandbox policy: what one step item may read, write, reach and see.

Policy is data. Backends (bwrap, landlock, sandbox-exec, none) are mechanism:
they turn a ``Policy`` into a launch and report what the kernel enforced.

Imports nothing of stockade.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

#: The only host variables a step's environment is built from (besides its own
#: ``env`` and the secrets it lists). HOME and TMPDIR are set by the backend to
#: places inside the jail.
ENV_ALLOWLIST: tuple[str, ...] = ("PATH", "HOME", "TERM", "LANG", "LC_ALL", "TZ", "SHELL", "TMPDIR")
#: Host folders every jail without ``image:`` sees read-only (bwrap binds
#: them, landlock allows them), where they exist on the host.
SYSTEM_DIRS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class Resources:
    """Per-item rlimits; ``None`` means "not limited"."""

    memory_bytes: int | None = None
    cpu_seconds: int | None = None
    processes: int | None = None
    file_size_bytes: int | None = None


@dataclass(frozen=True)
class ExtraMount:
    """A host path made visible in the jail, read-only unless ``writable``.

    ``target`` is where it appears inside the jail; backends without a mount
    namespace (landlock, none) can only show it at its host path, so they
    require ``target == str(source)``.
    """

    source: Path
    target: str
    writable: bool = False


NetworkMode = Literal["none", "proxy", "open"]


@dataclass(frozen=True)
class Policy:
    """Everything a backend needs to start one attempt of one item.

    ``work_dir`` is the only writable host directory and the process's cwd.
    ``scratch_dir`` is a private host directory the backend may use for HOME
    and TMPDIR when it cannot mount a private tmpfs (it is never under
    ``work_dir`` and never under the engine's ``meta/``).
    ``env`` is the complete environment minus HOME and TMPDIR: already built
    from the allowlist, the step's ``env`` and its secrets. Nothing else of
    the host environment may reach the process.
    """

    argv: tuple[str, ...]
    work_dir: Path
    scratch_dir: Path
    env: Mapping[str, str]
    mounts: tuple[ExtraMount, ...] = ()
    network: NetworkMode = "none"
    #: For ``network == "proxy"``: a host unix socket of the egress proxy; the
    #: backend makes it reachable in the jail and sets HTTP(S)_PROXY/ALL_PROXY.
    proxy_socket: Path | None = None
    #: The egress proxy's per-item credential (``EgressProxy.token``): the
    #: password of the proxy URL the jail gets. Never on a command line.
    proxy_token: str | None = None
    resources: Resources = field(default_factory=Resources)
    #: A host folder shown as the jail's ``/`` instead of the host's system
    #: folders (``image:``); only backends with a mount namespace (bwrap) can.
    image_root: Path | None = None
    #: Files shown read-only at ``target`` (a placeholder the engine made in
    #: ``work_dir``) without a copy: large inputs, bound by backends that
    #: ``share_inputs() == "bind"``.
    shared_inputs: tuple[ExtraMount, ...] = ()
    #: Open host fds the process inherits, at 3, 4, ... in this order (the
    #: agent's already-connected broker socket): nothing in the jail names
    #: them by path. The backend duplicates them; the caller keeps its own.
    pass_fds: tuple[int, ...] = ()
