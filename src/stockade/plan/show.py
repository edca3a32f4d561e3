"""Text and JSON views of a plan for ``stockade plan``.

Pure. Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

from typing import Any

from stockade.plan.graph import Flow, Plan
from stockade.spec import Spec
from stockade.spec.model import Step


def _fan_out(step: Step) -> str | None:
    if step.for_each is None:
        return None
    if isinstance(step.for_each, list):
        return f"a literal list of {len(step.for_each)}"
    return str(step.for_each).strip().removeprefix("{{").removesuffix("}}").strip()


def _unseen(plan: Plan, position: int) -> list[str]:
    """Earlier steps (in run order) whose results the step at ``position`` does not receive."""
    direct = set(plan.needs[plan.order[position]])
    return [s for s in plan.order[:position] if s not in direct]


def _unseen_text(plan: Plan, position: int, limit: int = 12) -> str:
    """Like ``_unseen`` but only builds what is printed (linear in the step count overall)."""
    direct = set(plan.needs[plan.order[position]])
    total = position - len(direct)  # every need runs earlier
    shown: list[str] = []
    for s in plan.order[:position]:
        if len(shown) == limit:
            break
        if s not in direct:
            shown.append(s)
    more = f" and {total - len(shown)} more" if total > len(shown) else ""
    return ", ".join(shown) + more


def _short(names: list[str], limit: int = 12) -> str:
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f" and {len(names) - limit} more"


def _by_step(plan: Plan) -> dict[str, list[Flow]]:
    out: dict[str, list[Flow]] = {sid: [] for sid in plan.order}
    for f in plan.flows:
        out[f.step].append(f)
    return out


def _isolation(step: Step) -> list[str]:
    notes: list[str] = []
    if step.agent is not None:
        a = step.agent
        notes.append(f"agent: {a.model}, tools {', '.join(a.tools)}, writes {', '.join(a.writes)}")
    if step.network != "none":
        notes.append("network: " + (step.network if isinstance(step.network, str) else ", ".join(step.network)))
    if not step.isolate:
        notes.append("isolate: false (reduced isolation)")
    return notes


def format_plan(spec: Spec, plan: Plan) -> str:
    """Each step in order: kind, needs, fan-out, what flows into which slot, what it cannot see."""
    wf = spec.workflow
    steps_n = f"{len(plan.order)} step" + ("" if len(plan.order) == 1 else "s")
    out = [f"workflow {wf.name}: {steps_n} ({spec.filename}, sha256 {spec.sha256[:12]})"]
    if wf.vars:
        out.append("vars: " + ", ".join(f"{k}={v!r}" for k, v in wf.vars.items()))
    steps = {s.id: s for s in wf.steps}
    flows_of = _by_step(plan)
    for n, sid in enumerate(plan.order, 1):
        step = steps[sid]
        out.append("")
        out.append(f"{n}. {sid} [{step.kind}]")
        out.append("   needs: " + (", ".join(plan.needs[sid]) or "nothing"))
        fan = _fan_out(step)
        out.append(f"   items: one per element of {fan}" if fan else "   items: one (no for_each)")
        flows = flows_of[sid]
        if flows:
            width = max(len(f.slot) for f in flows)
            out.append("   flows in:")
            for f in flows:
                out.append(f"     {f.slot.ljust(width)} <- {f.source}")
        else:
            out.append("   flows in: nothing")
        for note in _isolation(step):
            out.append(f"   {note}")
        unseen = _unseen_text(plan, n - 1)
        if unseen:
            out.append("   sees nothing of: " + unseen)
        deps = plan.dependents[sid]
        if deps:
            out.append("   feeds: " + _short(list(deps)))
    return "\n".join(out) + "\n"


def _flow_json(f: Flow) -> dict[str, str]:
    return {"source": f.source, "step": f.step, "slot": f.slot}


def plan_json(spec: Spec, plan: Plan) -> dict[str, Any]:
    wf = spec.workflow
    by_id = {s.id: s for s in wf.steps}
    flows_of = _by_step(plan)
    steps = []
    for n, sid in enumerate(plan.order):
        step = by_id[sid]
        steps.append({
            "id": sid,
            "kind": step.kind,
            "needs": list(plan.needs[sid]),
            "dependents": list(plan.dependents[sid]),
            "for_each": _fan_out(step),
            "flows": [{"source": f.source, "slot": f.slot} for f in flows_of[sid]],
            "secrets": list(step.secrets),
            "network": step.network if isinstance(step.network, str) else list(step.network),
            "isolate": step.isolate,
            "sees_nothing_of": _unseen(plan, n),
        })
    return {
        "workflow": wf.name,
        "file": spec.filename,
        "sha256": spec.sha256,
        "vars": dict(wf.vars),
        "files": list(spec.files),
        "trees": list(spec.trees),
        "order": list(plan.order),
        "steps": steps,
        "flows": [_flow_json(f) for f in plan.flows],
    }
