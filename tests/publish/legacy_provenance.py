"""The provenance check ``publish()`` made before forged references were refused.

Kept for positive controls only: it refused another run's id and a sha256
that contradicted a record it found, and passed everything else (a step that
does not exist, text that is not the artifact's content). Tests show the
forged objects they use get through this check, so the refusal they see is
the new check's doing.
"""

from __future__ import annotations

from typing import Any

from stockade.publish.payload import artifact_refs, foreign_artifacts
from stockade.store import Store


def legacy_check_provenance(payload: Any, run_id: str, store: Store) -> str | None:
    """What the old check objected to (``"foreign"``, ``"sha256"``), or None for accepted."""
    if foreign_artifacts(payload, run_id):
        return "foreign"
    for m in artifact_refs(payload):
        known = {(o.item, o.name): o.sha256 for i in store.items(run_id, str(m.get("step")))
                 for o in i.outputs}.get((m.get("item"), m.get("name")))
        if known is not None and known != m.get("sha256"):
            return "sha256"
    return None
