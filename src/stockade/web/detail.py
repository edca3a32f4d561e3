"""The parts of an item's page that come from its records on disk.

Provenance (inputs and outputs with hashes), the provenance chain as a graph of
items across runs, the agent transcript (messages, tool calls, writes with
hashes, usage), the publish outcome. Every reader tolerates a missing or torn
record: the page says what is not there. Must not import the engine, the
sandbox or the CLI.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from stockade.errors import UserError
from stockade.runner.history import attempt_provenance, provenance_chain
from stockade.store.base import ItemRecord, RunRecord, Store
from stockade.web.items import read_jsonl
from stockade.workspace.layout import ItemDir, read_json
from stockade.workspace.records import Provenance

#: How many producing items the chain graph reads, and how many inputs a page lists.
CHAIN_ITEMS = 60
LIST_INPUTS = 300


def item_url(run_id: str, step: str, key: str) -> str:
    return f"/runs/{quote(run_id, safe='')}/{quote(step, safe='')}/{quote(key, safe='')}"


def index_url(run_id: str, step: str, index: int) -> str:
    return item_url(run_id, step, f"#{index}")


def provenance_of(store: Store, record: RunRecord, step: str, index: int,
                  attempt: int) -> Provenance | None:
    if attempt <= 0:
        return None
    return attempt_provenance(store, record.run_id, step, index, attempt)


def out_dir(idir: ItemDir, attempt: int) -> Path:
    """Where attempt ``attempt`` left ``out/``: ``work/`` until a later attempt moved it."""
    later = idir.last_attempt() > attempt
    return (idir.attempt_dir(attempt) / "work" if later else idir.work) / "out"


def work_dir(idir: ItemDir, attempt: int) -> Path:
    return out_dir(idir, attempt).parent


def inputs_of(prov: Provenance | None, base_url: str, attempt: int) -> list[dict[str, Any]]:
    rows = []
    for inp in (prov.inputs if prov else ())[:LIST_INPUTS]:
        src = dict(inp.source)
        row: dict[str, Any] = {"name": inp.name, "sha256": inp.sha256, "size": inp.size,
                               "kind": inp.kind, "source": _source_text(src), "from": None,
                               "download": f"{base_url}/files/in/{quote(inp.name)}?attempt={attempt}"}
        if inp.kind == "artifact" and "step" in src and "item" in src:
            run_id = str(src.get("run_id", prov.run_id if prov else ""))
            row["from"] = index_url(run_id, str(src["step"]), int(src["item"]))
            row["download"] = (index_url(run_id, str(src["step"]), int(src["item"]))
                               + f"/files/out/{quote(str(src.get('name', '')))}"
                               + f"?attempt={int(src.get('attempt', 0))}")
        rows.append(row)
    return rows


def _source_text(src: dict[str, Any]) -> str:
    kind = str(src.get("kind", ""))
    if kind == "artifact":
        return (f"{src.get('step')}/#{src.get('item')} attempt {src.get('attempt')} "
                f"out/{src.get('name')}" + (f" (run {src.get('run_id')})" if src.get("run_id")
                                            else ""))
    if kind in ("file", "tree"):
        return f"{kind}({src.get('path')})"
    return kind


def outputs_of(record: ItemRecord | None, prov: Provenance | None, attempt: int,
               base_url: str) -> list[dict[str, Any]]:
    """The files the attempt left in ``out/``: the store's list for the item's final
    attempt, the attempt's provenance for an earlier one."""
    files: list[tuple[str, str, int, Mapping[str, Any] | None]]
    if record is not None and record.attempt == attempt:
        files = [(o.name, o.sha256, o.size, None) for o in record.outputs]
    else:
        files = [(o.name, o.sha256, o.size, o.reused_from) for o in (prov.outputs if prov else ())]
    reused = {o.name: o.reused_from for o in (prov.outputs if prov else ()) if o.reused_from}
    return [{"name": n, "sha256": h, "size": s,
             "reused_from": dict(r or reused.get(n) or {}) or None,
             "download": f"{base_url}/files/out/{quote(n)}?attempt={attempt}"}
            for n, h, s, r in files]


