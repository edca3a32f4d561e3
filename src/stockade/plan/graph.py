"""The DAG of a checked workflow, its order, and the information-flow graph.

Pure: built from a ``Spec`` alone; items are not expanded here (that happens
at run time through ``expand``), so planning is linear in the file's size.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stockade.errors import UserError
from stockade.expr import Readable
from stockade.spec import Spec
from stockade.spec.checks import templated_strings


@dataclass(frozen=True)
class Flow:
    """One value path flowing into one slot of one step."""

    source: str
    step: str
    slot: str


@dataclass(frozen=True)
class Plan:
    order: tuple[str, ...]
    needs: Mapping[str, tuple[str, ...]]
    dependents: Mapping[str, tuple[str, ...]]
    flows: tuple[Flow, ...]

    def downstream(self, step: str) -> frozenset[str]:
        """Every step that depends on ``step``, directly or not."""
        seen: set[str] = set()
        todo = list(self.dependents.get(step, ()))
        while todo:
            s = todo.pop()
            if s not in seen:
                seen.add(s)
                todo.extend(self.dependents.get(s, ()))
        return frozenset(seen)

    def upstream(self, step: str) -> frozenset[str]:
        """Every step ``step`` depends on, directly or not."""
        seen: set[str] = set()
        todo = list(self.needs.get(step, ()))
        while todo:
            s = todo.pop()
            if s not in seen:
                seen.add(s)
                todo.extend(self.needs.get(s, ()))
        return frozenset(seen)

    def flows_into(self, step: str) -> tuple[Flow, ...]:
        return tuple(f for f in self.flows if f.step == step)


def build_plan(spec: Spec) -> Plan:
    """Order (topological, stable by file order), needs, dependents and flows."""
    steps = spec.workflow.steps
    index = {s.id: i for i, s in enumerate(steps)}
    needs = {s.id: tuple(dict.fromkeys(s.needs)) for s in steps}
    dependents: dict[str, list[str]] = {s.id: [] for s in steps}
    for s in steps:
        for n in needs[s.id]:
            dependents[n].append(s.id)
    missing = [n for s in steps for n in needs[s.id] if n not in index]
    if missing:
        raise ValueError(f"unknown steps in needs: {', '.join(missing)}")
    waiting = {s.id: len(needs[s.id]) for s in steps}
    ready = [(index[s.id], s.id) for s in steps if waiting[s.id] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, sid = heapq.heappop(ready)
        order.append(sid)
        for d in dependents[sid]:
            waiting[d] -= 1
            if waiting[d] == 0:
                heapq.heappush(ready, (index[d], d))
    if len(order) != len(steps):
        stuck = [s.id for s in steps if s.id not in set(order)]
        raise ValueError(f"needs form a cycle among: {', '.join(stuck)}")
    return Plan(
        order=tuple(order),
        needs=needs,
        dependents={k: tuple(v) for k, v in dependents.items()},
        flows=tuple(_flows(spec)),
    )


def _flows(spec: Spec) -> list[Flow]:
    flows: list[Flow] = []
    for i, step in enumerate(spec.workflow.steps):
        pairs: list[tuple[str, str]] = []
        for path, _text, slot in templated_strings(spec.raw("steps", i), ("steps", i)):
            t = spec.template(*path)
            # A literal for_each list is one flow (added below), not one per element.
            if not t.is_template and not slot.startswith("for_each["):
                pairs.append(("literal", slot))
            pairs.extend((ref, slot) for ref in t.refs)
        if isinstance(step.for_each, list):
            pairs.append(("literal", "for_each"))
        pairs.extend((f"secret:{name}", f"env.{name}") for name in step.secrets)
        flows.extend(Flow(source, step.id, slot) for source, slot in dict.fromkeys(pairs))
    return flows


def expand(value: Any) -> list[Any]:
    """A rendered ``for_each`` value -> its items; anything but a list is a ``UserError``."""
    if isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, str):
        hint = "; to make one item per line use `| lines`, for a JSON array use `| from_json`"
        raise UserError(f"for_each must give a list, got a string{hint}")
    if isinstance(value, Mapping):
        raise UserError(
            f"for_each must give a list, got a mapping with {len(value)} keys; "
            "use `| items`, `| keys` or `| values` to choose what to fan out over"
        )
    if isinstance(value, Readable):
        raise UserError(
            f"for_each must give a list, got a file ({type(value).__name__}); "
            "read it with `| from_json` or `| lines`"
        )
    if value is None:
        raise UserError("for_each must give a list, got null")
    if isinstance(value, bool):
        raise UserError(f"for_each must give a list, got a boolean ({str(value).lower()})")
    if isinstance(value, (int, float)):
        raise UserError(f"for_each must give a list, got a number ({value!r})")
    raise UserError(f"for_each must give a list, got {type(value).__name__}")
