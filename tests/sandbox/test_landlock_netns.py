"""A root engine's landlock jail with ``network: proxy`` reaches only its relay.

Landlock's TCP rules name ports, not addresses: on the host's network stack
a jail allowed to connect to the relay's port reaches *any* address on that
port number. A root engine gives such a jail a network namespace of its own
(only ``lo``, the engine's relay listening on it). Here the jail learns its
relay port, the test puts canary servers on that very port number on
another loopback address (127.0.0.2), on the host's non-loopback address,
and on the host's 127.0.0.1, and the jail tries each, plus its relay
without the credential. Nothing may reach a canary, the allowlisted request
through the proxy must still work, and the jail must have run (a marker made
here at run time). The positive control is the same jail with the namespace
switched off (``LandlockBackend.private_network``, test-only): it reaches
the canaries, so the attack is real and the namespace is what stops it.

Root only (``conftest.collect_ignore``): an unprivileged engine cannot make
the namespace and says so (``test_non_root_engine``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import secrets
import socket
import struct

import pytest

from stockade.sandbox import Backend, EgressProxy
from stockade.sandbox.landlock import LandlockBackend
from tests.sandbox.conftest import World, available_backend
from tests.sandbox.test_network_escape import Canary, _finish, _start, _wait_for

pytestmark = pytest.mark.sandbox

#: ``python3 -I -S -c JAIL MARKER URLFILE GOFILE ALLOWED_PORT``: publish the
#: proxy URL, wait for the targets, try each, then the allowed request.
JAIL = r"""
import json, os, socket, subprocess, sys, time, urllib.parse
marker, urlfile, gofile, aport = sys.argv[1:5]
print('ran', marker, flush=True)
url = os.environ['HTTP_PROXY']
with open(urlfile + '.tmp', 'w') as f:
    f.write(url)
os.rename(urlfile + '.tmp', urlfile)
deadline = time.monotonic() + 60
while not os.path.exists(gofile) and time.monotonic() < deadline:
    time.sleep(0.02)
with open('/proc/self/net/dev') as f:
    names = sorted(line.split(':')[0].strip() for line in f.readlines()[2:])
print('interfaces', ','.join(names), flush=True)
# Each attempt looks like a proxy request (so the relay, when that is what
# answers, answers at once) and names itself to the canary it may reach.
for name, host, port in json.load(open(gofile)):
    try:
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(f'GET http://{name}/ HTTP/1.1\r\n\r\n'.encode())
        got = s.recv(200).decode(errors='replace').splitlines()
        print(name, 'connected', got[0] if got else '', flush=True)
    except OSError as e:
        print(name, 'blocked', e, flush=True)
# A second connection to the relay, without the credential.
port = urllib.parse.urlsplit(url).port
s = socket.create_connection(('127.0.0.1', port), timeout=10)
s.sendall(f'GET http://127.0.0.1:{aport}/bare HTTP/1.1\r\nHost: x\r\n\r\n'.encode())
print('bare', s.recv(200).decode(errors='replace').splitlines()[0], flush=True)
s.close()
r = subprocess.run(['curl', '-sS', '--max-time', '20', f'http://127.0.0.1:{aport}/allowed'],
                   capture_output=True, text=True)
print('curl', r.returncode, r.stdout.strip(), r.stderr.strip(), flush=True)
"""


@pytest.fixture(params=("landlock", "landlock-python"))
def backend(request: pytest.FixtureRequest) -> Backend:
    return available_backend(request, request.param)


def host_address() -> str:
    """An IPv4 address of one of the host's non-loopback interfaces."""
    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            if name == "lo":
                continue
            with contextlib.suppress(OSError):  # an interface without IPv4
                got = fcntl.ioctl(s, SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                return socket.inet_ntoa(got[20:24])
    pytest.skip("the host has no non-loopback IPv4 address to put a canary on")


def _attack(world: World, aport: int, *, netns: bool) -> tuple[str, dict[str, Canary], str]:
    """Run JAIL; put canaries on its relay's port number once it knows it."""
    marker = secrets.token_hex(8)
    urlfile, gofile = world.work / "url", world.work / "go"
    argv = ["/usr/bin/python3", "-I", "-S", "-c", JAIL, marker, str(urlfile), str(gofile),
            str(aport)]  # fmt: skip
    canaries: dict[str, Canary] = {}
    with EgressProxy([f"127.0.0.1:{aport}"], world.meta / "network.jsonl",
                     world.base / "scratch") as egress:  # fmt: skip
        running, out_path, err_path = _start(world, argv, network="proxy", proxy=egress)
        try:
            url = _wait_for(urlfile, running)
            assert url, out_path.read_text() + err_path.read_text()
            port = int(url.rsplit(":", 1)[1].strip("/"))
            targets = {"loopback2": "127.0.0.2", "host": host_address()}
            if netns:
                # The host's own 127.0.0.1 on that port is free: the relay
                # listens in the jail's namespace only.
                targets["loopback1"] = "127.0.0.1"
            for name, host in targets.items():
                canaries[name] = Canary(world.canary, host, port)
            go = [[name, host, port] for name, host in targets.items()]
            (world.work / "go.tmp").write_text(json.dumps(go))
            (world.work / "go.tmp").rename(gofile)
        finally:
            _finish(running)
            for c in canaries.values():
                c.close()
    out = out_path.read_text() + err_path.read_text()
    assert f"ran {marker}" in out, out
    return out, canaries, egress.token


@pytest.mark.parametrize("netns", [True, False], ids=["own-netns", "control-host-stack"])
def test_proxy_jail_reaches_only_its_relay(
    world: World, allowed_server: tuple[int, list[str]], monkeypatch: pytest.MonkeyPatch, netns: bool
) -> None:
    backend = world.backend
    assert isinstance(backend, LandlockBackend)
    assert backend.network_gaps("proxy") == (), "a root engine makes the namespace"
    monkeypatch.setattr(backend, "private_network", netns)
    aport, hits = allowed_server
    out, canaries, token = _attack(world, aport, netns=netns)
    # The relay without the credential: the proxy refuses (both ways).
    assert "bare HTTP/1.1 407 Proxy Authentication Required" in out, out
    # The allowed request through the proxy still works.
    assert "curl 0 allowed-content" in out, out
    assert hits == ["/allowed"]
    reached = {name: [r.split(b"/")[2] for r in c.reached] for name, c in canaries.items()}
    refusals = ["proxy credential missing"]
    if netns:
        assert "interfaces lo\n" in out, out
        assert reached == {"loopback2": [], "host": [], "loopback1": []}, out
        assert "loopback2 blocked" in out and "host blocked" in out, out
        # 127.0.0.1 on that port is the relay itself, not the host's canary.
        assert "loopback1 connected HTTP/1.1 407 Proxy Authentication Required" in out, out
        refusals.append("proxy credential missing")
        assert world.canary not in out
    else:
        # Positive control: on the host's stack the relay's port number
        # reaches any address; the namespace is what stops it.
        assert "interfaces lo\n" not in out, out
        assert reached == {"loopback2": [b"loopback2"], "host": [b"host"]}, out
        assert f"loopback2 connected {world.canary}" in out, out
        assert f"host connected {world.canary}" in out, out
    log = (world.meta / "network.jsonl").read_text()
    entries = [json.loads(line) for line in log.splitlines()]
    assert [e["reason"] for e in entries] == [*refusals, "allowlisted"], entries
    assert token not in log
