"""The model gateway: agent items on remote workers reach their model through the engine.

The API key stays where the operator put it: in the engine's environment.
An agent item on a worker runs its broker there, beside the files it must
check (write targets, hashes, the name-list gate), but the broker's HTTP
client is a ``GatewayClient`` transport: each model call goes to the
engine's ``Gateway``, which adds the real key and posts to the step's
provider URL as the engine resolves it (the worker cannot redirect the key
elsewhere), masks the key in what comes back and answers. The worker only
ever holds a placeholder for the key; the jail holds nothing (its one fd
reaches its broker, as on the engine).

Each attempt gets a grant: a random id and a 256-bit token that travel to
the worker inside the job. Every request is signed with the token
(HMAC-SHA256 over the grant, a sequence number that must grow, the route
and the body's sha256) and checked in constant time; every answer is signed
back, so neither side takes a message the other did not send. The token
itself is never on the wire. A grant allows a bounded number of calls and
ends with its attempt. ``/echo`` carries the broker's ``WRITE TARGET``
lines to the engine's terminal, ``/ask`` the ``approve: ask`` question.

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from stockade.agent import endpoints
from stockade.agent.record import SecretMask

#: Stands for the key on the worker; the gateway replaces it (masked in records like a key).
PLACEHOLDER = "stockade-gateway-holds-the-key"
AUTH_HEADERS = frozenset({"authorization", "x-api-key", "api-key"})
#: Headers of the provider's answer that describe the wire, not the content.
HOP_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection",
                         "keep-alive"})
MAX_BODY = 64 << 20


def _sign(token: str, *parts: str | bytes) -> str:
    mac = hmac.new(token.encode(), digestmod=hashlib.sha256)
    for p in parts:
        mac.update(p.encode() if isinstance(p, str) else p)
        mac.update(b"\n")
    return mac.hexdigest()


@dataclass
class Grant:
    token: str
    target: endpoints.Target
    provider: str
    calls_left: int
    echo: Callable[[str], None]
    ask: Callable[[str], bool] | None
    seq: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def worker_env(provider: str, model: str, step: endpoints.StepEndpoint | None,
               host_env: Mapping[str, str]) -> dict[str, str]:
    """What a worker's broker needs to build the engine's requests: never a key,
    nor a base URL's password or query values (the worker names the URL as
    ``endpoints.shown`` does; the engine compares that and posts to the real one)."""
    step = step or endpoints.StepEndpoint()
    base_var = endpoints.PROVIDER_ENV[provider][1]
    out = {k: host_env[k] for k in (base_var, endpoints.AZURE_VERSION_ENV) if k in host_env}
    if base_var in out:
        out[base_var] = endpoints.shown(out[base_var])
    target = endpoints.resolve(provider, model, step, host_env)
    if target.key_var:
        out[target.key_var] = PLACEHOLDER
    return out


class Gateway:
    """The engine's end: a small HTTP server for the grants of running attempts."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._grants: dict[str, Grant] = {}
        self._lock = threading.Lock()
        gateway = self

        class Handler(_Handler):
            owner = gateway

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="gateway",
                                        daemon=True)
        self._thread.start()
        self._http: dict[bool, httpx.Client] = {}

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def grant(self, provider: str, model: str, step: endpoints.StepEndpoint | None,
              host_env: Mapping[str, str], max_calls: int, echo: Callable[[str], None],
              ask: Callable[[str], bool] | None) -> tuple[str, str]:
        """A new grant for one attempt: (grant id, token)."""
        gid, token = secrets.token_hex(8), secrets.token_hex(32)
        target = endpoints.resolve(provider, model, step, host_env)
        with self._lock:
            self._grants[gid] = Grant(token, target, provider, max_calls, echo, ask)
        return gid, token

    def revoke(self, gid: str) -> None:
        with self._lock:
            self._grants.pop(gid, None)

    def get(self, gid: str) -> Grant | None:
        with self._lock:
            return self._grants.get(gid)

    def client(self, local: bool) -> httpx.Client:
        with self._lock:
            if local not in self._http:
                # A local server (vLLM, Ollama) is never reached through a host proxy.
                self._http[local] = httpx.Client(trust_env=not local)
            return self._http[local]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        for c in self._http.values():
            c.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: Gateway

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: bytes, headers: Mapping[str, str], grant: Grant | None,
                gid: str, seq: str) -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        if grant is not None:
            status = headers.get("x-stockade-status", "")
            self.send_header("x-stockade-sig", _sign(grant.token, "answer", gid, seq, status,
                                                     hashlib.sha256(body).hexdigest()))
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if 0 < length <= MAX_BODY else b""
        gid = self.headers.get("x-stockade-grant", "")
        seq = self.headers.get("x-stockade-seq", "")
        sig = self.headers.get("x-stockade-sig", "")
        grant = self.owner.get(gid)
        route = self.path
        if grant is None or not seq.isdigit():
            self._answer(403, b"no such grant", {}, None, gid, seq)
            return
        expected = _sign(grant.token, "request", gid, seq, route, hashlib.sha256(body).hexdigest())
        with grant.lock:
            ok = hmac.compare_digest(expected, sig) and int(seq) > grant.seq
            if ok:
                grant.seq = int(seq)
        if not ok:
            self._answer(403, b"bad signature", {}, None, gid, seq)
            return
        if route == "/echo":
            grant.echo(body.decode("utf-8", errors="replace"))
            self._answer(200, b"", {"x-stockade-status": "200"}, grant, gid, seq)
        elif route == "/ask":
            yes = grant.ask is not None and grant.ask(body.decode("utf-8", errors="replace"))
            self._answer(200, b"yes" if yes else b"no", {"x-stockade-status": "200"}, grant, gid,
                         seq)
        elif route == "/model":
            self._model(grant, gid, seq, body)
        else:
            self._answer(404, b"", {}, grant, gid, seq)

    def _model(self, grant: Grant, gid: str, seq: str, body: bytes) -> None:
        with grant.lock:
            grant.calls_left -= 1
            allowed = grant.calls_left >= 0
        wanted = self.headers.get("x-stockade-url", "")
        if not allowed or wanted != grant.target.shown:
            why = ("this attempt used up its model calls" if not allowed else
                   f"this attempt may call {grant.target.shown} only")
            self._answer(200, b"", {"x-stockade-status": "0", "x-stockade-error":
                                    f"RemoteProtocolError: refused by the engine: {why}"},
                         grant, gid, seq)
            return
        try:
            sent = json.loads(self.headers.get("x-stockade-headers") or "{}")
            timeout = float(self.headers.get("x-stockade-timeout") or 600)
        except ValueError:
            sent, timeout = {}, 600.0
        headers = {k: str(v) for k, v in sent.items() if k.lower() not in AUTH_HEADERS}
        headers.update(endpoints.headers(grant.provider, grant.target.key))
        mask = SecretMask([grant.target.key] if grant.target.key else [])
        local = httpx.URL(grant.target.url).host in ("127.0.0.1", "localhost", "::1")
        try:
            with self.owner.client(local).stream(
                    "POST", grant.target.url, content=body, headers=headers,
                    timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0))) as resp:
                data = b""
                for chunk in resp.iter_bytes():
                    data += chunk
                    if len(data) > MAX_BODY:
                        raise httpx.ReadError("response larger than 64 MiB")
                status = resp.status_code
                upstream = {k: mask.text(v) for k, v in resp.headers.items()
                            if k.lower() not in HOP_HEADERS}
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._answer(200, b"", {"x-stockade-status": "0",
                                    "x-stockade-error": mask.text(error).replace("\n", " ")},
                         grant, gid, seq)
            return
        for key in mask.secrets:
            data = data.replace(key.encode(), b"***")
        self._answer(200, data, {"x-stockade-status": str(status),
                                 "x-stockade-upstream": json.dumps(upstream)}, grant, gid, seq)


