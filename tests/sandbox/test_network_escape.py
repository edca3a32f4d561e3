"""Network escapes with ``network: proxy``: every path past the allowlist fails.

A canary TCP server listens on the host's loopback. A jail whose only
allowed route is the egress proxy tries to reach it the ways that slip past
Landlock's TCP connect/bind hooks (MPTCP, SCTP, TCP Fast Open through every
send call and through ``TCP_FASTOPEN_CONNECT``, an IPv4-mapped IPv6 address)
and to serve the host (``listen`` on an unbound socket). Nothing may reach the
canary, and the jail must have run (a marker made here at run time). The
same script under ``none`` reaches the canary every way: the attacks work.

Another local user (``setpriv`` to a spare uid when the tests run as root)
tries the proxy without the item's credential: through the relay port the
jail was given (on the host's loopback only where landlock runs without a
network namespace of its own) and through the proxy's unix socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.errors import InfraError
from stockade.sandbox import EgressProxy, Policy, Running
from stockade.sandbox.landlock import LandlockBackend
from tests.sandbox.conftest import World

pytestmark = pytest.mark.sandbox

#: Run as ``python3 -I -S -c ATTACKS MARKER PORT``. Each attempt sends its own
#: name, so the canary server knows which one reached it.
ATTACKS = r"""
import ctypes, socket, struct, sys
marker, port = sys.argv[1], int(sys.argv[2])
print('ran', marker, flush=True)
A = ('127.0.0.1', port)
MSG_FASTOPEN = 0x20000000
kept = []

def tcp(family=socket.AF_INET, proto=0):
    s = socket.socket(family, socket.SOCK_STREAM, proto)
    s.settimeout(10)
    kept.append(s)
    return s

def mptcp():
    s = tcp(proto=262)
    s.connect(A)
    s.sendall(b'mptcp')
    return s

def sctp():
    s = tcp(proto=132)
    s.connect(A)
    s.sendall(b'sctp')
    return s

# Fast Open sockets block: a non-blocking one gives EINPROGRESS and sends
# only the SYN (then the data would never come).
def tfo_sendto():
    s = tcp()
    s.settimeout(None)
    s.sendto(b'tfo_sendto', MSG_FASTOPEN, A)
    s.settimeout(10)
    return s

def tfo_sendmsg():
    s = tcp()
    s.settimeout(None)
    s.sendmsg([b'tfo_sendmsg'], [], MSG_FASTOPEN, A)
    s.settimeout(10)
    return s

def tfo_sendmmsg():
    class iovec(ctypes.Structure):
        _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
    class msghdr(ctypes.Structure):
        _fields_ = [('name', ctypes.c_void_p), ('namelen', ctypes.c_uint32),
                    ('iov', ctypes.POINTER(iovec)), ('iovlen', ctypes.c_size_t),
                    ('control', ctypes.c_void_p), ('controllen', ctypes.c_size_t),
                    ('flags', ctypes.c_int)]
    class mmsghdr(ctypes.Structure):
        _fields_ = [('hdr', msghdr), ('len', ctypes.c_uint)]
    libc = ctypes.CDLL(None, use_errno=True)
    s = tcp()
    s.settimeout(None)
    data = ctypes.create_string_buffer(b'tfo_sendmmsg')
    raw = struct.pack('=H', socket.AF_INET) + struct.pack('!H', port)
    raw += socket.inet_aton(A[0]) + bytes(8)
    addr = ctypes.create_string_buffer(raw, len(raw))
    iov = iovec(ctypes.cast(data, ctypes.c_void_p), 12)
    hdr = msghdr(ctypes.cast(addr, ctypes.c_void_p), len(raw), ctypes.pointer(iov), 1, None, 0, 0)
    m = mmsghdr(hdr, 0)
    if libc.sendmmsg(s.fileno(), ctypes.byref(m), 1, MSG_FASTOPEN) < 0:
        e = ctypes.get_errno()
        raise OSError(e, 'sendmmsg')
    s.settimeout(10)
    return s

def tfo_connect():
    s = tcp()
    s.setsockopt(socket.IPPROTO_TCP, 30, 1)  # TCP_FASTOPEN_CONNECT
    s.connect(A)
    s.sendall(b'tfo_connect')
    return s