# -- the provenance chain as a graph --------------------------------------------------


def chain_graph(store: Store, record: RunRecord, item: ItemRecord, kind: str) -> dict[str, Any]:
    """Nodes (items, host files, text inputs) and edges (files) for dagre to lay out."""
    if kind == "keep" or (item.attempt <= 0 and kind != "publish"):
        return {"nodes": [], "edges": [], "note": _no_chain(kind, item)}
    try:
        root = provenance_chain(store, record, item, None, kind=kind, max_items=CHAIN_ITEMS)
    except UserError as exc:
        return {"nodes": [], "edges": [], "note": str(exc)}
    nodes: dict[str, dict[str, Any]] = {}
    edges: list[dict[str, Any]] = []
    more = 0

    def item_node(n: dict[str, Any]) -> str:
        run_id = str(n.get("run_id", record.run_id))
        nid = f"{run_id}/{n['step']}/{n['item']}"
        if nid not in nodes:
            nodes[nid] = {"id": nid, "kind": "item", "label": f"{n['step']}/{n.get('key', n['item'])}",
                          "run": run_id if run_id != record.run_id else "",
                          "url": index_url(run_id, str(n["step"]), int(n["item"])),
                          "current": nid == f"{record.run_id}/{item.step}/{item.item}"}
        return nid

    def walk(n: dict[str, Any]) -> str:
        nonlocal more
        nid = item_node(n)
        if n.get("reused_from"):
            r = n["reused_from"]
            src = {"run_id": r.get("run_id"), "step": r.get("step", n["step"]),
                   "item": r.get("item", n["item"]), "key": r.get("key", n.get("key"))}
            if src["run_id"]:
                sid = item_node(src)
                edges.append({"from": sid, "to": nid, "label": "reused from", "dashed": True})
        for entry in (n.get("inputs") or n.get("payload_artifacts") or []):
            if len(nodes) > CHAIN_ITEMS + 20:
                more += 1
                continue
            name = str(entry.get("name", ""))
            if "from" in entry:
                edges.append({"from": walk(entry["from"]), "to": nid, "label": name})
                continue
            src = entry.get("source") or entry
            skind = str(src.get("kind", ""))
            if skind == "artifact" or "step" in src:
                pid = item_node({"run_id": src.get("run_id", record.run_id),
                                 "step": src.get("step"), "item": src.get("item", 0),
                                 "key": f"#{src.get('item', 0)}"})
                edges.append({"from": pid, "to": nid, "label": name})
            elif skind in ("file", "tree"):
                fid = f"{skind}:{src.get('path')}"
                nodes.setdefault(fid, {"id": fid, "kind": "file",
                                       "label": f"{skind}({src.get('path')})", "url": ""})
                edges.append({"from": fid, "to": nid, "label": name})
            else:
                tid = f"text:{nid}:{name}"
                refs = [str(r) for r in src.get("refs") or []]
                label = f"{skind or 'value'} of {', '.join(refs)}" if refs else (skind or "value")
                nodes[tid] = {"id": tid, "kind": "text", "label": label, "url": ""}
                edges.append({"from": tid, "to": nid, "label": name})
        return nid

    walk(root)
    note = f"{more} more inputs not drawn" if more else ""
    return {"nodes": list(nodes.values()), "edges": edges, "note": note}


def _no_chain(kind: str, item: ItemRecord) -> str:
    if kind == "keep":
        return "a keep: step decides on its input items; it makes no files"
    return f"the item never ran an attempt ({item.status}), so there is no chain"


# -- agent transcript --------------------------------------------------------------


def _text(content: Any) -> tuple[str, list[dict[str, str]]]:
    """The text and tool calls (or results) in a message's content, either provider's shape."""
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    calls: list[dict[str, str]] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        t = block.get("type")
        if t == "text":
            texts.append(str(block.get("text", "")))
        elif t == "tool_use":
            calls.append({"name": str(block.get("name", "")),
                          "args": json.dumps(block.get("input"), ensure_ascii=False)})
        elif t == "tool_result":
            inner, _ = _text(block.get("content"))
            texts.append(inner)
    return "\n".join(texts), calls


