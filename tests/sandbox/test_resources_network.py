"""Resources (rlimits inside the jail) and network modes, in real jails.

The network tests run real HTTP servers on the host loopback and the real
egress proxy: an allowlisted host is reachable from the jail through the
proxy, another is refused, and both are logged.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.sandbox import EgressProxy, Resources
from tests.sandbox.conftest import World, host_daemon_socket

pytestmark = pytest.mark.sandbox

MiB = 1024 * 1024


def test_memory_hog_is_stopped(world: World) -> None:
    r = world.py(
        "import sys\ntry:\n    b = bytearray(1 << 30)\n    print('allocated')\n"
        "except MemoryError:\n    print('refused')\n    sys.exit(3)\n",
        resources=Resources(memory_bytes=256 * MiB),
    )
    assert "allocated" not in r.out
    assert r.status == 3, r.both


def test_fork_bomb_is_contained(world: World) -> None:
    r = world.py(
        "import os, time\n"
        "n = 0\n"
        "pids = []\n"
        "while n < 500:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(3)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print('forked', n)\n",
        resources=Resources(processes=20),
        timeout=30,
    )
    forked = int(r.out.split("forked")[1].split()[0])
    assert "refused" in r.out, r.both
    assert forked < 25, r.out


def test_big_file_write_fails(world: World) -> None:
    r = world.run(
        "head -c 5000000 /dev/zero > big; echo rc=$?",
        resources=Resources(file_size_bytes=1 * MiB),
    )
    assert "rc=0" not in r.out
    assert (world.work / "big").stat().st_size <= 1 * MiB


def test_cpu_limit_stops_a_busy_loop(world: World) -> None:
    r = world.run("while :; do :; done", resources=Resources(cpu_seconds=1), timeout=20)
    assert r.status is not None and r.status != 0


def test_limits_leave_normal_work_alone(world: World) -> None:
    r = world.run(
        "echo hi > out/a && sh -c 'echo child' && ls out",
        resources=Resources(
            memory_bytes=512 * MiB, cpu_seconds=10, processes=50, file_size_bytes=MiB
        ),
    )
    assert r.status == 0, r.both
    assert "child" in r.out


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def _server(body: bytes) -> tuple[http.server.ThreadingHTTPServer, int]:
    handler = type("H", (_Handler,), {"body": body})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


@pytest.fixture
def servers(world: World) -> Iterator[tuple[int, int]]:
    allowed, aport = _server(b"allowed-content\n")
    refused, rport = _server(f"refused-{world.canary}\n".encode())
    yield aport, rport
    allowed.shutdown()
    refused.shutdown()


@pytest.fixture
def proxy(world: World, servers: tuple[int, int]) -> Iterator[EgressProxy]:
    sockdir = world.base / "proxy"
    sockdir.mkdir()
    p = EgressProxy([f"127.0.0.1:{servers[0]}"], world.meta / "egress.jsonl", sockdir)
    p.start()
    yield p
    p.close()


def _log(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_proxy_allows_only_the_allowlist(
    world: World, servers: tuple[int, int], proxy: EgressProxy
) -> None:
    aport, rport = servers
    r = world.run(
        "curl -sS --max-time 5 http://127.0.0.1:$1/; echo curl=$?; "
        "curl -sS --max-time 5 http://127.0.0.1:$2/; echo curl=$?; "
        "curl -sS --max-time 5 -p http://127.0.0.1:$1/tunnel; echo curl=$?",
        str(aport),
        str(rport),
        network="proxy",
        proxy=proxy,
    )
    assert r.out.count("allowed-content") == 2, r.both
    assert world.canary not in r.both
    log = _log(world.meta / "egress.jsonl")
    allowed = [e for e in log if e["allowed"]]
    refused = [e for e in log if not e["allowed"]]
    assert {e["port"] for e in allowed} == {aport}
    assert {(e["host"], e["port"]) for e in refused} == {("127.0.0.1", rport)}
    assert {e["method"] for e in allowed} == {"GET", "CONNECT"}


def test_proxy_works_with_python_urllib(
    world: World, servers: tuple[int, int], proxy: EgressProxy
) -> None:
    aport, rport = servers
    r = world.py(
        "import sys, urllib.request\n"
        "for port in sys.argv[1:]:\n"
        "    try:\n"
        "        print(urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=5).read().decode())\n"
        "    except Exception as e:\n"
        "        print('failed', e)\n",
        str(aport),
        str(rport),
        network="proxy",
        proxy=proxy,
    )
    assert "allowed-content" in r.out, r.both
    assert "failed" in r.out and world.canary not in r.both


def test_proxy_mode_has_no_direct_route(
    world: World, servers: tuple[int, int], proxy: EgressProxy
) -> None:
    aport, _ = servers
    r = world.run(
        "curl -sS --noproxy '*' --max-time 3 http://127.0.0.1:$1/; echo curl=$?",
        str(aport),
        network="proxy",
        proxy=proxy,
    )
    assert "allowed-content" not in r.out
    assert "curl=0" not in r.out


def test_network_open_shares_the_host_network(world: World, servers: tuple[int, int]) -> None:
    aport, _ = servers
    r = world.run("curl -sS --max-time 5 http://127.0.0.1:$1/", str(aport), network="open")
    assert "allowed-content" in r.out, r.both


def test_network_none_reaches_nothing(world: World, servers: tuple[int, int]) -> None:
    aport, _ = servers
    r = world.run("curl -sS --max-time 3 http://127.0.0.1:$1/; echo curl=$?", str(aport))
    assert "allowed-content" not in r.out
    assert "curl=0" not in r.out


def test_swapping_the_proxy_socket_for_a_symlink_reaches_nothing_else(
    world: World, servers: tuple[int, int]
) -> None:
    """The runner keeps the proxy socket in the item's scratch dir, which a
    landlock jail can write: a symlink planted there must not redirect the
    engine's relay to another host socket (say, a container daemon's)."""

    scratch = world.base / "scratch"
    scratch.mkdir(exist_ok=True)
    proxy = EgressProxy([f"127.0.0.1:{servers[0]}"], world.meta / "egress.jsonl", scratch)
    proxy.start()
    daemon_path = world.base / "daemon.sock"
    daemon = host_daemon_socket(daemon_path)
    try:
        r = world.run(
            'sock="$1"; rm -f "$sock"; ln -s "$2" "$sock"; ls -l "$sock"; '
            "curl -sS --max-time 5 http://127.0.0.1:$3/; echo curl=$?",
            str(proxy.socket_path),
            str(daemon_path),
            str(servers[0]),
            network="proxy",
            proxy=proxy,
        )
        try:
            conn, _ = daemon.accept()
            conn.close()
            reached = True
        except OSError:
            reached = False
    finally:
        daemon.close()
        proxy.close()
    assert not reached, r.both
    assert world.canary not in r.both
    if world.backend.name == "landlock":
        # The swap happened (scratch is writable) and egress still goes to
        # the real proxy: the relay holds the socket by fd, not by name.
        assert "->" in r.out and "allowed-content" in r.out, r.both


def test_proxy_socket_in_a_deep_directory(world: World, servers: tuple[int, int]) -> None:
    deep = world.base / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    proxy = EgressProxy([f"127.0.0.1:{servers[0]}"], world.meta / "egress.jsonl", deep)
    proxy.start()
    try:
        assert len(str(proxy.socket_path)) > 108
        r = world.run(
            "curl -sS --max-time 5 http://127.0.0.1:$1/",
            str(servers[0]),
            network="proxy",
            proxy=proxy,
        )
    finally:
        proxy.close()
    assert "allowed-content" in r.out, r.both


def test_names_of_internal_addresses_need_the_literal_address(
    world: World, servers: tuple[int, int]
) -> None:
    """``localhost:PORT`` on the allowlist does not open the host's loopback:
    the proxy refuses a name that resolves to an internal address unless the
    allowlist names that address itself."""
    aport, _ = servers
    script = "curl -sSf --max-time 5 http://localhost:$1/; echo curl=$?"
    sockdir = world.base / "proxy"
    sockdir.mkdir()
    by_name = EgressProxy([f"localhost:{aport}"], world.meta / "name.jsonl", sockdir)
    with by_name:
        refused = world.run(script, str(aport), network="proxy", proxy=by_name)
    literal = [f"localhost:{aport}", f"127.0.0.1:{aport}", f"[::1]:{aport}"]
    with EgressProxy(literal, world.meta / "literal.jsonl", sockdir) as named:
        allowed = world.run(script, str(aport), network="proxy", proxy=named)
    assert "allowed-content" not in refused.out and "curl=0" not in refused.out, refused.both
    (entry,) = _log(world.meta / "name.jsonl")
    assert entry["allowed"] is False and entry["host"] == "localhost"
    assert str(entry["reason"]).startswith("resolves to loopback address"), entry
    assert "allowed-content" in allowed.out, allowed.both
    (entry,) = _log(world.meta / "literal.jsonl")
    assert entry["allowed"] is True and entry["address"] == "127.0.0.1"
