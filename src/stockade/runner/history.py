"""The read side of a run: what ``show``, ``logs``, ``why`` and the web UI display.

Built from the store (items, attempts, events), the manifest (step order,
kinds, vars) and the records in each item's ``meta/`` (read through the
types of ``workspace.records``). Every failure a person can cause (a missing
item, a ``keep:`` item asked for its logs, an output name that does not
exist) is a ``UserError`` that says what exists instead.

Must not import the engine or the CLI.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.errors import UserError
from stockade.runner.runs import UNFINISHED, run_path, state
from stockade.runner.status import RunStatus
from stockade.store.base import AttemptRecord, ItemRecord, RunRecord, Store, sum_usage
from stockade.workspace.layout import ItemDir, RunDir, read_json
from stockade.workspace.records import Provenance


@dataclass
class RunView:
    record: RunRecord
    status: RunStatus
    step_ids: list[str]
    kinds: dict[str, str]
    needs: dict[str, list[str]]
    vars: dict[str, Any]
    by_step: dict[str, list[ItemRecord]]
    retries: dict[str, int] = field(default_factory=dict)
    #: Agent token usage of the whole run (summed from the items' store records).
    usage: dict[str, int] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    #: Per step, the count of each status when ``by_step`` holds only the
    #: first items of each step (``run_summary``); None: ``by_step`` is whole.
    tallies: dict[str, dict[str, int]] | None = None
    #: How many times ``stockade resume`` continued the run. Its ``duration``
    #: runs from the first start to the last end, so it takes in the time
    #: between a crash or an interrupt and each resume.
    resumes: int = 0
    #: The items each step that started had (a ``for_each`` of an empty list: 0).
    started: dict[str, int] = field(default_factory=dict)

    @property
    def duration(self) -> float | None:
        import time

        end = self.record.ended_at or (time.time() if self.status is RunStatus.RUNNING else None)
        return None if end is None else end - self.record.started_at

    @property
    def warnings(self) -> list[str]:
        return manifest_warnings(self.manifest)

    def items(self, step: str) -> list[ItemRecord]:
        return self.by_step.get(step, [])

    def step_usage(self, step: str) -> dict[str, int]:
        """Agent token usage of one step's items together."""
        return sum_usage(self.items(step))

    def total(self, step: str) -> int:
        """How many items of ``step`` are recorded (``items`` may hold fewer)."""
        if self.tallies is not None:
            return sum(self.tallies.get(step, {}).values())
        return len(self.items(step))

    def counts(self, step: str) -> dict[str, int]:
        if self.tallies is not None:
            return dict(self.tallies.get(step, {}))
        out: dict[str, int] = {}
        for i in self.items(step):
            out[i.status] = out.get(i.status, 0) + 1
        return out

    def step_json(self, step: str) -> dict[str, Any]:
        return {
            "id": step, "kind": self.kinds.get(step, ""), "needs": self.needs.get(step, []),
            "counts": self.counts(step), "retries": self.retries.get(step, 0),
            "usage": self.step_usage(step),
            "items": [item_json(i) for i in self.items(step)],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "run": {**self.record.__dict__, "status": str(self.status),
                    "stored_status": self.record.status, "duration": self.duration,
                    "resumes": self.resumes},
            "vars": self.vars,
            "warnings": self.warnings,
            "usage": self.usage,
            "steps": [self.step_json(s) for s in self.step_ids],
            "resume": (f"stockade resume {self.record.run_id}"
                       if self.status in (RunStatus.CRASHED, RunStatus.INTERRUPTED) else None),
        }


def item_json(rec: ItemRecord) -> dict[str, Any]:
    d = dict(rec.__dict__)
    d["key"] = rec.label
    d["outputs"] = [o.__dict__ for o in rec.outputs]
    return d


def manifest_warnings(manifest: Mapping[str, Any]) -> list[str]:
    """The workflow's warnings when the run started (``FILE:LINE:COL: warning: ...``);
    none for a manifest written before runs kept them."""
    found = manifest.get("warnings")
    return [str(w) for w in found] if isinstance(found, list) else []