def mapped():
    s = tcp(socket.AF_INET6)
    s.connect(('::ffff:127.0.0.1', port))
    s.sendall(b'mapped')
    return s

for attack in (mptcp, sctp, tfo_sendto, tfo_sendmsg, tfo_sendmmsg, tfo_connect, mapped):
    try:
        s = attack()
        got = s.recv(200).decode(errors='replace')
        print(attack.__name__, 'REACHED', got, flush=True)
    except OSError as e:
        print(attack.__name__, 'blocked', e, flush=True)
"""
NAMES = ("mptcp", "sctp", "tfo_sendto", "tfo_sendmsg", "tfo_sendmmsg", "tfo_connect", "mapped")
#: SCTP needs a kernel module that is often missing: the control does not require it.
OPTIONAL_IN_CONTROL = {"sctp"}


class Canary:
    """A TCP server (on the host loopback by default) that records who reached it."""

    def __init__(self, secret: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.listener = socket.create_server((host, port))
        self.port = int(self.listener.getsockname()[1])
        self.secret = secret
        self.reached: list[bytes] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._served: list[threading.Thread] = []
        self.listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(conn)

    def _spawn(self, conn: socket.socket) -> None:
        t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
        self._served.append(t)
        t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                data = conn.recv(100)
                conn.sendall(f"{self.secret}\n".encode())
            except OSError:
                data = b"?"
            with self._lock:
                self.reached.append(data)

    def close(self) -> list[bytes]:
        """Stop, then take every connection still queued (one that completed
        its handshake while the jail ran is there now), and report."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self.listener.setblocking(False)
            while True:
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    break
                self._spawn(conn)
            self.listener.close()
            for t in self._served:
                t.join()
        return self.reached


@pytest.fixture
def canary(world: World) -> Iterator[Canary]:
    c = Canary(world.canary)
    yield c
    c.close()


@pytest.fixture
def egress(world: World) -> Iterator[EgressProxy]:
    sockdir = world.base / "proxy"
    sockdir.mkdir()
    with EgressProxy(["example.invalid:443"], world.meta / "network.jsonl", sockdir) as p:
        yield p


def _attack(w: World, port: int, **kw: object) -> tuple[str, str]:
    marker = secrets.token_hex(8)
    r = w.py(ATTACKS, marker, str(port), timeout=120, **kw)
    assert f"ran {marker}" in r.out, r.both
    return marker, r.both


def test_proxy_jail_reaches_nothing_past_the_relay(
    world: World, canary: Canary, egress: EgressProxy
) -> None:
    _, out = _attack(world, canary.port, network="proxy", proxy=egress)
    reached = canary.close()
    assert reached == [], out
    assert world.canary not in out
    for name in NAMES:
        assert f"{name} blocked" in out, out
    # Nothing went through the proxy either, so its log is empty.
    assert not (world.meta / "network.jsonl").exists()


def test_control_attacks_reach_the_canary_without_a_sandbox(none_world: World) -> None:
    canary = Canary(none_world.canary)
    try:
        _, out = _attack(none_world, canary.port)
    finally:
        reached = canary.close()
    names = {r.decode(errors="replace") for r in reached}
    assert set(NAMES) - OPTIONAL_IN_CONTROL <= names, out
    assert none_world.canary in out


LISTEN = r"""
import os, socket, sys, time
marker, mode, portfile, donefile = sys.argv[1:5]
print('ran', marker, flush=True)
try:
    s = socket.socket()
    if mode == 'bound0':
        s.bind(('127.0.0.1', 0))
    s.listen(4)
    port = s.getsockname()[1]
except OSError as e:
    print('listen blocked', e, flush=True)
    port = 0
with open(portfile + '.tmp', 'w') as f:
    f.write(str(port))
os.rename(portfile + '.tmp', portfile)
if port:
    s.settimeout(0.2)
    deadline = time.monotonic() + 60
    while not os.path.exists(donefile) and time.monotonic() < deadline:
        try:
            c, _ = s.accept()
            c.sendall(marker.encode() + b' served\n')
            c.close()
            print('accepted', flush=True)
        except OSError:
            pass
"""


