"""Several engines opening one new SQLite store at once (the WAL switch race)."""

from __future__ import annotations

import threading
from pathlib import Path

from stockade.store.sqlite import SQLiteStore


def test_concurrent_first_open_of_a_store(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    for trial in range(20):
        path = tmp_path / f"s{trial}.db"

        def open_it(p: Path = path) -> None:
            try:
                SQLiteStore(p).close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_it) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
