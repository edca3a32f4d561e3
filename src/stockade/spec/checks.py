"""Semantic checks over the raw workflow data: ids, needs, cycles, templates.

Works on the plain data from ``yamlload`` (not the pydantic model) so every
problem is found even when some step failed type validation. Pure: no I/O.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

import itertools
import posixpath
import re
from collections.abc import Callable, Iterator
from typing import Any

from stockade.errors import Problem
from stockade.expr import ExprError, Template, compile_template
from stockade.spec.messages import DataPath, step_label
from stockade.spec.paths import bad_host_path, bad_relative, interface_mount
from stockade.spec.sinkurl import SinkUrlError, parse_sink_url

Pos = tuple[int, int]

#: Fields whose strings are templates, per step (inputs/payload recursively).
TEMPLATED = ("for_each", "key", "inputs", "env", "run", ("agent", "prompt"), "keep",
             ("publish", "to"), ("publish", "key"), ("publish", "payload"), ("publish", "lease"))
RESERVED_ENV_PREFIX = "STOCKADE_"
#: What ``steps.X`` offers a template (DESIGN.md, "What a step exposes downstream").
STEP_VIEW = ("result", "outputs", "items")


def _kind(step: dict[str, Any]) -> str | None:
    return next((k for k in ("run", "agent", "keep", "publish") if step.get(k) is not None), None)


def iter_strings(value: Any, path: DataPath) -> Iterator[tuple[DataPath, str]]:
    """Every string inside ``value`` (lists and mappings recursively) with its path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from iter_strings(v, (*path, i))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from iter_strings(v, (*path, k))


def templated_strings(step: dict[str, Any], base: DataPath) -> Iterator[tuple[DataPath, str, str]]:
    """(path, source, slot) for every templated string of a raw step."""
    for entry in TEMPLATED:
        keys = entry if isinstance(entry, tuple) else (entry,)
        cur: Any = step
        for k in keys:
            cur = cur.get(k) if isinstance(cur, dict) else None
        if cur is None:
            continue
        for path, text in iter_strings(cur, (*base, *keys)):
            yield path, text, _slot(path[len(base):])


def _slot(rel: DataPath) -> str:
    out = ""
    for el in rel:
        out += f"[{el}]" if isinstance(el, int) else (f".{el}" if out else el)
    return out


