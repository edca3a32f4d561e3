"""The JSON Schema (2020-12) of the workflow format, generated from the models.

Editors (the YAML language server) use it for completion and checks. Pure.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

from typing import Any

from stockade.spec.model import STEP_KINDS, Workflow

SCHEMA_ID = "https://json-schema.org/draft/2020-12/schema"
_TEMPLATE = "A {{ }} expression over vars, run, steps (only those in needs) and item."

#: Editor hover text, per model and field.
DESCRIPTIONS: dict[str, dict[str, str]] = {
    "Workflow": {
        "name": "Workflow name: lowercase letters, digits, '_' and '-'.",
        "vars": "Defaults for vars.*; `--var K=V` may override declared vars only.",
        "sandbox": "Sandbox requirements for every step.",
        "secrets": "Host environment variables a step may receive (only if it lists them).",
        "steps": "The steps, run in dependency order.",
        "reuse": "true: reuse unchanged items from earlier runs by default (--no-reuse "
                 "turns it off for one run).",
        "notify": "Webhooks told about the run when it ends: url, on, secret.",
        "mounts": "Host paths (absolute, or relative to this file) shown read-only at the same "
                  "path in every run: step's jail, for toolchains (a venv, a conda env, "
                  "/opt/tool); each one's bin/ goes first on PATH.",
    },
    "Step": {
        "id": "Unique step id: lowercase letters, digits, '_' and '-'.",
        "needs": "Steps that must finish first; only their results are visible as steps.X.",
        "for_each": "Fan out: one item per element. " + _TEMPLATE + " Or a literal YAML list.",
        "key": "Names each item (with for_each): a template over item, e.g. {{ item.sample }}. "
               "Default: a string or number element is its own key when all are unique and "
               "path-safe, else the index.",
        "outputs": "Names or globs under out/ an item must produce; exiting 0 without them "
                   "fails the item.",
        "retry_delay": "Seconds before the first retry (default 1), doubled each attempt with "
                       "+/-20% jitter, at most 60.",
        "reuse": "Whether items may be taken from earlier runs when the run reuses "
                 "(default: true for run:, false for agent:, never for publish:/keep:).",
        "on_item_failure": "fail (default: the step fails, its dependents are skipped) or "
                           "continue (dependents run on the items that succeeded; the run "
                           "still exits 1).",
        "inputs": "Files placed in the step's work/ folder: name -> template or value. "
                  "The only way anything enters a step's world.",
        "env": "Extra environment variables by value (templates allowed).",
        "secrets": "Names from the workflow's secrets: to pass into this step's environment.",
        "timeout": "Seconds before the whole process group is stopped (at most a year).",
        "retries": "Extra attempts after a failure, each in a fresh work/ folder.",
        "network": "'none' (default), 'open' (recorded as reduced isolation) or host[:port] patterns.",
        "resources": "Limits: memory, cpu_seconds, processes, file_size.",
        "isolate": "false is an explicit, recorded opt-out of the sandbox.",
        "mounts": "Host paths (absolute, or relative to this file) shown read-only at the same "
                  "path in the jail, for toolchains; each one's bin/ goes first on PATH (before "
                  "the workflow's mounts). A fingerprint of each enters the reuse key.",
        "image": "A root filesystem instead of the host's /usr: a folder, an OCI layout folder "
                 "or a docker save tarball (unpacked once under the root). bwrap only.",
        "run": "A shell command run in work/; values rendered into it are shell-quoted.",
        "agent": "An LLM tool loop inside the jail.",
        "keep": "A decision over for_each items: one {{ }} expression giving true or false, "
                "over vars, run, steps (only those in needs) and item.",
        "publish": "A fenced write of a payload to a sink.",
    },
    "Publish": {
        "to": "Sink URL: sqlite:///file.db?table=t, postgresql://...?table=t, file:///dir, http(s)://...",
        "key": "The row/file key. " + _TEMPLATE,
        "payload": "The value to publish. " + _TEMPLATE,
        "lease": "Lease name, a template over vars and run (default: workflow name + step "
                 "id); backfills of different dates use different leases.",
        "lease_ttl": "Lease time to live, seconds (at most a day).",
        "max_age": "Seconds from the run's start during which it may publish (default a "
                   "day, at most a year).",
    },
    "Agent": {
        "prompt": "The operator's request; write targets must be named here.",
        "tools": "Tools the agent may call.",
        "writes": "Glob patterns write tools may write to (default out/**).",
        "max_turns": "Most model turns before the item fails.",
        "approve": "auto, or ask: echo each write target and wait for y/N.",
        "model": "provider/model: openai/ (chat completions, any compatible server), "
                 "openai-responses/ (the Responses API), azure/ (a classic deployment: the name "
                 "after azure/ is the deployment), anthropic/ (messages).",
        "request_timeout": "Seconds for one model call (default 600; always finite). Rate "
                           "limits and overloads are retried inside the call.",
        "params": "Passed to the provider: max_tokens, temperature, reasoning_effort, "
                  "tool_choice, thinking (anthropic/).",
        "endpoint": "Another server or key for this step: base_url, api_key_env (the host "
                    "variable holding the key), api_version (azure/).",
        "budget": "tokens: input + output tokens the item may spend; the broker stops the "
                  "item past it.",
    },
    "AgentParams": {
        "max_tokens": "Output limit of one reply (Anthropic's default here: 8192).",
        "temperature": "Sampling temperature (openai/, azure/, openai-responses/; not sent to "
                       "o-series and GPT-5 reasoning models; the Anthropic API has none).",
        "reasoning_effort": "Reasoning effort (OpenAI reasoning_effort, Responses reasoning.effort, "
                            "Anthropic output_config.effort).",
        "tool_choice": "auto, required or none.",
        "thinking": "Anthropic extended thinking: {type: enabled, budget_tokens: N}, "
                    "{type: adaptive} or {type: disabled}.",
    },
    "Endpoint": {
        "base_url": "The server's base URL (OpenAI-compatible servers end in /v1). Receives "
                    "only the key named by api_key_env, never the provider's default key.",
        "api_key_env": "The name of the host environment variable holding the key.",
        "api_version": "Azure OpenAI api-version (default $OPENAI_API_VERSION or 2024-10-21).",
    },
    "Budget": {
        "tokens": "Input + output tokens the item's model calls may spend.",
    },
}


def json_schema() -> dict[str, Any]:
    """JSON Schema of a workflow file, with the one-step-kind rule spelled out."""
    schema = Workflow.model_json_schema(mode="validation")
    defs = schema.get("$defs", {})
    for model, fields in DESCRIPTIONS.items():
        target = schema if model == "Workflow" else defs.get(model, {})
        for name, text in fields.items():
            prop = target.get("properties", {}).get(name)
            if prop is not None:
                prop["description"] = text
    step = defs.get("Step")
    if step is not None:
        props = step["properties"]
        props["for_each"].update({"anyOf": [{"type": "string", "pattern": "\\{\\{"}, {"type": "array"}]})
        props["keep"].update({"type": "string", "pattern": "^\\s*\\{\\{[\\s\\S]*\\}\\}\\s*$"})
        # Unset is the kind's default; a written null is refused (``Step._reuse_given``).
        props["reuse"] = {k: v for k, v in props["reuse"].items() if k not in ("anyOf", "default")}
        props["reuse"]["type"] = "boolean"
        step["oneOf"] = [{"required": [kind]} for kind in STEP_KINDS]
        step["dependentRequired"] = {"keep": ["for_each"], "key": ["for_each"]}
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