def read_manifest(record: RunRecord) -> dict[str, Any]:
    try:
        data = read_json(run_path(record) / "manifest.json")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_view(store: Store, record: RunRecord) -> RunView:
    """The whole run: every item record of every step."""
    manifest = read_manifest(record)
    items = store.items(record.run_id)
    by_step: dict[str, list[ItemRecord]] = {}
    for i in items:
        by_step.setdefault(i.step, []).append(i)
    return _view(store, record, manifest, by_step, sum_usage(items))


def run_summary(store: Store, record: RunRecord, first: int = 20, *,
                whole: str | None = None) -> RunView:
    """The run with counts per step and only the first ``first`` items of each
    (all of an agent step's, whose token usage is summed, and all of step
    ``whole``'s): what ``show`` prints without ``--all``, and what ``show``
    of a step or an item, ``logs`` and ``why`` need, answered without reading
    a 100,000-item run whole."""
    manifest = read_manifest(record)
    tallies = {sid: t.counts for sid, t in store.recorded_tallies(record).items()}
    kinds = _declared(manifest)[1]
    by_step: dict[str, list[ItemRecord]] = {}
    usage_items: list[ItemRecord] = []
    for sid in tallies:
        agent = kinds.get(sid) == "agent"
        if agent or sid == whole:
            by_step[sid] = store.items(record.run_id, sid)
            if agent:
                usage_items += by_step[sid]
        else:
            by_step[sid] = store.item_page(record.run_id, sid, limit=first) if first else []
    view = _view(store, record, manifest, by_step, sum_usage(usage_items))
    view.tallies = tallies
    return view


def _declared(manifest: Mapping[str, Any]) -> tuple[list[str], dict[str, str],
                                                     dict[str, list[str]]]:
    declared = manifest.get("steps") or []
    step_ids = [s["id"] for s in declared if isinstance(s, dict) and "id" in s]
    kinds = {s["id"]: str(s.get("kind", "")) for s in declared if isinstance(s, dict)}
    needs = {s["id"]: list(s.get("needs", [])) for s in declared if isinstance(s, dict)}
    return step_ids, kinds, needs


def _view(store: Store, record: RunRecord, manifest: dict[str, Any],
          by_step: dict[str, list[ItemRecord]], usage: dict[str, int]) -> RunView:
    step_ids, kinds, needs = _declared(manifest)
    step_ids += sorted(s for s in by_step if s not in step_ids)
    retries: dict[str, int] = {}
    started: dict[str, int] = {}
    resumes = 0
    for ev in store.events_of([record.run_id],
                              ["retry_scheduled", "run_resumed", "step_started"]):
        step = str(ev.data.get("step", ""))
        if ev.kind == "run_resumed":
            resumes += 1
        elif ev.kind == "step_started":
            started[step] = int(ev.data.get("items") or 0)
        else:
            retries[step] = retries.get(step, 0) + 1
    return RunView(record, state(record), step_ids, kinds, needs,
                   dict(manifest.get("vars") or {}), by_step, retries, usage, manifest,
                   resumes=resumes, started=started)


@dataclass
class ItemView:
    record: ItemRecord
    kind: str
    attempts: list[AttemptRecord]
    provenance: Provenance | None
    publish: dict[str, Any] | None
    tail: str

    def to_json(self) -> dict[str, Any]:
        item = item_json(self.record)
        return {
            # ``items`` (a list of one) keeps the shape of ``show RUN STEP --json``.
            "item": item, "items": [item], "kind": self.kind,
            "attempts": [a.__dict__ for a in self.attempts],
            "provenance": self.provenance.to_json() if self.provenance else None,
            "publish": self.publish, "stderr_tail": self.tail,
        }


def item_dir(record: RunRecord, item: ItemRecord) -> ItemDir:
    return RunDir(Path(record.root), record.run_id).item(item.step, item.item)


def attempt_provenance(store: Store, run_id: str, step: str, item: int,
                       attempt: int) -> Provenance | None:
    """An attempt's provenance as the store keeps it."""
    for a in store.attempts(run_id, step, item):
        if a.attempt == attempt and a.provenance:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                return Provenance.from_json(a.provenance)
    return None


