"""The JSON Schema (2020-12) of the workflow format, generated from the models.

Editors (the YAML language server) use it for completion and checks. Pure.
"""

from __future__ import annotations

from typing import Any

from stockade.spec.model import STEP_KINDS, Workflow

SCHEMA_ID = "https://json-schema.org/draft/2020-12/schema"


def json_schema() -> dict[str, Any]:
    """JSON Schema of a workflow file, with the one-step-kind rule spelled out."""
    schema = Workflow.model_json_schema(mode="validation")
    step = schema.get("$defs", {}).get("Step")
    if step is not None:
        step["oneOf"] = [{"required": [kind]} for kind in STEP_KINDS]
        step["dependentRequired"] = {"keep": ["for_each"]}
    return {
        "$schema": SCHEMA_ID,
        "$id": "https://stockade.dev/schema/workflow.json",
        "title": "stockade workflow",
        "description": (
            "A stockade workflow: steps of shell commands, agents, keep: decisions and "
            "publish: writes, with templates in {{ }} over vars, run, steps and item."
        ),
        **{k: v for k, v in schema.items() if k not in ("title", "description")},
    }