def _message(m: dict[str, Any]) -> dict[str, Any]:
    text, calls = _text(m.get("content"))
    for c in m.get("tool_calls") or []:
        fn = c.get("function") or {}
        calls.append({"name": str(fn.get("name", "")), "args": str(fn.get("arguments", ""))})
    return {"role": str(m.get("role", "")), "text": text, "calls": calls}


def _reply(body: Any) -> dict[str, Any] | None:
    if not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return _message(choices[0].get("message") or {})
    if "content" in body:
        return _message({"role": body.get("role", "assistant"), "content": body["content"]})
    return None


def transcript(adir: Path) -> dict[str, Any] | None:
    """An agent attempt's conversation, model calls, writes and usage; None for others."""
    agent = None
    with contextlib.suppress(OSError, ValueError):
        agent = read_json(adir / "agent.json")
    calls = read_jsonl(adir / "transcript.jsonl")
    writes = read_jsonl(adir / "writes.jsonl")
    if agent is None and not calls:
        return None
    outcome = None
    with contextlib.suppress(OSError, ValueError):
        outcome = read_json(adir / "outcome.json")
    messages: list[dict[str, Any]] = []
    history: list[Any] = []  # the request's message list, rebuilt from per-call deltas
    rows = []
    usage: dict[str, int] = {}
    final = None
    for c in calls:
        if c.get("event") != "model_call":
            rows.append({"event": c.get("event"), "detail": c.get("reason") or c.get("message")
                         or c.get("result") or ""})
            continue
        u = c.get("usage") or {}
        for k, v in u.items():
            if isinstance(v, int):
                usage[k] = usage.get(k, 0) + v
        body = (c.get("request") or {}).get("body") or {}
        req = _conversation(body, history)
        if req is not None:
            history = req
        if isinstance(req, list) and not c.get("error"):
            messages = [_message(m) for m in req if isinstance(m, dict)]
            final = _reply((c.get("response") or {}).get("body"))
        rows.append({"event": "model_call", "n": c.get("n"), "attempt": c.get("attempt"),
                     "model": c.get("model"), "latency_ms": c.get("latency_ms"),
                     "usage": u, "error": c.get("error", ""), "stop": c.get("stop", "")})
    if final is not None:
        messages.append(final)
    diff = ""
    with contextlib.suppress(OSError):
        diff = (adir / "changes.diff").read_text(encoding="utf-8", errors="replace")[:200_000]
    return {"agent": agent, "messages": messages, "calls": rows, "usage": usage,
            "writes": [{"event": w.get("event", ""), "tool": w.get("tool", ""),
                        "path": w.get("path", ""), "sha256": w.get("sha256") or "",
                        "reason": w.get("reason", "")} for w in writes],
            "outcome": outcome, "diff": diff}


def _conversation(body: dict[str, Any], history: list[Any]) -> list[Any] | None:
    """A call's whole message list: the transcript keeps only what each call adds
    (``messages_from``/``input_from`` say where the new part starts)."""
    for key in ("messages", "input"):
        part = body.get(key)
        if isinstance(part, list):
            start = body.get(f"{key}_from")
            return part if not isinstance(start, int) else [*history[:start], *part]
    return None


def publish_outcome(store: Store, record: RunRecord, item: ItemRecord | None,
                    attempt: int) -> dict[str, Any] | None:
    """What a publish item sent where: key, token (fence), sink, effect."""
    pub: Any = None
    effect = None
    if item is not None:
        for a in store.attempts(record.run_id, item.step, item.item):
            if a.attempt == attempt and a.provenance:
                pub = a.provenance.get("publish")
        e = store.get_effect(f"{record.run_id}/{item.step}/{item.item}")
        effect = e.__dict__ if e else None
    if pub is None and effect is None:
        return None
    return {"publish": pub if isinstance(pub, dict) else {}, "effect": effect}