def item_view(store: Store, record: RunRecord, item: ItemRecord) -> ItemView:
    view_kind = kind_of(record, item.step)
    idir = item_dir(record, item)
    attempts = store.attempts(record.run_id, item.step, item.item)
    prov = None
    pub = None
    tail = ""
    if item.attempt:
        prov = attempt_provenance(store, record.run_id, item.step, item.item, item.attempt)
        raw = next((a.provenance for a in attempts if a.attempt == item.attempt), None) or {}
        pub = raw.get("publish") if isinstance(raw.get("publish"), dict) else None
        if item.status not in ("succeeded", "skipped"):
            tail = _tail(idir.stderr(item.attempt))
    return ItemView(item, view_kind, attempts, prov, pub, tail)


def kind_of(record: RunRecord, step: str) -> str:
    for s in read_manifest(record).get("steps") or []:
        if isinstance(s, dict) and s.get("id") == step:
            return str(s.get("kind", ""))
    return ""


def _tail(path: Path, lines: int = 10) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            data = f.read()
    except OSError:
        return ""
    # Newlines only: a carriage return stays in its line (``show`` escapes it).
    return "\n".join(data.decode("utf-8", errors="replace").rstrip("\n").split("\n")[-lines:])


def log_path(store: Store, record: RunRecord, item: ItemRecord, which: str,
             attempt: int | None, *, kind: str) -> Path:
    """Where one attempt's stdout or stderr capture is (it may not exist: a
    stream the attempt wrote nothing to has no file). Read it in pieces: a
    capture may be gigabytes."""
    label = f"{item.step}/{item.label}"
    if kind == "keep":
        raise UserError(f"{label} is an item of a keep: step: a decision evaluated by the "
                        "engine, with no process and so no logs (see `stockade show`)")
    if kind == "publish":
        raise UserError(f"{label} is a publish item: it runs no process; its outcome is in "
                        f"`stockade show {record.run_id} {shlex.quote(label)}`")
    if attempt is not None and attempt < 1:
        raise UserError(f"--attempt {attempt}: attempts are numbered from 1 (without "
                        f"--attempt, logs gives {label}'s last)")
    if item.reused_from:
        raise UserError(_reused_logs(store, record, item, label))
    idir = item_dir(record, item)
    known = [a.attempt for a in store.attempts(record.run_id, item.step, item.item)]
    on_disk = idir.attempt_numbers()
    n = attempt if attempt is not None else (item.attempt or (on_disk[-1] if on_disk else 0))
    if n <= 0:
        why = f"{item.status}: {item.message}" if item.message else str(item.status)
        raise UserError(f"{label} never started an attempt ({why})")
    if n not in known and n not in on_disk:
        have = sorted(set(known) | set(on_disk))
        raise UserError(f"{label} has no attempt {n} "
                        f"(attempts: {', '.join(map(str, have)) or 'none'})")
    return idir.stdout(n) if which == "stdout" else idir.stderr(n)


def _reused_logs(store: Store, record: RunRecord, item: ItemRecord, label: str) -> str:
    """Where a reused item's logs are: the run it came from, unless that is gone."""
    origin = item.reused_from or {}
    run_id = str(origin.get("run_id"))
    src = None
    with contextlib.suppress(ValueError, TypeError):
        if store.get_run(run_id) is not None:
            src = store.get_item(run_id, str(origin.get("step")), int(origin.get("item", 0)))
    if src is None:
        # Reuse placed the outputs in this run's folder: they outlive the removal.
        return (f"{label} was reused from run {run_id}, which has since been removed with its "
                f"logs; its outputs are still in this run (stockade show {record.run_id} "
                f"{shlex.quote(label)})")
    return (f"{label} was reused from run {run_id}: it ran there (stockade logs {run_id} "
            f"{shlex.quote(f'{src.step}/{src.label}')})")


