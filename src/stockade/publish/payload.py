"""Provenance checks on a rendered payload, and its content hash.

The runner turns every artifact inside a payload into
``{"$artifact": {run_id, step, item, attempt, name, sha256, size}, "text": ...}``
(``stockade.refs``), and refuses plain data that holds that key. Here every
such object is checked for the engine's exact shape and for a ``text`` that
is the content its sha256 names (``form_problem``); ``core.check_provenance``
then checks it against the run's records. A payload may only carry this run's
artifacts, and its content hash ignores which run and attempt made an
artifact so that two runs publishing the same bytes hash the same (that is
how a flat series is noticed).

Pure: no I/O. Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from stockade.refs import ARTIFACT

#: The fields of an artifact reference and their JSON types, exactly.
REF_FIELDS: dict[str, type] = {
    "run_id": str, "step": str, "item": int, "attempt": int, "name": str, "sha256": str,
    "size": int,
}


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


def artifact_objects(payload: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every mapping in ``payload`` that holds the ``$artifact`` key, with where it is."""
    if isinstance(payload, dict):
        if ARTIFACT in payload:
            yield path, payload
        for key, value in payload.items():
            yield from artifact_objects(value, f"{path}[{json.dumps(key, ensure_ascii=False)}]")
    elif isinstance(payload, list):
        for i, value in enumerate(payload):
            yield from artifact_objects(value, f"{path}[{i}]")


def form_problem(obj: dict[str, Any]) -> str | None:
    """Why ``obj`` is not an artifact reference as the engine writes one, or None.

    Exactly ``$artifact`` (the fields of ``REF_FIELDS``, nothing else) and
    optionally ``text``, whose UTF-8 bytes must be the content the sha256 and
    size name: a reference cannot carry other text than the artifact's.
    """
    extra = sorted(set(obj) - {ARTIFACT, "text"})
    if extra:
        return f"it has keys an artifact reference does not have ({', '.join(map(repr, extra))})"
    meta = obj[ARTIFACT]
    if not isinstance(meta, dict):
        return f"its {ARTIFACT!r} is not an object"
    if set(meta) != set(REF_FIELDS):
        return f"its {ARTIFACT!r} does not have exactly the fields {', '.join(REF_FIELDS)}"
    for name, kind in REF_FIELDS.items():
        value = meta[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"its {name!r} is not {'a string' if kind is str else 'an integer'}"
    if "text" in obj:
        text = obj["text"]
        if not isinstance(text, str):
            return "its text is not a string"
        data = text.encode("utf-8", errors="surrogatepass")
        digest = hashlib.sha256(data).hexdigest()
        if digest != meta["sha256"] or len(data) != meta["size"]:
            return (f"its text is not the artifact's content (the text hashes to {digest[:12]},"
                    f" the reference names {str(meta['sha256'])[:12]})")
    return None


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