class Checker:
    def __init__(self, data: dict[str, Any], filename: str,
                 position: Callable[[DataPath], Pos], key_position: Callable[[DataPath], Pos]) -> None:
        self.data = data
        self.filename = filename
        self.position = position
        self.key_position = key_position
        self.problems: list[Problem] = []
        self.templates: dict[DataPath, Template] = {}
        steps = data.get("steps")
        self.steps: list[tuple[int, dict[str, Any]]] = (
            [(i, s) for i, s in enumerate(steps) if isinstance(s, dict)] if isinstance(steps, list) else []
        )
        self.ids: dict[str, int] = {}
        vars_ = data.get("vars")
        self.vars = set(vars_) if isinstance(vars_, dict) else set()
        secrets = data.get("secrets")
        self.secrets = {s for s in secrets if isinstance(s, str)} if isinstance(secrets, list) else set()

    def add(self, at: Pos, message: str) -> None:
        self.problems.append(Problem(self.filename, at[0], at[1], message))

    def run(self) -> list[Problem]:
        self._notify()
        self._mounts(("mounts",), self.data.get("mounts"), "the workflow")
        self._ids()
        self._needs()
        self._cycles()
        for i, step in self.steps:
            self._step(i, step)
        return self.problems

    def _notify(self) -> None:
        hooks = self.data.get("notify")
        if not isinstance(hooks, list):
            return
        for j, hook in enumerate(hooks):
            name = hook.get("secret") if isinstance(hook, dict) else None
            if isinstance(name, str) and name not in self.secrets:
                declared = ", ".join(sorted(self.secrets)) or "none"
                self.add(self.position(("notify", j, "secret")),
                         f"notify[{j}] sends secret {name!r}, which is not in the workflow's "
                         f"secrets: (declared: {declared})")

    def _ids(self) -> None:
        for i, step in self.steps:
            sid = step.get("id")
            if not isinstance(sid, str):
                continue
            if sid in self.ids:
                first = self.position(("steps", self.ids[sid], "id"))
                self.add(self.position(("steps", i, "id")),
                         f"duplicate step id {sid!r} (first used at line {first[0]})")
            else:
                self.ids[sid] = i

    def needs_of(self, step: dict[str, Any]) -> list[str]:
        needs = step.get("needs")
        return [n for n in needs if isinstance(n, str)] if isinstance(needs, list) else []

    def _needs(self) -> None:
        for i, step in self.steps:
            needs = step.get("needs")
            if not isinstance(needs, list):
                continue
            seen: set[str] = set()
            for j, n in enumerate(needs):
                if not isinstance(n, str):
                    continue
                at = self.position(("steps", i, "needs", j))
                if n in seen:
                    self.add(at, f"{step_label(self.data, i)} lists {n!r} twice in needs")
                elif n == step.get("id"):
                    self.add(at, f"{step_label(self.data, i)} cannot need itself")
                elif n not in self.ids:
                    known = ", ".join(self.ids) or "none"
                    self.add(at, f"{step_label(self.data, i)} needs unknown step {n!r} (steps: {known})")
                seen.add(n)

    def _cycles(self) -> None:
        graph = {
            sid: [n for n in self.needs_of(self.steps_by_index(idx)) if n in self.ids and n != sid]
            for sid, idx in self.ids.items()
        }
        state: dict[str, int] = {}  # 1 = on the path, 2 = done
        reported: set[frozenset[str]] = set()
        for root in graph:
            if root in state:
                continue
            # Iterative DFS: a long chain of needs must not exhaust the Python stack.
            path: list[str] = [root]
            iters = [iter(graph[root])]
            state[root] = 1
            while iters:
                nxt = next(iters[-1], None)
                if nxt is None:
                    state[path.pop()] = 2
                    iters.pop()
                elif state.get(nxt) == 1:
                    self._report_cycle([*path[path.index(nxt):], nxt], reported)
                elif nxt not in state:
                    state[nxt] = 1
                    path.append(nxt)
                    iters.append(iter(graph[nxt]))

    def _report_cycle(self, cycle: list[str], reported: set[frozenset[str]]) -> None:
        key = frozenset(cycle)
        if key in reported:
            return
        reported.add(key)
        a, b = cycle[0], cycle[1]
        ai = self.ids[a]
        j = self.needs_of(self.steps_by_index(ai)).index(b)
        links = [f"{x} needs {y}" for x, y in itertools.pairwise(cycle)]
        if len(links) > 8:
            links = [*links[:4], f"... ({len(links) - 6} more)", *links[-2:]]
        order = ", ".join(links)
        self.add(self.position(("steps", ai, "needs", j)), f"cycle in needs: {order}")

    def steps_by_index(self, i: int) -> dict[str, Any]:
        steps = self.data["steps"]
        step = steps[i]
        assert isinstance(step, dict)
        return step

    def _step(self, i: int, step: dict[str, Any]) -> None:
        base: DataPath = ("steps", i)
        label = step_label(self.data, i)
        needs = set(self.needs_of(step))
        has_for_each = step.get("for_each") is not None
        fe = step.get("for_each")
        if fe is not None and not isinstance(fe, (str, list)):
            self.add(self.position((*base, "for_each")),
                     f"for_each of {label} must be a {{{{ }}}} expression or a list")
        if isinstance(fe, list) and any("{{" in text for _p, text in iter_strings(fe, ())):
            self.add(self.position((*base, "for_each")),
                     f"for_each of {label}: a YAML list is taken literally; to compute items "
                     f"write one expression, as in for_each: \"{{{{ [vars.a, 'b'] }}}}\"")
        keep = step.get("keep")
        if keep is not None and not (isinstance(keep, str) and "{{" in keep):
            self.add(self.position((*base, "keep")),
                     f"keep of {label} must be a template such as \"{{{{ item.result.startswith('HOLDS') }}}}\"")
        for path, source, slot in templated_strings(step, base):
            try:
                t = compile_template(source)
            except ExprError as exc:
                self.add(self.position(path), f"{slot} of {label}: {exc.message}")
                continue
            self.templates[path] = t
            self._template(path, t, slot, label, step, needs, has_for_each)
        if isinstance(fe, str) and "{{" not in fe:
            self.add(self.position((*base, "for_each")),
                     f"for_each of {label} must be a {{{{ }}}} expression giving a list, or a YAML list")
        for key in ("run", "env"):
            for path, text in iter_strings(step.get(key), (*base, key)):
                if "\x00" in text:
                    self.add(self.position(path),
                             f"{_slot(path[len(base):])} of {label} holds a NUL character (\\0): "
                             f"no command line or environment variable can carry one")
        self._sink(base, step, label)
        self._mounts((*base, "mounts"), step.get("mounts"), label)
        image = step.get("image")
        if isinstance(image, str):
            why = bad_host_path(image)
            if why:
                self.add(self.position((*base, "image")), f"image {image!r} of {label} {why}")
        self._inputs(base, step, label)
        self._env(base, step, label)
        self._secrets(base, step, label)
        self._writes(base, step, label)
        self._outputs(base, step, label)
        self._agent(base, step, label)

    def _template(self, path: DataPath, t: Template, slot: str, label: str,
                  step: dict[str, Any], needs: set[str], has_for_each: bool) -> None:
        at = self.position(path)
        for name in sorted(t.steps_used):
            if name == step.get("id"):
                self.add(at, f"{slot} of {label} reads steps.{name}, its own results")
            elif name not in self.ids:
                self.add(at, f"{slot} of {label} reads steps.{name}, but there is no step {name!r}")
            elif name not in needs:
                self.add(at, f"{slot} of {label} reads steps.{name}, which is not in its needs "
                             f"(add {name!r} to needs: so it runs first and its results are passed in)")
        for ref in t.refs:
            parts = ref.split(".", 2)
            if parts[0] != "steps" or len(parts) < 3 or parts[1] not in self.ids:
                continue
            attr = re.split(r"[\[.]", parts[2], maxsplit=1)[0]
            source = self.steps_by_index(self.ids[parts[1]])
            kind = _kind(source)
            if attr not in STEP_VIEW and not (attr == "decisions" and kind == "keep"):
                self.add(at, f"{slot} of {label} reads {ref}; a step exposes only "
                             f"{', '.join(STEP_VIEW)}")
            elif attr == "outputs" and kind in ("keep", "publish"):
                self.add(at, f"{slot} of {label} reads {ref}, but a {kind}: step writes no files; "
                             f"use steps.{parts[1]}.result or .items")
            elif attr == "outputs" and source.get("for_each") is not None:
                # A fan-out step's own outputs are always empty (runner.views):
                # the read would fail only after every item had run.
                name = parts[2][len("outputs"):]
                self.add(at, f"{slot} of {label} reads {ref}, but {parts[1]} is a fan-out step "
                             f"(for_each): each of its items has outputs of its own; read them "
                             f"from steps.{parts[1]}.items, for example with for_each: "
                             f"\"{{{{ steps.{parts[1]}.items }}}}\" and item.outputs{name or '[...]'}")
        for var in sorted(t.vars_used - self.vars):
            declared = ", ".join(sorted(self.vars)) or "none"
            self.add(at, f"{slot} of {label} uses vars.{var}, which is not declared under vars: "
                         f"(declared: {declared})")
        if t.uses_item and slot.startswith("for_each"):
            self.add(at, f"for_each of {label} cannot use item; it is what makes the items")
        elif t.uses_item and not has_for_each:
            self.add(at, f"{slot} of {label} uses item, but the step has no for_each")
        for ref in t.refs:
            if ref.startswith("run.") and ref != "run.id":
                self.add(at, f"{slot} of {label} uses {ref}; run has only run.id")
        for fn, paths in (("file", t.files), ("tree", t.trees)):
            for p in paths:
                why = bad_relative(p)
                if why:
                    self.add(at, f"{fn}({p!r}) in {slot} of {label} {why}; "
                                 f"paths are relative to the workflow file and stay below it")
        if slot == "for_each" and t.is_template and not t.whole:
            # Text around the expression renders the whole value as a string.
            self.add(at, f"for_each of {label} must be a single {{{{ }}}} expression giving a "
                         "list, with nothing around it")
        if slot == "keep" and t.is_template and not t.whole:
            self.add(at, f"keep of {label} must be a single {{{{ }}}} expression giving true or false")
        if slot == "publish.lease" and (t.steps_used or t.uses_item or t.files or t.trees):
            self.add(at, f"publish.lease of {label} may use only vars and run.id: a lease names "
                         "a series of publishes (one per date, say), not an item")
        if slot == "key" and t.is_template and not t.uses_item:
            self.add(at, f"key of {label} does not use item, so every item would get the same "
                         "key; write something like \"{{ item.sample }}\"")

    def _mounts(self, at: DataPath, mounts: Any, label: str) -> None:
        if not isinstance(mounts, list):
            return
        seen: dict[str, int] = {}
        for j, path in enumerate(mounts):
            if not isinstance(path, str):
                continue
            pos = self.position((*at, j))
            why = bad_host_path(path)
            norm = posixpath.normpath(path) if not why else path
            if why:
                self.add(pos, f"mounts[{j}] {path!r} of {label} {why}")
            elif norm == "/":
                self.add(pos, f"mounts[{j}] of {label} is /, the whole host: mount the "
                              "toolchain's own folder (a venv, /opt/tool)")
            elif (inside := interface_mount(norm)) is not None:
                top, why = inside
                where = top if norm == top else f"in {top}"
                self.add(pos, f"mounts[{j}] {path!r} of {label} is {where}: {why}")
            elif norm in seen:
                self.add(pos, f"mounts[{j}] {path!r} of {label} is listed twice "
                              f"(first as mounts[{seen[norm]}])")
            seen.setdefault(norm, j)

    def _inputs(self, base: DataPath, step: dict[str, Any], label: str) -> None:
        inputs = step.get("inputs")
        if not isinstance(inputs, dict):
            return
        seen: dict[str, str] = {}
        for name in inputs:
            at = self.key_position((*base, "inputs", name))
            why = bad_relative(name)
            if why:
                self.add(at, f"input name {name!r} of {label} {why}; it names a file in the step's work/ folder")
                continue
            norm = posixpath.normpath(name)
            if norm == "out" or norm.startswith("out/"):
                self.add(at, f"input name {name!r} of {label} is under out/, where the step's outputs go")
            elif norm == ".":
                self.add(at, f"input name {name!r} of {label} names the work folder itself")
            elif norm in seen:
                self.add(at, f"inputs {seen[norm]!r} and {name!r} of {label} name the same file")
            seen.setdefault(norm, name)

    def _env(self, base: DataPath, step: dict[str, Any], label: str) -> None:
        env = step.get("env")
        if not isinstance(env, dict):
            return
        for name, value in env.items():
            if name.startswith(RESERVED_ENV_PREFIX):
                self.add(self.key_position((*base, "env", name)),
                         f"env {name} of {label}: STOCKADE_* variables are set by the engine")
            if isinstance(value, (list, dict)):
                self.add(self.position((*base, "env", name)),
                         f"env {name} of {label} must be a string, number or true/false (found a {'list' if isinstance(value, list) else 'mapping'})")

    def _secrets(self, base: DataPath, step: dict[str, Any], label: str) -> None:
        secrets = step.get("secrets")
        if not isinstance(secrets, list):
            return
        for j, name in enumerate(secrets):
            if isinstance(name, str) and name not in self.secrets:
                declared = ", ".join(sorted(self.secrets)) or "none"
                self.add(self.position((*base, "secrets", j)),
                         f"{label} asks for secret {name!r}, which is not in the workflow's secrets: (declared: {declared})")

    def _sink(self, base: DataPath, step: dict[str, Any], label: str) -> None:
        publish = step.get("publish")
        to = publish.get("to") if isinstance(publish, dict) else None
        if isinstance(to, str) and "{{" not in to:
            try:
                parse_sink_url(to)
            except SinkUrlError as exc:
                self.add(self.position((*base, "publish", "to")), f"publish.to of {label}: {exc}")

    def _outputs(self, base: DataPath, step: dict[str, Any], label: str) -> None:
        outputs = step.get("outputs")
        if not isinstance(outputs, list):
            return
        for j, pattern in enumerate(outputs):
            if not isinstance(pattern, str):
                continue
            at = self.position((*base, "outputs", j))
            why = bad_relative(pattern)
            if why:
                self.add(at, f"outputs pattern {pattern!r} of {label} {why}; "
                             "outputs are named relative to out/")
            elif pattern == "out" or pattern.startswith("out/"):
                self.add(at, f"outputs pattern {pattern!r} of {label}: outputs are named "
                             f"relative to out/ (write {pattern.removeprefix('out/')!r} for "
                             f"{'out/' + pattern.removeprefix('out/')})")

    def _agent(self, base: DataPath, step: dict[str, Any], label: str) -> None:
        """Agent settings that each provider's API would refuse, caught before a run."""
        agent = step.get("agent")
        if not isinstance(agent, dict):
            return
        model = agent.get("model")
        provider = model.split("/", 1)[0] if isinstance(model, str) else "openai"
        params = agent.get("params") if isinstance(agent.get("params"), dict) else {}
        assert isinstance(params, dict)
        at_params = (*base, "agent", "params")
        thinking = params.get("thinking")
        if thinking is not None and provider != "anthropic":
            self.add(self.key_position((*at_params, "thinking")),
                     f"agent.params.thinking of {label} applies to anthropic/ models; for "
                     f"{provider}/ use reasoning_effort")
        if provider == "anthropic" and params.get("temperature") is not None:
            self.add(self.key_position((*at_params, "temperature")),
                     f"agent.params.temperature of {label}: the Anthropic Messages API takes no "
                     "temperature; remove it (use thinking or reasoning_effort to steer the model)")
        effort = params.get("reasoning_effort")
        if provider == "anthropic" and effort in ("none", "minimal"):
            self.add(self.position((*at_params, "reasoning_effort")),
                     f"agent.params.reasoning_effort of {label}: anthropic/ models take low, "
                     f"medium, high, xhigh or max, not {effort!r}")
        enabled = isinstance(thinking, dict) and thinking.get("type", "enabled") == "enabled"
        if enabled and provider == "anthropic":
            assert isinstance(thinking, dict)
            budget = thinking.get("budget_tokens")
            limit = params.get("max_tokens")
            if isinstance(budget, int) and isinstance(limit, int) and limit <= budget:
                self.add(self.position((*at_params, "max_tokens")),
                         f"agent.params.max_tokens of {label} ({limit}) must be larger than "
                         f"thinking.budget_tokens ({budget}): thinking counts against it")
            if params.get("tool_choice") == "required":
                self.add(self.position((*at_params, "tool_choice")),
                         f"agent.params.tool_choice of {label}: with thinking enabled Anthropic "
                         "takes only auto or none")
        endpoint = agent.get("endpoint")
        if isinstance(endpoint, dict) and endpoint.get("api_version") is not None \
                and provider != "azure":
            self.add(self.key_position((*base, "agent", "endpoint", "api_version")),
                     f"agent.endpoint.api_version of {label} applies to azure/ models only")
        outputs = step.get("outputs")
        tools = agent.get("tools", ["read_file", "list_dir"])
        if isinstance(outputs, list) and outputs and isinstance(tools, list) \
                and not any(t in ("create_file", "apply_patch") for t in tools):
            self.add(self.key_position((*base, "outputs")),
                     f"{label} declares outputs but its agent has no write tool; add create_file "
                     "to agent.tools")

    def _writes(self, base: DataPath, step: dict[str, Any], label: str) -> None:
        agent = step.get("agent")
        writes = agent.get("writes") if isinstance(agent, dict) else None
        if not isinstance(writes, list):
            return
        tools = agent.get("tools") if isinstance(agent, dict) else None
        used = [t for t in tools if t in ("create_file", "apply_patch")] if isinstance(tools, list) else []
        if not writes and used:
            self.add(self.position((*base, "agent", "writes")),
                     f"agent.writes of {label} is empty, so every {' and '.join(used)} call "
                     "would be refused; list where its write tools may write (the default "
                     "is out/**) or drop them from agent.tools")
        for j, pattern in enumerate(writes):
            if isinstance(pattern, str):
                why = bad_relative(pattern)
                if why:
                    self.add(self.position((*base, "agent", "writes", j)),
                             f"agent.writes pattern {pattern!r} of {label} {why}")