def _start(w: World, argv: list[str], **kw: object) -> tuple[Running, Path, Path]:
    policy = w.policy(argv, **kw)  # type: ignore[arg-type]
    out_path, err_path = w.meta / "stdout", w.meta / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        running = w.backend.start(policy, stdout=out, stderr=err)
    return running, out_path, err_path


def _wait_for(path: Path, running: Running, timeout: float = 60) -> str:
    """Poll for a file the jail writes (or for the jail's end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        if running.wait(0.05) is not None:
            break
    return path.read_text() if path.exists() else ""


def _finish(running: Running) -> int | None:
    status = running.wait(60)
    if status is None:
        running.kill(0.5)
        status = running.wait(5)
    return status


@pytest.mark.parametrize("mode", ["unbound", "bound0"])
def test_listen_serves_nothing_to_the_host(world: World, egress: EgressProxy, mode: str) -> None:
    """``listen`` on an unbound socket binds an ephemeral port without
    Landlock's bind hook; a host client must not reach what the jail serves."""
    marker = secrets.token_hex(8)
    portfile, donefile = world.work / "port", world.work / "done"
    argv = [
        "/usr/bin/python3",
        "-I",
        "-S",
        "-c",
        LISTEN,
        marker,
        mode,
        str(portfile),
        str(donefile),
    ]
    running, out_path, err_path = _start(world, argv, network="proxy", proxy=egress)
    try:
        port = int(_wait_for(portfile, running) or "0")
        served = b""
        if port:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=10) as c,
            ):
                served = c.recv(100)
        donefile.write_text("done")
    finally:
        _finish(running)
    out = out_path.read_text() + err_path.read_text()
    assert f"ran {marker}" in out, out
    assert marker.encode() not in served, out
    assert "accepted" not in out
    if world.backend.name == "landlock":
        assert "listen blocked" in out, out


def test_control_listen_serves_the_host_without_a_sandbox(none_world: World) -> None:
    marker = secrets.token_hex(8)
    portfile, donefile = none_world.work / "port", none_world.work / "done"
    argv = ["/usr/bin/python3", "-I", "-S", "-c", LISTEN, marker, "unbound"]
    running, out_path, _ = _start(none_world, [*argv, str(portfile), str(donefile)])
    try:
        port = int(_wait_for(portfile, running))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            served = c.recv(100)
        donefile.write_text("done")
    finally:
        _finish(running)
    assert served == marker.encode() + b" served\n", out_path.read_text()


#: Another local user's client: ``CLIENT KIND WHERE REQUEST_HOSTPORT [URL]``.
#: KIND is ``tcp`` (WHERE is a port on 127.0.0.1) or ``unix`` (a socket path);
#: URL (with credentials) is the jail's proxy URL, for the positive control.
CLIENT = r"""
import base64, socket, sys, urllib.parse
kind, where, target = sys.argv[1:4]
headers = ''
if len(sys.argv) > 4:
    u = urllib.parse.urlsplit(sys.argv[4])
    cred = base64.b64encode(f'{u.username}:{u.password}'.encode()).decode()
    headers = f'Proxy-Authorization: Basic {cred}\r\n'
if kind == 'tcp':
    s = socket.create_connection(('127.0.0.1', int(where)), timeout=10)
else:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(where)
s.sendall(f'GET http://{target}/other-user HTTP/1.1\r\nHost: {target}\r\n{headers}\r\n'.encode())
data = b''
while chunk := s.recv(65536):
    data += chunk
print(data.decode(errors='replace'))
"""

SPARE_UID = 65533


