"""Agent benchmark (issue 4, "Measure").

In the same run, against the same scripted model server on loopback
(``tests/modelserver.py``, real HTTP, real OpenAI wire format):

1. broker overhead per model call: the median latency of a model call made by
   the jail side through the broker's socketpair (translation, forwarding with
   httpx, transcript write) minus the median of the same call made directly
   with httpx to the server; target <= 5 ms;
2. agent-step start: from entering ``start_agent`` to the first model request
   arriving at the server (broker up, jail started, interpreter and loop
   ready), per sandbox backend that works here;
3. the jail's boot time (read the image from the socket, load its modules)
   next to ``import httpx``, which the jail deliberately avoids.

Usage: ``python bench/bench_agent.py [--calls 300] [--starts 15]``
"""

from __future__ import annotations

import argparse
import marshal
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from modelserver import Call, ModelServer, Seen, Turn, say  # noqa: E402
from modelserver import calls as calls_turn  # noqa: E402

from stockade.agent import AgentJob, ship, start_agent  # noqa: E402
from stockade.agent.jail import BrokerClient  # noqa: E402
from stockade.agent.session import interpreter  # noqa: E402
from stockade.sandbox.base import Backend  # noqa: E402
from stockade.sandbox.none import NoneBackend  # noqa: E402
from stockade.sandbox.policy import Policy  # noqa: E402
from stockade.spec.model import Agent  # noqa: E402

#: One tool result, as a small CSV read returns it.
RESULT = "region,month,revenue\n" * 100


def ms(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=20)
    return f"median {statistics.median(xs) * 1000:.2f} ms, p95 {q[-1] * 1000:.2f} ms"


def job_for(tmp: Path, env: dict[str, str], max_turns: int) -> AgentJob:
    work, meta = tmp / "work", tmp / "meta"
    (work / "out").mkdir(parents=True, exist_ok=True)
    meta.mkdir(parents=True, exist_ok=True)
    (work / "sales.csv").write_text("region,month,revenue\nnorth,1,2\n")
    return AgentJob(
        run_id="bench", step="s", item=0, attempt=1,
        config=Agent(model="openai/bench", prompt="Summarise sales.csv", tools=["read_file", "list_dir", "create_file"], max_turns=max_turns),
        work_dir=work, meta_dir=meta, timeout=None, host_env=env,
        echo=lambda s: None, interactive=False,
    )


def broker_overhead(calls: int) -> None:
    """The same conversation twice: through the broker, then its recorded bodies
    posted directly with httpx (so both sides send exactly the same bytes)."""
    turn = calls_turn(Call("read_file", {"path": "sales.csv", "offset": None, "limit": None}))
    with ModelServer(lambda seen, n: turn) as srv, tempfile.TemporaryDirectory(prefix="sb-") as d:
        brokered: list[float] = []
        with start_agent(job_for(Path(d), srv.env("openai"), max_turns=calls + 10)) as s:
            # The jail's end, as the jail gets it; first the boot image.
            sock = socket.socket(fileno=os.dup(s.launch.pass_fds[0]))
            n = int.from_bytes(sock.recv(8, socket.MSG_WAITALL), "big")
            marshal.loads(sock.recv(n, socket.MSG_WAITALL))
            jail_side = BrokerClient(sock)
            payload: dict[str, object] = {}
            for _ in range(calls):
                t0 = time.perf_counter()
                answer = jail_side.post("/model", payload)
                brokered.append(time.perf_counter() - t0)
                assert answer["ok"], answer
                payload = {"results": [{"id": c["id"], "name": c["name"], "content": RESULT, "is_error": False}
                                       for c in answer["tool_calls"]]}
        bodies = [seen.body for seen in srv.seen]
        headers = {"authorization": f"Bearer {srv.key}"}
        direct: list[float] = []
        with httpx.Client() as client:
            for body in bodies:
                t0 = time.perf_counter()
                r = client.post(srv.openai_base + "/chat/completions", json=body, headers=headers)
                r.json()
                direct.append(time.perf_counter() - t0)
    over = statistics.median(brokered) - statistics.median(direct)
    print(f"model call, direct httpx -> server:        {ms(direct)}")
    print(f"model call, jail -> broker -> server:      {ms(brokered)}")
    print(f"broker overhead per call (median diff):    {over * 1000:.2f} ms "
          f"(ratio {statistics.median(brokered) / statistics.median(direct):.2f}x; target <= 5 ms)")


