"""Reaching a Dask cluster and learning what its workers can enforce.

``connect`` gives a client, or an error that says what to start or install
(a port where nothing listens fails at once, not after Dask's 30 s);
``survey`` probes every worker's sandbox (``runner.worker.probe_worker``)
and, when the run requires an enforced sandbox, keeps only the workers that
have one. The result, ``Cluster``, goes into the run's manifest and its
sandbox line.

Must not import the engine, the executors or the CLI; distributed is imported
when a client is made.
"""

from __future__ import annotations

import contextlib
import socket
import warnings
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from stockade.errors import InfraError, UserError


def scheduler_address(url: str) -> str:
    """``dask://HOST:PORT`` (or ``tcp://``, ``tls://``) as a Dask scheduler address."""
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError:
        raise UserError(f"--executor {url!r}: the port must be a number from 1 to 65535") from None
    if parsed.scheme not in ("dask", "tcp", "tls") or not parsed.hostname or not port:
        raise UserError(f"--executor {url!r}: expected local or dask://HOST:PORT (the address "
                        "`dask scheduler` prints, with dask:// for tcp://)")
    scheme = "tcp" if parsed.scheme == "dask" else parsed.scheme
    return f"{scheme}://{parsed.netloc}"


def connect(url: str, timeout: float | None = None) -> Any:
    """A Dask client for ``url``, or an error that says what to install or start.

    ``timeout`` defaults to Dask's ``distributed.comm.timeouts.connect`` (30 s)."""
    try:
        from distributed import Client
    except ImportError:
        raise UserError(f"--executor {url}: Dask is not installed here: "
                        "pip install 'stockade[dask]'") from None
    address = scheduler_address(url)
    _refused(address, 5.0 if timeout is None else min(5.0, timeout))
    # A large input sent without --artifacts is the README's documented
    # trade; Dask's multi-line warning about it would land in the run's output.
    warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
    try:
        if timeout is None:
            return Client(address, set_as_default=False)  # type: ignore[no-untyped-call]
        return Client(address, timeout=timeout,  # type: ignore[no-untyped-call]
                      set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise _unreachable(address, str(exc)) from None
    except Exception as exc:  # whatever a peer that is not Dask made its client raise
        raise _not_dask(address, f"{type(exc).__name__}: {exc}") from None


def _not_dask(address: str, why: str) -> InfraError:
    return InfraError(f"the service at {address} is not a Dask scheduler ({why}); check "
                      "--executor / $STOCKADE_EXECUTOR: it takes the address `dask scheduler` "
                      "prints")


#: How long a scheduler may take to greet a new connection. Dask's scheduler
#: writes its handshake as soon as it accepts; Dask's client waits for it
#: without a limit, so a service that never speaks (an HTTP server) hung it.
GREETING_WAIT = 10.0


def greets_as_dask(first: bytes) -> str | None:
    """Why the first bytes a service sent are not a Dask handshake, or None.
    Dask's messages begin with 8-byte little-endian counts (frames, lengths):
    small numbers, where a text protocol's greeting (``HTTP/1.1``,
    ``SSH-2.0-``) reads as a huge one."""
    if not first:
        return f"it sent nothing within {GREETING_WAIT:.0f} s of the connection"
    if len(first) >= 8 and int.from_bytes(first[:8], "little") < 1 << 20:
        return None
    text = first.split(b"\r\n", 1)[0][:60].decode("ascii", "replace")
    return f"it greeted with {text!r}"


def _unreachable(address: str, why: str) -> InfraError:
    return InfraError(f"cannot reach the Dask scheduler at {address}: {why}; start it "
                      "(`dask scheduler`) or check --executor / $STOCKADE_EXECUTOR "
                      "(`--executor local` runs on this machine)")


def _refused(address: str, wait: float) -> None:
    """Fail at once when nothing listens at ``address``: Dask's client retries a
    refused connection until its timeout (30 s), a long wait for a wrong port.
    Anything else (a port that does not answer, a name that does not resolve)
    is left to the client and its timeout."""
    parsed = urlparse(address)
    try:
        with socket.create_connection((parsed.hostname or "", parsed.port or 0),
                                      timeout=wait) as s:
            if parsed.scheme != "tcp":
                return  # TLS speaks first from the client
            s.settimeout(GREETING_WAIT)
            first = b""
            with contextlib.suppress(TimeoutError, OSError):
                while len(first) < 8:
                    chunk = s.recv(8 - len(first))
                    if not chunk:
                        break
                    first += chunk
    except ConnectionRefusedError:
        raise _unreachable(address, "nothing is listening there") from None
    except OSError:
        return
    why = greets_as_dask(first)
    if why is not None:
        raise _not_dask(address, why)


def probe_workers(client: Any, requested: str | None, full: bool = False) -> dict[str, Any]:
    """Each worker's sandbox, from a probe run on that worker (``runner.worker.probe_worker``)."""
    from stockade.runner.worker import probe_worker

    result: dict[str, Any] = client.run(probe_worker, requested, full)
    return result


@dataclass(frozen=True)
class Cluster:
    """What the run learnt of the cluster at its start (recorded in the manifest)."""

    scheduler: str
    workers: dict[str, Any]
    #: Workers jobs may go to (None: any; set when ``require`` refused some).
    allowed: tuple[str, ...] | None
    refused: tuple[str, ...]

    @property
    def backend(self) -> str:
        names = {str(w.get("backend")) for a, w in self.workers.items()
                 if self.allowed is None or a in self.allowed}
        return names.pop() if len(names) == 1 else "mixed: " + ", ".join(sorted(names))

    @property
    def enforced(self) -> bool:
        used = [w for a, w in self.workers.items() if self.allowed is None or a in self.allowed]
        return bool(used) and all(w.get("enforced") for w in used)

    def line(self) -> str:
        n = len(self.workers) - len(self.refused)
        what = "enforced" if self.enforced else "NOT ENFORCED on some workers"
        text = f"executor: dask {self.scheduler}, {n} worker{'s' if n != 1 else ''}; " \
               f"sandbox on the workers: {self.backend} ({what})"
        if self.refused:
            text += f"; refused (not enforced): {', '.join(self.refused)}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"kind": "dask", "scheduler": self.scheduler,
                "workers": {a: {k: w.get(k) for k in ("name", "host", "backend", "enforced")}
                            for a, w in self.workers.items()},
                "refused": list(self.refused)}


def survey(client: Any, requested: str | None, require: bool) -> Cluster:
    """Probe every worker; under ``require`` keep only the enforced ones (none: an error)."""
    workers = probe_workers(client, requested)
    if not workers:
        raise InfraError(f"the Dask cluster at {client.scheduler.address} has no workers; "
                         "start some (`dask worker ADDRESS`)")
    refused = tuple(sorted(a for a, w in workers.items() if not w.get("enforced")))
    allowed = None
    if require and refused:
        allowed = tuple(sorted(a for a in workers if a not in refused))
        if not allowed:
            detail = "; ".join(f"{workers[a].get('name')}: {workers[a].get('backend')} "
                               f"({workers[a].get('reason')})" for a in refused)
            raise UserError("this run requires an enforced sandbox, and no worker of the "
                            f"Dask cluster has one ({detail}); install bubblewrap on the "
                            "workers or run `stockade doctor --executor ...`")
    return Cluster(str(client.scheduler.address), workers, allowed,
                   refused if require else ())