def provenance_chain(store: Store, record: RunRecord, item: ItemRecord, output: str | None,
                     *, kind: str, max_items: int | None = None) -> dict[str, Any]:
    """The ``why`` of an item's outputs: each input, the item that made it, recursively.

    ``max_items`` bounds how many producing items are read (the web UI's graph of
    an item fed by 10,000 others); inputs past it are listed without ``from``.
    """
    label = f"{item.step}/{item.label}"
    if kind == "keep":
        raise UserError(f"{label} is a decision of a keep: step; it makes no files "
                        "(see `stockade show` for its decision and the item it kept)")
    if kind == "publish":
        return _publish_node(store, record, item, max_items)
    name = output.removeprefix("out/") if output else None
    if name is not None:
        names = [o.name for o in item.outputs]
        if name not in names:
            listed = ", ".join(f"out/{n}" for n in names) or "none"
            raise UserError(f"{label} has no output {output!r} (its outputs: {listed})")
    if not item.attempt:
        why = f" ({item.status}: {item.message})" if item.message else f" ({item.status})"
        raise UserError(f"{label} never ran{why}, so it has no outputs and no provenance")
    if item.status in UNFINISHED:
        raise UserError(f"{label} is {item.status} (attempt {item.attempt}): its outputs and "
                        "provenance are recorded when an attempt ends")
    return _chain(store, record.run_id, item.step, item.item, name, 0, set(), max_items)


def _chain(store: Store, run_id: str, step: str, index: int, output: str | None, depth: int,
           seen: set[tuple[str, str, int]], max_items: int | None = None) -> dict[str, Any]:
    rec = store.get_item(run_id, step, index)
    prov = None if rec is None else attempt_provenance(store, run_id, step, index, rec.attempt)
    if prov is None:
        raise UserError(f"no provenance for {step}/#{index} in run {run_id}")
    outputs = [o for o in prov.outputs if output is None or o.name == output]
    node: dict[str, Any] = {
        "step": step, "item": index, "key": prov.key, "attempt": prov.attempt,
        "status": str(rec.status) if rec is not None else "",
        "run_id": prov.run_id, "sandbox": prov.sandbox.__dict__,
        "outputs": [o.__dict__ for o in outputs], "inputs": [],
    }
    reused = prov.reused_from or next((o.reused_from for o in prov.outputs if o.reused_from),
                                      None)
    if reused:
        node["reused_from"] = dict(reused)
    elif rec is not None and rec.not_reused:
        node["not_reused"] = rec.not_reused
    seen.add((run_id, step, index))
    for inp in prov.inputs:
        entry: dict[str, Any] = {"name": inp.name, "sha256": inp.sha256, "size": inp.size,
                                 "source": dict(inp.source)}
        src = inp.source
        if inp.kind == "artifact" and depth < 50:
            src_run = str(src.get("run_id", run_id))
            key = (src_run, str(src["step"]), int(src["item"]))
            if key not in seen and (max_items is None or len(seen) < max_items):
                with contextlib.suppress(UserError):
                    entry["from"] = _chain(store, src_run, str(src["step"]), int(src["item"]),
                                           str(src["name"]), depth + 1, seen, max_items)
        node["inputs"].append(entry)
    if reused and depth < 50:
        # Across runs: where the reused outputs were made.
        origin = (str(reused.get("run_id")), str(reused.get("step")), int(reused.get("item", 0)))
        if origin not in seen:
            with contextlib.suppress(UserError, ValueError, TypeError):
                node["reused"] = _chain(store, *origin, output, depth + 1, seen, max_items)
    return node


def _publish_node(store: Store, record: RunRecord, item: ItemRecord,
                  max_items: int | None = None) -> dict[str, Any]:
    pub: Mapping[str, Any] = {}
    for a in store.attempts(record.run_id, item.step, item.item):
        if a.attempt == item.attempt and a.provenance:
            pub = a.provenance.get("publish") or {}
    effect = store.get_effect(f"{record.run_id}/{item.step}/{item.item}")
    node: dict[str, Any] = {
        "kind": "publish", "step": item.step, "item": item.item, "key": item.label,
        "run_id": record.run_id, "status": item.status, "message": item.message,
        "publish": dict(pub), "effect": effect.__dict__ if effect else None,
        "payload_artifacts": [],
    }
    seen: set[tuple[str, str, int]] = set()
    for ref in pub.get("payload_artifacts") or []:
        entry = dict(ref)
        if max_items is None or len(seen) < max_items:
            with contextlib.suppress(UserError, KeyError, ValueError, TypeError):
                entry["from"] = _chain(store, record.run_id, str(ref["step"]), int(ref["item"]),
                                       str(ref["name"]), 1, seen if max_items else set(),
                                       max_items)
        node["payload_artifacts"].append(entry)
    return node