def _as_other_user(*args: str) -> subprocess.CompletedProcess[str]:
    """Run CLIENT as another local uid (root tests), or as this unjailed uid."""
    # The system interpreter: the checkout (and its venv) may sit in a 0700 folder.
    argv = ["/usr/bin/python3", "-I", "-S", "-c", CLIENT, *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to act as another user"
        argv = [
            setpriv, f"--reuid={SPARE_UID}", f"--regid={SPARE_UID}", "--clear-groups", *argv,
        ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


RELAY = r"""
import os, sys, time, urllib.parse
marker, urlfile, donefile = sys.argv[1:4]
print('ran', marker, flush=True)
with open(urlfile + '.tmp', 'w') as f:
    f.write(os.environ['HTTP_PROXY'])
os.rename(urlfile + '.tmp', urlfile)
deadline = time.monotonic() + 60
while not os.path.exists(donefile) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def test_other_user_cannot_use_the_items_proxy(
    world: World, allowed_server: tuple[int, list[str]], request: pytest.FixtureRequest
) -> None:
    """While the item runs, another local user connects to the relay port in
    its proxy URL and to the proxy's unix socket, without the credential: both
    refused (407), logged, and the allowlisted server never asked. With the
    credential the same client gets through (the test can fail)."""
    aport, hits = allowed_server
    target = f"127.0.0.1:{aport}"
    # Under /tmp itself, so the other user can reach the socket even when
    # TMPDIR (and so the world) is a private folder.
    sockdir = Path(tempfile.mkdtemp(prefix="stockade-proxy-", dir="/tmp"))
    sockdir.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(sockdir, ignore_errors=True))
    log = world.meta / "network.jsonl"
    marker = secrets.token_hex(8)
    urlfile, donefile = world.work / "url", world.work / "done"
    argv = ["/usr/bin/python3", "-I", "-S", "-c", RELAY, marker, str(urlfile), str(donefile)]
    with EgressProxy([target], log, sockdir) as egress:
        running, out_path, _ = _start(world, argv, network="proxy", proxy=egress)
        try:
            url = _wait_for(urlfile, running)
            relay_port = url.rsplit(":", 1)[1].strip("/")
            by_relay = _as_other_user("tcp", relay_port, target)
            by_socket = _as_other_user("unix", str(egress.socket_path), target)
            hits_without = list(hits)
            with_credential = _as_other_user("unix", str(egress.socket_path), target, url)
            donefile.write_text("done")
        finally:
            _finish(running)
        token = egress.token
    assert f"ran {marker}" in out_path.read_text()
    assert f"stockade:{token}@127.0.0.1:" in url
    assert hits_without == [], (by_relay, by_socket)
    assert "allowed-content" not in by_relay.stdout + by_socket.stdout
    assert "407 Proxy Authentication Required" in by_socket.stdout, by_socket
    if isinstance(world.backend, LandlockBackend) and world.backend.network_gaps("proxy"):
        # No namespace of its own: the relay is on the host's loopback.
        assert "407 Proxy Authentication Required" in by_relay.stdout, by_relay
    else:  # the relay listens in the jail's own network namespace only
        assert "ConnectionRefusedError" in by_relay.stderr, by_relay
    # Positive control: the credential is all the other user lacked.
    assert "allowed-content" in with_credential.stdout, with_credential
    assert hits == ["/other-user"]
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    refused = [e for e in entries if not e["allowed"]]
    assert refused and {e["reason"] for e in refused} == {"proxy credential missing"}
    assert token not in log.read_text()


def _socket_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd is gone by now
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def test_landlock_without_tcp_rules_refuses_proxy(request: pytest.FixtureRequest) -> None:
    """Below Landlock ABI 4 nothing limits where a TCP socket connects: the
    backend refuses ``network: proxy`` instead of running it unfiltered, and
    leaves no relay listening behind."""
    # Reachable by the jail uid, so the refusal is the network one.
    tmp_path = Path(tempfile.mkdtemp(prefix="stockade-abi3-", dir="/tmp"))
    tmp_path.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
    backend = LandlockBackend()
    backend._abi = 3  # what an older kernel reports
    work, scratch = tmp_path / "work", tmp_path / "scratch"
    work.mkdir()
    with EgressProxy([], tmp_path / "network.jsonl", tmp_path) as egress:
        policy = Policy(
            argv=("/bin/true",), work_dir=work, scratch_dir=scratch, env={"PATH": "/usr/bin"},
            network="proxy", proxy_socket=egress.socket_path, proxy_token=egress.token,
        )  # fmt: skip
        before = _socket_fds()
        with pytest.raises(InfraError, match="ABI >= 4"):
            backend.start(policy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert _socket_fds() == before
    backend.close()