def backends() -> list[Backend]:
    out: list[Backend] = [NoneBackend()]
    try:
        from stockade.sandbox.bwrap import BwrapBackend

        b = BwrapBackend()
        with tempfile.TemporaryDirectory() as d, open(os.devnull, "wb") as null:
            os.chmod(d, 0o755)
            pol = Policy(argv=("/bin/true",), work_dir=Path(d), scratch_dir=Path(d) / "s", env={"PATH": "/usr/bin:/bin"})
            # Backends take files or real descriptors, not subprocess.DEVNULL.
            if b.availability().available and b.start(pol, stdout=null, stderr=null).wait(30) == 0:
                out.append(b)
            else:
                print("bwrap: backend present but cannot start a jail here; skipped")
    except ImportError:
        print("bwrap: backend not available; skipped")
    return out


def agent_start(starts: int) -> None:
    for backend in backends():
        times: list[float] = []
        for _ in range(starts):
            first = threading.Event()

            def script(seen: Seen, n: int, first: threading.Event = first) -> Turn:
                first.set()
                return say("done")

            with ModelServer(script) as srv, tempfile.TemporaryDirectory(prefix="sb-") as d:
                os.chmod(d, 0o755)  # a jail uid must reach its work/, as in a real runs folder
                job = job_for(Path(d), srv.env("openai"), max_turns=3)
                t0 = time.perf_counter()
                with start_agent(job) as s:
                    env = {"PATH": "/usr/bin:/bin"} | dict(s.launch.env)
                    pol = Policy(argv=s.launch.argv, work_dir=job.work_dir, scratch_dir=Path(d) / "scratch",
                                 env=env, mounts=s.launch.mounts, pass_fds=s.launch.pass_fds)
                    with open(Path(d) / "jail.log", "wb") as log:
                        running = backend.start(pol, stdout=log, stderr=log)
                    got = first.wait(30)
                    times.append(time.perf_counter() - t0)
                    code = running.wait(30)
                    outcome = s.finish(code)
                    if not (got and outcome.ok):
                        log_text = (Path(d) / "jail.log").read_text()[-500:]
                        print(f"agent-step start ({backend.name}): FAILED: {outcome.message}\n{log_text}")
                        break
        else:
            print(f"agent-step start ({backend.name:5}): enter -> first model request: {ms(times)}")


def imports() -> None:
    """The jail's interpreter and its boot, as launched (image over a socketpair)."""
    exe, _ = interpreter()
    code = ship.reads_our_bytecode(exe)
    frame = ship.image({"prompt": "p", "tools": [], "writes": [], "max_turns": 1}, code=code)
    # The real boot stage, but stop after importing the jail instead of serving.
    stop = "def main(s, d):\n    g = {}\n    exec(d['real'], g)\n    import sys\n"
    stop += "    sys.meta_path.insert(0, g['ShippedModules'](d['modules']))\n    import stockade.agent.jail\n    return 0\n"
    data = marshal.loads(frame[8:])
    blob = marshal.dumps({**data, "boot": stop, "real": data["boot"]}, *(() if code else (4,)))
    probe = [exe, "-I", "-S", "-B", "-c", ship.BOOT]

    def t(argv: list[str], frame: bytes | None) -> float:
        runs = []
        for _ in range(7):
            here, there = socket.socketpair()
            t0 = time.perf_counter()
            # The jail's end at fd 3, where the boot reads it.
            pid = os.posix_spawn(argv[0], argv, {}, file_actions=[(os.POSIX_SPAWN_DUP2, there.fileno(), 3)])
            if frame is not None:
                here.sendall(frame)
            os.waitpid(pid, 0)
            runs.append(time.perf_counter() - t0)
            here.close()
            there.close()
        return statistics.median(runs)

    base, base_site = t([exe, "-I", "-S", "-B", "-c", "pass"], None), t([sys.executable, "-I", "-c", "pass"], None)
    print(f"jail interpreter {exe} -I -S startup: {base * 1000:.1f} ms")
    print(f"  + boot: image over the socket, load the jail's modules ({'code objects' if code else 'source'}): "
          f"{(t(probe, len(blob).to_bytes(8, 'big') + blob) - base) * 1000:.1f} ms")
    print(f"  + import httpx (for comparison, unused): {(t([sys.executable, '-I', '-c', 'import httpx'], None) - base_site) * 1000:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--starts", type=int, default=15)
    a = ap.parse_args()
    broker_overhead(a.calls)
    agent_start(a.starts)
    imports()


if __name__ == "__main__":
    main()
