"""Provenance checks on a rendered payload, and its content hash.

The runner turns every artifact inside a payload into
``{"$artifact": {run_id, step, item, attempt, name, sha256, size}, "text": ...}``.
A payload may only carry this run's artifacts, and its content hash ignores
which run and attempt made an artifact so that two runs publishing the same
bytes hash the same (that is how a flat series is noticed).

Pure: no I/O. Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

ARTIFACT = "$artifact"


def artifact_refs(payload: Any) -> Iterator[dict[str, Any]]:
    """Every artifact's provenance dict inside ``payload``, depth first."""
    if isinstance(payload, dict):
        meta = payload.get(ARTIFACT)
        if isinstance(meta, dict):
            yield meta
        for value in payload.values():
            yield from artifact_refs(value)
    elif isinstance(payload, list):
        for value in payload:
            yield from artifact_refs(value)


def describe(meta: dict[str, Any]) -> str:
    return f"{meta.get('step')}/{meta.get('item')} {meta.get('name')!s}"


def foreign_artifacts(payload: Any, run_id: str) -> list[dict[str, Any]]:
    """Artifacts in ``payload`` that another run (or no run) produced."""
    return [m for m in artifact_refs(payload) if m.get("run_id") != run_id]


def _content(payload: Any) -> Any:
    if isinstance(payload, dict):
        meta = payload.get(ARTIFACT)
        if isinstance(meta, dict):
            return {ARTIFACT: meta.get("sha256")}
        return {k: _content(v) for k, v in payload.items()}
    if isinstance(payload, list):
        return [_content(v) for v in payload]
    return payload


def content_sha256(payload: Any) -> str:
    """sha256 of the payload's canonical JSON, artifacts reduced to their content hash."""
    text = json.dumps(_content(payload), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
