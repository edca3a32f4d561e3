"""The directory sink: atomic files, the fence in the store, sweeping, fsync failures."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stockade.publish import PublishRequest, publish
from stockade.publish.directory import DirectorySink, file_name
from stockade.publish.sink import Write
from stockade.store import SQLiteStore


def w(run: str = "A", token: int = 1, key: str = "2026-09-14", item: int = 0) -> Write:
    return Write(f"{run}/pub/{item}", key, {"from": run}, run, token, "L")


def read(d: Path, key: str = "2026-09-14") -> dict[str, object]:
    data = json.loads((d / file_name(key)).read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("key", "name"),
    [("2026-09-14", "2026-09-14.json"), ("a/b", "a%2Fb.json"), ("../x", "%2E.%2Fx.json"),
     (".hidden", "%2Ehidden.json"), ("ü", "%C3%BC.json")],
)
def test_file_names_stay_inside(key: str, name: str) -> None:
    assert file_name(key) == name


def test_write_fence_and_replay(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    sink = DirectorySink(tmp_path / "out", store)
    assert sink.write(w("A", 1)).status == "applied"
    assert read(tmp_path / "out") | {"published_at": 0} == {
        "key": "2026-09-14", "payload": {"from": "A"}, "run_id": "A", "fencing_token": 1,
        "lease": "L", "idempotency_key": "A/pub/0", "published_at": 0}
    assert sink.write(w("A", 1)).status == "already"
    assert sink.write(w("B", 2, key="other")).status == "applied"
    # The gap: stale A (token 1) on a key B has not written; the store's mark refuses it.
    late = sink.write(w("A", 1, key="new", item=1))
    assert (late.status, late.winner_token, late.winner_run) == ("fenced", 2, "B")
    assert not (tmp_path / "out" / file_name("new")).exists()
    fence = store.get_fence(sink.scope("L"))
    assert fence is not None and fence.high_water == 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        ".stockade.lock", "2026-09-14.json", "other.json"]


def test_a_key_near_the_name_limit_is_written_and_one_past_it_is_named(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    sink = DirectorySink(tmp_path / "out", store)
    # 250 + ".json": within 255. The temporary file, once named after the
    # target, made this one fail too.
    assert sink.write(w(key="L" * 250)).status == "applied"
    assert read(tmp_path / "out", "L" * 250)["key"] == "L" * 250
    long = sink.write(w(key="L" * 300, item=1))
    assert long.status == "failed"
    assert long.message == (
        f"directory sink {tmp_path / 'out'}: the key makes a file name of 305 bytes, more "
        "than the filesystem takes (usually 255); use a shorter key")


def test_a_file_where_the_folder_goes_is_named(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    sink = DirectorySink(tmp_path / "plain" / "sub", SQLiteStore(tmp_path / "s.db"))
    got = sink.write(w())
    assert got.status == "failed"
    assert got.message == (f"directory sink {tmp_path / 'plain' / 'sub'}: "
                           f"{tmp_path / 'plain'} is a file where a folder is needed")


def test_leftover_temp_files_are_swept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / f".{file_name('k')}.tmp-deadbeef").write_text("half a fi")
    (out / ".notes").write_text("not ours")
    sink = DirectorySink(out, SQLiteStore(tmp_path / "s.db"))
    assert sink.write(w(key="k")).status == "applied"
    assert sorted(p.name for p in out.iterdir()) == [".notes", ".stockade.lock", "k.json"]


def test_killed_writer_leaves_old_file_or_new_never_half(tmp_path: Path) -> None:
    """A writer killed with SIGKILL right after its temp file is fsynced: the target
    still holds the previous version, and the next writer sweeps the leftover."""
    out = tmp_path / "out"
    store_path = tmp_path / "s.db"
    sink = DirectorySink(out, SQLiteStore(store_path))
    assert sink.write(w("A", 1)).status == "applied"
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from stockade.publish.directory import DirectorySink
        from stockade.publish.sink import Write
        from stockade.store import SQLiteStore
        def die(fd):
            os.fsync(fd)
            os.kill(os.getpid(), signal.SIGKILL)
        DirectorySink(Path({str(out)!r}), SQLiteStore({str(store_path)!r}), fsync=die).write(
            Write("B/pub/0", "2026-09-14", {{"from": "B"}}, "B", 2, "L"))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9
    assert [p.name for p in out.glob(".*.tmp-*")] != []
    assert read(out)["run_id"] == "A"
    assert sink.write(w("C", 3, key="x")).status == "applied"
    assert list(out.glob(".*.tmp-*")) == []


@pytest.mark.parametrize("fail_on", [1, 2])  # the file's fsync, then the directory's
def test_failed_fsync_fails_the_write(tmp_path: Path, fail_on: int) -> None:
    calls = []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == fail_on:
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    out = tmp_path / "out"
    store = SQLiteStore(tmp_path / "s.db")
    r = DirectorySink(out, store, fsync=fsync).write(w())
    assert r.status == "failed" and "Input/output error" in r.message
    assert list(out.glob(".*.tmp-*")) == []
    if fail_on == 1:
        assert not (out / file_name("2026-09-14")).exists()
    # Through publish(): an OS error is a failed item, and the effect stays open for a retry.
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be")
    req = PublishRequest(run_id="Z", step="pub", item=0, attempt=1, to=f"file://{blocked}",
                         base_dir=tmp_path, key="k", payload=1, lease="L", lease_ttl=30,
                         max_age=86400, run_started_at=store.db_now(), allow_stale=False,
                         input_fingerprint="fp")
    outcome = publish(req, store)
    effect = store.get_effect("Z/pub/0")
    assert outcome.status == "failed" and effect is not None and effect.status == "claimed"


def test_publish_to_relative_directory(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    base = dict(run_id="A", step="pub", attempt=1, to="file://out/daily", base_dir=tmp_path,
                lease="L", lease_ttl=30, max_age=86400, run_started_at=store.db_now(),
                allow_stale=False, input_fingerprint="fp")
    for i in range(3):
        o = publish(PublishRequest(item=i, key=f"k{i}", payload={"i": i}, **base), store)  # type: ignore[arg-type]
        assert o.status == "succeeded"
    assert sorted(p.name for p in (tmp_path / "out" / "daily").glob("*.json")) == [
        "k0.json", "k1.json", "k2.json"]
    again = publish(PublishRequest(item=1, key="k1", payload={"i": 1}, **base), store)  # type: ignore[arg-type]
    assert again.already_applied


def test_concurrent_writers_never_move_a_file_back(tmp_path: Path) -> None:
    """Threads with their own store connection and shuffled tokens: under the lock
    a file only ever moves to a higher token, and the lower writers are told so."""
    import threading

    out, store_path = tmp_path / "out", tmp_path / "s.db"
    tokens = [4, 1, 6, 2, 5, 3]
    results: dict[int, list[str]] = {}
    # A timeout, so a thread that dies before the barrier fails the test
    # instead of hanging it.
    barrier = threading.Barrier(len(tokens), timeout=30)
    errors: list[BaseException] = []

    def go(t: int) -> None:
        try:
            sink = DirectorySink(out, SQLiteStore(store_path))
            barrier.wait()
            results[t] = [sink.write(w(f"r{t}", t, key=f"k{j}", item=j)).status for j in range(4)]
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=go, args=(t,)) for t in tokens]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert {read(out, f"k{j}")["fencing_token"] for j in range(4)} == {6}
    assert results[6] == ["applied"] * 4
    assert all(s in ("applied", "fenced") for r in results.values() for s in r)
    assert list(out.glob(".*.tmp-*")) == []
