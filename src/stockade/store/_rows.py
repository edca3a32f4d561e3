"""Row <-> record conversions shared by the SQLite and PostgreSQL stores.

Both stores lay their tables out in the same column order, so one function per
record type serves both. Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stockade.store.base import ArtifactRecord, Effect, ItemRecord, RunRecord


def dump_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def load_json(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


def run_from_row(row: Sequence[Any]) -> RunRecord:
    return RunRecord(
        run_id=row[0], workflow=row[1], workflow_path=row[2], workflow_sha256=row[3],
        root=row[4], status=row[5], started_at=row[6], ended_at=row[7], sandbox=row[8],
        enforced=bool(row[9]),
    )


def item_from_row(r: Sequence[Any], outputs: Sequence[ArtifactRecord]) -> ItemRecord:
    return ItemRecord(
        run_id=r[0], step=r[1], item=r[2], status=r[3], attempt=r[4],
        result=load_json(r[5]), value=load_json(r[6]),
        message=r[7], started_at=r[8], ended_at=r[9], outputs=tuple(outputs),
        key=r[10] if len(r) > 10 and r[10] else str(r[2]),
        usage=_usage(r[11]) if len(r) > 11 else {},
    )


def _usage(text: str | None) -> dict[str, int]:
    value = load_json(text) if text else None
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


def effect_from_row(r: Sequence[Any]) -> Effect:
    return Effect(
        key=r[0], run_id=r[1], step=r[2], item=int(r[3]), attempt=int(r[4]), lease=r[5],
        sink=r[6], sink_key=r[7], payload_sha256=r[8], status=r[9],
        token=None if r[10] is None else int(r[10]), claimed_at=float(r[11]),
        finished_at=None if r[12] is None else float(r[12]), message=r[13],
    )
