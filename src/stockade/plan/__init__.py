"""Plan a checked workflow: DAG order, fan-out, the information-flow graph.

Pure: imports ``stockade.spec`` and ``stockade.expr`` only; no I/O.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from stockade.plan.graph import Flow, Plan, build_plan, expand
from stockade.plan.show import format_plan, plan_json

__all__ = ["Flow", "Plan", "build_plan", "expand", "format_plan", "plan_json"]
