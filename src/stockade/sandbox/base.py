"""The interface every sandbox backend implements.

A backend is mechanism: it turns a ``Policy`` into a running process. Whether
it is *enforced* is never taken from configuration: ``stockade.sandbox.probe``
runs a real jail that tries to escape and reports what the kernel did.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import IO, ClassVar, Literal, Protocol

from stockade.sandbox.policy import NetworkMode, Policy, Resources

InputSharing = Literal["bind", "link", "copy"]


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on this machine, and if not, why (actionable)."""

    available: bool
    reason: str = ""


class Running(Protocol):
    """A started jail. The runner owns timeouts and cancellation through this."""

    @property
    def pid(self) -> int: ...

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds; return the exit status or ``None``.

        A negative status ``-N`` means killed by signal N. Once the main
        process has ended, whatever it left running is SIGKILLed.
        """
        ...

    def kill(self, grace: float = 2.0) -> None:
        """End the whole jail: SIGTERM to its process group, then SIGKILL to
        every process of it after ``grace``; returns once none is left (or,
        for a process the kernel cannot end yet, after a bounded wait)."""
        ...


def jail_left_nothing(running: Running) -> bool:
    """Whether every process of the jail was seen gone once ``wait`` returned
    its status (its cgroup found empty, with nothing left to kill): nothing
    of it can still create a file, so the folders it wrote may be used again
    as they are. True only where the backend knows; False for anything else.
    """
    return bool(getattr(running, "left_nothing", False))


class Backend(abc.ABC):
    """One way of running a policy. Subclasses are stateless apart from caches."""

    name: ClassVar[str]
    #: The jail has a mount namespace of its own: it can show a folder at
    #: another path (a toolchain's declared one) and take another root
    #: filesystem (``image:``). Without one, ``image:`` is refused at run start.
    mount_namespace: ClassVar[bool] = False

    @abc.abstractmethod
    def availability(self) -> Availability:
        """Cheap check (binaries, kernel features); does not prove enforcement."""

    @abc.abstractmethod
    def limitations(self) -> tuple[str, ...]:
        """Human sentences naming what this backend does not isolate."""

    def unapplied(self, resources: Resources) -> tuple[str, ...]:
        """Sentences naming which of ``resources`` this backend cannot apply here."""
        return ()

    def network_gaps(self, network: NetworkMode) -> tuple[str, ...]:
        """Sentences naming what of a step's ``network`` this backend cannot
        enforce here (the engine prints them when such a step starts)."""
        return ()

    def input_sharing(self) -> InputSharing:
        """How a large read-only input may enter this backend's jails without a copy.

        ``bind``: a read-only bind mount over a placeholder (``Policy.shared_inputs``);
        ``link``: an engine-owned, read-only hard link (the jail runs as another
        uid, which cannot change it); ``copy``: neither (a reflink, else a copy).
        """
        return "copy"

    def scratch_mount_points(self, policy: Policy) -> frozenset[str]:
        """Names of the empty folders a jail of ``policy`` leaves in its
        scratch folder as its own mount points, which the jail itself could
        neither enter nor change (the scratch may be lent again with them)."""
        return frozenset()

    @abc.abstractmethod
    def start(self, policy: Policy, *, stdout: IO[bytes] | int, stderr: IO[bytes] | int) -> Running:
        """Start ``policy.argv`` in a jail; stdin is always ``/dev/null``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release helpers (a fork server, a proxy); called once at run end."""
