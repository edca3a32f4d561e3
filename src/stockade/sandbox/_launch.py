"""What every backend's launch takes from the policy, in each launcher's terms.

The step's limits three ways from one table (``setrlimit`` pairs for the C
launcher and the helpers, ``prlimit`` options inside a bwrap jail, a POSIX
``sh`` wrapper where only a shell can set them), and the variables that
point a jail at its egress proxy. Pure.

Imports nothing of stockade but ``stockade.errors`` and ``stockade.sandbox.policy``.
"""

from __future__ import annotations

import resource
from collections.abc import Iterator
from typing import NamedTuple

from stockade.errors import InfraError
from stockade.sandbox.policy import Policy, Resources


class _Limit(NamedTuple):
    """One limit of ``Resources`` as each launcher names it."""

    field: str
    #: ``RLIMIT_*`` for ``base_rlimits``; None for processes: RLIMIT_NPROC
    #: counts per uid, so each backend sets it as its jail needs.
    rlimit: int | None
    prlimit: str
    ulimit: str
    #: The unit ``ulimit`` counts in, in the field's own units.
    ulimit_unit: int


#: In the order every launcher sets them.
_LIMITS = (
    _Limit("memory_bytes", resource.RLIMIT_AS, "as", "-v", 1024),
    _Limit("cpu_seconds", resource.RLIMIT_CPU, "cpu", "-t", 1),
    _Limit("processes", None, "nproc", "-u", 1),
    _Limit("file_size_bytes", resource.RLIMIT_FSIZE, "fsize", "-f", 512),
)


def _set(resources: Resources) -> Iterator[tuple[_Limit, int]]:
    """The limits ``resources`` sets, with their values."""
    for limit in _LIMITS:
        value = getattr(resources, limit.field)
        if value is not None:
            yield limit, value


def base_rlimits(resources: Resources) -> list[tuple[int, int]]:
    """No core dumps, and the step's memory, CPU and file-size limits, as
    ``(RLIMIT_*, value)`` pairs; each backend adds what its jail needs."""
    return [(resource.RLIMIT_CORE, 0),
            *((limit.rlimit, value) for limit, value in _set(resources)
              if limit.rlimit is not None)]


def rlimit_prefix(resources: Resources, prlimit: str | None) -> list[str]:
    """``prlimit --as=... --`` for the limits that are set (core dumps always off)."""
    opts = [f"--{limit.prlimit}={value}" for limit, value in _set(resources)]
    if not opts:
        return []
    if prlimit is None:
        raise InfraError("resource limits need prlimit: apt-get install util-linux")
    return [prlimit, *opts, "--core=0", "--"]


def ulimit_prefix(resources: Resources) -> list[str]:
    """A POSIX ``sh`` wrapper setting rlimits (``-v`` counts KiB, ``-f``
    512-byte blocks; at least one of either)."""
    opts = [f"ulimit {limit.ulimit} "
            f"{value if limit.ulimit_unit == 1 else max(value // limit.ulimit_unit, 1)}"
            for limit, value in _set(resources)]
    if not opts:
        return []
    return ["/bin/sh", "-c", "; ".join(opts) + '; exec "$0" "$@"']


def proxy_url(policy: Policy, port: int) -> str:
    """The proxy URL a jail gets: the loopback relay, with the item's credential."""
    if policy.proxy_token is None:
        raise InfraError("network: proxy needs the egress proxy's credential (policy.proxy_token)")
    return f"http://stockade:{policy.proxy_token}@127.0.0.1:{port}"


def proxy_env(url: str) -> dict[str, str]:
    """The variables that send a jail's HTTP clients through ``url``."""
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = url
        env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = ""
    return env
