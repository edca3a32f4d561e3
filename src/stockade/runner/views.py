"""What a step exposes downstream, as the plain mappings templates read.

``steps.X.result``, ``steps.X.outputs['name']`` and ``steps.X.items`` are built
here from completion records. Must not import the sandbox, the CLI or agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.store.base import ItemRecord
from stockade.workspace.artifacts import Artifact


class ItemView(dict[str, Any]):
    """``steps.X.items[i]``: a plain mapping to templates, but known to the engine as an
    item, so a step fanning out over another step's items (or a ``keep:``'s kept
    items) takes the same keys."""

    @property
    def key(self) -> str:
        return str(self["key"])


@dataclass
class ItemResult:
    """One finished item as the engine keeps it in memory during a run."""

    index: int
    key: str
    status: str
    value: Any
    result: Any
    outputs: dict[str, Artifact] = field(default_factory=dict)

    def view(self) -> ItemView:
        return ItemView(index=self.index, key=self.key, value=self.value, result=self.result,
                        outputs=self.outputs)


def artifacts_of(record: ItemRecord, run_path: Path, consumer_run: str) -> dict[str, Artifact]:
    if not record.outputs:
        return {}
    # One Path built from a string, not five joins: this runs for every item.
    base = Path(f"{run_path}/{record.step}/{record.item}/work/out")
    return {
        a.name: Artifact(
            run_id=a.run_id, step=a.step, item=a.item, attempt=a.attempt, name=a.name,
            sha256=a.sha256, size=a.size, path=base / a.name, consumer_run=consumer_run,
        )
        for a in record.outputs
    }


def step_view(kind: str, fan_out: bool, items: Sequence[ItemResult]) -> dict[str, Any]:
    """The mapping a template sees as ``steps.<id>``."""
    ordered = sorted(items, key=lambda i: i.index)
    views = [i.view() for i in ordered]
    if kind == "keep":
        # A decision step hands on the kept elements themselves, so a kept
        # upstream item keeps its ``outputs`` and ``result``.
        kept: Any = [i.value for i in ordered if i.result is True]
        return {"result": kept, "items": kept, "outputs": {}, "decisions": views}
    if fan_out:
        return {"result": [i.result for i in ordered], "items": views, "outputs": {}}
    only = ordered[0] if ordered else ItemResult(0, "0", "skipped", None, None)
    return {"result": only.result, "items": views, "outputs": only.outputs}
