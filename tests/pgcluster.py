"""A throwaway PostgreSQL cluster for tests and benchmarks: ``initdb`` + ``pg_ctl``
in a temporary directory, reached over a unix socket only.

initdb refuses to run as root, so as root the cluster is created and run as the
``postgres`` user (or ``nobody``). Without the binaries, ``find_bin`` returns
None and the fixtures skip naming the package to install (CI turns the skip
into a failure with ``--strict-skips``).

Imported by the ``conftest.py`` of the test folders that need PostgreSQL.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

APT_PACKAGE = "postgresql"


def find_bin() -> Path | None:
    """The directory holding initdb and pg_ctl, newest version first."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return ["runuser", "-u", name, "--"]
    raise RuntimeError("running as root and no unprivileged user (postgres, nobody) to run initdb")


@dataclass
class Cluster:
    dir: Path
    port: int
    bindir: Path

    @property
    def socket_dir(self) -> Path:
        return self.dir / "sock"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.socket_dir}&port={self.port}"

    def new_database(self) -> str:
        """A fresh empty database; returns its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def cluster(*, durable: bool = False, parent: str | None = None) -> Iterator[Cluster]:
    """Start a cluster; ``durable=False`` turns fsync off to keep tests fast. ``parent``
    picks the folder for its files (benchmarks want a real disk, not tmpfs)."""
    bindir = find_bin()
    if bindir is None:
        raise FileNotFoundError(f"PostgreSQL server binaries not found (apt-get install {APT_PACKAGE})")
    # Not under pytest's tmp_path: its parents are root-only and the server user must
    # traverse. /var/tmp rather than /tmp: a session-long server should not share the
    # folder every test scribbles in.
    if parent is None:
        parent = os.environ.get("STOCKADE_PG_TMPDIR") or (
            "/var/tmp" if os.access("/var/tmp", os.W_OK) else None)
    base = Path(tempfile.mkdtemp(prefix="stockade-pg-", dir=parent))
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # `timeout` and CI runners stop pytest with SIGTERM: stop the server too.
        signal.signal(signal.SIGTERM, _raise_exit)
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    runas = _as_user()
    if runas:
        uid = pwd.getpwnam(runas[2]).pw_uid
        for p in (base, sock):
            os.chown(p, uid, -1)
    port = _free_port()
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    try:
        subprocess.run(
            [*runas, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True, env=env,
        )
        opts = f"-k {sock} -p {port} -c listen_addresses='' -c max_connections=100"
        if not durable:
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        subprocess.run(
            [*runas, str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l",
             str(base / "log"), "-w", "-t", "60", "start"],
            check=True, capture_output=True, env=env,
        )
        yield Cluster(dir=base, port=port, bindir=bindir)
    finally:
        subprocess.run(
            [*runas, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True, env=env,
        )
        shutil.rmtree(base, ignore_errors=True)