class GatewayClient:
    """The worker's end for one attempt: signs requests, checks answers."""

    def __init__(self, url: str, grant: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.grant = grant
        self._token = token
        self._seq = 0
        self._lock = threading.Lock()
        self._plain = httpx.Client(trust_env=False, timeout=httpx.Timeout(30.0))

    def _next(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def send(self, route: str, body: bytes, headers: Mapping[str, str] | None = None,
             timeout: httpx.Timeout | None = None,
             client: httpx.Client | None = None) -> tuple[str, bytes, Mapping[str, str]]:
        """POST to the engine; (upstream status, body, the gateway's headers), verified."""
        seq = str(self._next())
        sig = _sign(self._token, "request", self.grant, seq, route,
                    hashlib.sha256(body).hexdigest())
        h = {"x-stockade-grant": self.grant, "x-stockade-seq": seq, "x-stockade-sig": sig,
             **(headers or {})}
        resp = (client or self._plain).post(self.url + route, content=body, headers=h,
                                            timeout=timeout or httpx.Timeout(30.0))
        if resp.status_code != 200:
            raise httpx.RemoteProtocolError(f"the engine's gateway refused the call "
                                            f"({resp.status_code}: {resp.text[:200]})")
        status = resp.headers.get("x-stockade-status", "")
        want = _sign(self._token, "answer", self.grant, seq, status,
                     hashlib.sha256(resp.content).hexdigest())
        if not hmac.compare_digest(want, resp.headers.get("x-stockade-sig", "")):
            raise httpx.RemoteProtocolError("an answer not signed by the engine's gateway")
        return status, resp.content, resp.headers

    def echo(self, text: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            self.send("/echo", text.encode())

    def ask(self, path: str) -> bool:
        try:
            _, body, _ = self.send("/ask", path.encode(), timeout=httpx.Timeout(None))
        except httpx.HTTPError:
            return False
        return body == b"yes"

    @contextlib.contextmanager
    def http(self) -> Iterator[httpx.Client]:
        """An httpx client whose every request goes through the gateway."""
        with httpx.Client(transport=_Transport(self), trust_env=False) as client:
            yield client

    def close(self) -> None:
        self._plain.close()


class _Transport(httpx.BaseTransport):
    def __init__(self, gateway: GatewayClient) -> None:
        self._gw = gateway
        self._client = httpx.Client(trust_env=False)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        t = request.extensions.get("timeout") or {}
        read = t.get("read") or 600.0
        headers = {"x-stockade-url": str(request.url),
                   "x-stockade-timeout": str(read),
                   "x-stockade-headers": json.dumps(dict(request.headers))}
        # The gateway's own answer may take the call's whole time, plus a margin.
        timeout = httpx.Timeout(read + 10.0, connect=min(read, 10.0))
        try:
            status, data, gh = self._gw.send("/model", body, headers, timeout, self._client)
        except httpx.TimeoutException:
            raise httpx.ReadTimeout("no answer from the engine's gateway in time",
                                    request=request) from None
        error = gh.get("x-stockade-error")
        if error:
            if error.startswith(("ReadTimeout", "ConnectTimeout", "WriteTimeout", "PoolTimeout")):
                raise httpx.ReadTimeout(error, request=request)
            raise httpx.ConnectError(error, request=request)
        upstream = json.loads(gh.get("x-stockade-upstream") or "{}")
        return httpx.Response(int(status), headers=upstream, content=data, request=request)

    def close(self) -> None:
        self._client.close()


__all__ = ["PLACEHOLDER", "Gateway", "GatewayClient", "worker_env"]
