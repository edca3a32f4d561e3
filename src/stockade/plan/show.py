"""Text and JSON views of a plan for ``stockade plan``. Pure."""

from __future__ import annotations

from typing import Any

from stockade.plan.graph import Flow, Plan
from stockade.spec import Spec


def _fan_out(spec: Spec, step_id: str) -> str | None:
    step = spec.workflow.step(step_id)
    if step.for_each is None:
        return None
    if isinstance(step.for_each, list):
        return f"a literal list of {len(step.for_each)}"
    return str(step.for_each).strip().removeprefix("{{").removesuffix("}}").strip()


def _unseen(spec: Spec, plan: Plan, step_id: str) -> list[str]:
    """Earlier steps whose results this step does not receive."""
    earlier = plan.order[: plan.order.index(step_id)]
    direct = set(plan.needs[step_id])
    return [s for s in earlier if s not in direct]


def _isolation(spec: Spec, step_id: str) -> list[str]:
    step = spec.workflow.step(step_id)
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
    out = [f"workflow {wf.name}: {len(plan.order)} steps ({spec.filename}, sha256 {spec.sha256[:12]})"]
    if wf.vars:
        out.append("vars: " + ", ".join(f"{k}={v!r}" for k, v in wf.vars.items()))
    for n, sid in enumerate(plan.order, 1):
        step = wf.step(sid)
        out.append("")
        out.append(f"{n}. {sid} [{step.kind}]")
        out.append("   needs: " + (", ".join(plan.needs[sid]) or "nothing"))
        fan = _fan_out(spec, sid)
        out.append(f"   items: one per element of {fan}" if fan else "   items: one (no for_each)")
        flows = plan.flows_into(sid)
        if flows:
            width = max(len(f.slot) for f in flows)
            out.append("   flows in:")
            for f in flows:
                out.append(f"     {f.slot.ljust(width)} <- {f.source}")
        else:
            out.append("   flows in: nothing")
        for note in _isolation(spec, sid):
            out.append(f"   {note}")
        unseen = _unseen(spec, plan, sid)
        if unseen:
            out.append("   sees nothing of: " + ", ".join(unseen))
        deps = plan.dependents[sid]
        if deps:
            out.append("   feeds: " + ", ".join(deps))
    return "\n".join(out) + "\n"


def _flow_json(f: Flow) -> dict[str, str]:
    return {"source": f.source, "step": f.step, "slot": f.slot}


def plan_json(spec: Spec, plan: Plan) -> dict[str, Any]:
    wf = spec.workflow
    steps = []
    for sid in plan.order:
        step = wf.step(sid)
        steps.append({
            "id": sid,
            "kind": step.kind,
            "needs": list(plan.needs[sid]),
            "dependents": list(plan.dependents[sid]),
            "for_each": _fan_out(spec, sid),
            "flows": [{"source": f.source, "slot": f.slot} for f in plan.flows_into(sid)],
            "secrets": list(step.secrets),
            "network": step.network if isinstance(step.network, str) else list(step.network),
            "isolate": step.isolate,
            "sees_nothing_of": _unseen(spec, plan, sid),
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
