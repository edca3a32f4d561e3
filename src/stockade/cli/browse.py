"""Browse runs: ``runs``, ``show``, ``logs``, ``why``.

Parses arguments, asks ``runner.runs`` and ``runner.history`` for the
answer, prints it. Must not import the runner's engine or any sandbox backend.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from stockade._show import duration, lines, printable, when
from stockade.cli.main import (
    _root,
    friendly,
    json_option,
    read_store_option,
    root_hint,
    root_option,
    store_url,
)
from stockade.errors import UserError
from stockade.runner import history
from stockade.runner.runs import UNFINISHED, find_item, resolve_run, state
from stockade.runner.status import RunStatus
from stockade.store.base import Store


def _store(root: Path, url: str | None = None) -> Store:
    from stockade.runner.roots import open_run_store

    url = url or store_url()
    if not url and not (root / "stockade.db").exists():
        raise UserError(f"no runs under {root} (set --root or $STOCKADE_HOME)")
    return open_run_store(root, url, os.environ)


@click.command()
@root_option
@read_store_option
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--status", "status_filter", default=None,
              type=click.Choice([str(s) for s in RunStatus]),
              help="only runs with this status")
@click.option("--workflow", default=None, help="only runs of this workflow")
@json_option
@friendly
def runs(root: str | None, limit: int, status_filter: str | None, workflow: str | None,
         as_json: bool) -> None:
    """List runs, newest first."""
    runs_root = _root(root).resolve()
    if runs_root.is_dir() and not store_url() and not (runs_root / "stockade.db").exists():
        folders = [e for e in (runs_root / "runs").glob("*") if (e / "manifest.json").exists()]
        if folders:
            # Run folders without this root's store: `run --store URL` made them.
            raise UserError(f"{runs_root} holds {len(folders)} run folder(s) but no store of "
                            "its own: their records are in the store they ran with (--store "
                            "URL, $STOCKADE_STORE)")
        # A root made but never run in: nothing to list, as after gc took every run.
        click.echo("[]" if as_json else "no runs yet")
        return
    store = _store(runs_root)
    now = time.time()
    rows = []
    for r in store.list_runs(max(limit * 4, limit) if (status_filter or workflow) else limit):
        st = state(r)
        if status_filter and str(st) != status_filter:
            continue
        if workflow and r.workflow != workflow:
            continue
        end = r.ended_at if r.ended_at else (now if st is RunStatus.RUNNING else None)
        rows.append((r, st, None if end is None else end - r.started_at))
        if len(rows) >= limit:
            break
    if as_json:
        click.echo(json.dumps([{**r.__dict__, "status": str(st), "stored_status": r.status,
                                "duration": d} for r, st, d in rows], indent=2, sort_keys=True))
        return
    if not rows:
        click.echo("no runs" + (" match" if status_filter or workflow else " yet"))
        return
    for r, st, d in rows:
        sandbox = r.sandbox + ("" if r.enforced else " (not enforced)")
        line = (f"{r.run_id}  {st:<11} {when(r.started_at)}  {duration(d):>8}  "
                f"{r.workflow}  sandbox: {sandbox}")
        if st is RunStatus.CRASHED:
            line += f"  (resume: stockade resume {r.run_id}{root_hint()})"
        click.echo(line)


@click.command()
@click.argument("run_id")
@click.argument("target", required=False)
@root_option
@read_store_option
@click.option("--all", "show_all", is_flag=True, help="list every item and output")
@json_option
@friendly
def show(run_id: str, target: str | None, root: str | None, show_all: bool, as_json: bool) -> None:
    """Show a run (RUN_ID, a prefix, or 'last'), a step, or one item (STEP/KEY, STEP/#N)."""
    store = _store(_root(root).resolve())
    record = resolve_run(store, run_id)
    if target is None:
        # The plain listing needs counts and the first items of each step, not
        # every record: a 100,000-item run answers as fast as a small one.
        if not (as_json or show_all):
            _print_run(history.run_summary(store, record, LIST_LIMIT), show_all)
            return
        with _no_cycle_collection():
            view = history.run_view(store, record)
            if as_json:
                click.echo(_listing_json(view.to_json()))
            else:
                _print_run(view, show_all)
        return
    # A step's items or one item: the rest of the run only counted.
    view = history.run_summary(store, record, 0)
    if "/" not in target and target in view.step_ids and view.total(target) != 1:
        with _no_cycle_collection():
            view = history.run_summary(store, record, 0, whole=target)
            if as_json:
                click.echo(_listing_json(view.step_json(target)))
            else:
                _print_header(view)
                _print_step(view, target, show_all=True)
        return
    item = find_item(store, record, target, steps=view.step_ids)
    detail = history.item_view(store, record, item)
    if as_json:
        out = {"run": {**record.__dict__, "status": str(view.status)}, **detail.to_json()}
        click.echo(json.dumps(out, indent=2, sort_keys=True, default=str))
    else:
        _print_item(view, detail)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """The cyclic collector off for the block. Every record of a listing is
    held until printed, and none is in a cycle: the collector's passes over
    them all took 2.3 s of the 8.4 s ``show --json`` spent on a 100,000-item
    run's records, and found nothing."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: Encodes one item of a listing on one line (``json``'s C encoder: it does
#: not indent, and the indenting one is pure Python).
_ITEM_ENCODER = json.JSONEncoder(sort_keys=True, default=str)


def _listing_json(value: Any, depth: int = 0) -> str:
    """``json.dumps(value, indent=2, sort_keys=True, default=str)``, except
    that each element of an ``items`` list is one line: indenting every field
    of a 100,000-item run took ``show --json`` 15 s, nearly all of it in
    ``json``'s pure-Python indenting encoder."""
    pad = "\n" + "  " * (depth + 1)
    if isinstance(value, dict) and value:
        fields = []
        for key in sorted(value):
            inner = value[key]
            if key == "items" and isinstance(inner, list) and inner:
                text = "[" + pad + "  " + ("," + pad + "  ").join(
                    _ITEM_ENCODER.encode(i) for i in inner) + pad + "]"
            else:
                text = _listing_json(inner, depth + 1)
            fields.append(f"{_ITEM_ENCODER.encode(str(key))}: {text}")
        return "{" + pad + ("," + pad).join(fields) + "\n" + "  " * depth + "}"
    if isinstance(value, list | tuple) and value:
        return "[" + pad + ("," + pad).join(
            _listing_json(v, depth + 1) for v in value) + "\n" + "  " * depth + "]"
    return _ITEM_ENCODER.encode(value)


def _print_header(view: history.RunView) -> None:
    r = view.record
    sandbox = r.sandbox + (" (enforced)" if r.enforced else " (NOT enforced)")
    click.echo(f"run {r.run_id}  {view.status}  workflow {r.workflow}  sandbox {sandbox}")
    resumed = ""
    if view.resumes:
        times = "once" if view.resumes == 1 else f"{view.resumes} times"
        resumed = f" (first start to last end; resumed {times})"
    click.echo(f"started {when(r.started_at)}  ended {when(r.ended_at)}  "
               f"duration {duration(view.duration)}{resumed}")
    if view.status is RunStatus.CRASHED:
        click.echo(f"the engine of this run died; resume it with: stockade resume {r.run_id}{root_hint()}")
    elif view.status is RunStatus.INTERRUPTED:
        click.echo(f"interrupted; resume it with: stockade resume {r.run_id}{root_hint()}")
    if view.vars:
        click.echo("vars: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in view.vars.items()))
    for warning in view.warnings:
        click.echo(warning)
    if view.usage:
        click.echo("tokens: " + _tokens(view.usage))


def _tokens(u: dict[str, int]) -> str:
    """``1,234 in (100 cached), 56 out (20 reasoning), 3 model calls``."""
    text = f"{u.get('input_tokens', 0):,} in"
    if u.get("cached_tokens"):
        text += f" ({u['cached_tokens']:,} cached)"
    text += f", {u.get('output_tokens', 0):,} out"
    if u.get("reasoning_tokens"):
        text += f" ({u['reasoning_tokens']:,} reasoning)"
    calls = u.get("model_calls", 0)
    return text + f", {calls} model call{'' if calls == 1 else 's'}"


def _print_run(view: history.RunView, show_all: bool) -> None:
    _print_header(view)
    for sid in view.step_ids:
        _print_step(view, sid, show_all=show_all)


LIST_LIMIT = 20


def _print_step(view: history.RunView, sid: str, *, show_all: bool) -> None:
    items = view.items(sid)
    total = view.total(sid)
    counts = view.counts(sid)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    begun = view.started.get(sid)
    # Items get their records as they end: a step still going (or left by a
    # dead engine) has fewer than it started with.
    unfinished = begun - sum(counts.values()) if begun else 0
    if unfinished > 0:
        summary += f"{', ' if summary else ''}{unfinished} of {begun} not finished"
    elif not summary:
        summary = "no items (its for_each gave an empty list)" if begun == 0 else "not started"
    kind = view.kinds.get(sid, "")
    retried = view.retries.get(sid, 0)
    extra = f", {retried} {'retry' if retried == 1 else 'retries'}" if retried else ""
    usage = view.step_usage(sid)
    if usage:
        extra += f"; tokens {_tokens(usage)}"
    click.echo(f"{sid} ({kind}): {summary}{extra}" if kind else f"{sid}: {summary}{extra}")
    shown = items if show_all else items[:LIST_LIMIT]
    for rec in shown:
        line = f"  {sid}/{rec.label}  {rec.status:<9}"
        if rec.attempt and kind != "keep":
            line += f" attempt {rec.attempt}"
        if kind == "keep" and rec.status == "succeeded":
            line += "  kept" if rec.result is True else "  dropped"
        elif rec.message:
            line += f"  {printable(rec.message)}"
        click.echo(line)
        outs = rec.outputs
        if total == 1 or show_all:
            for o in outs:
                click.echo(f"      out/{printable(o.name)}  {o.size} bytes  sha256 {o.sha256[:16]}")
        elif outs:
            click.echo(f"      {len(outs)} output{'s' if len(outs) != 1 else ''} "
                       f"(stockade show {view.record.run_id} {shlex.quote(f'{sid}/{rec.label}')})")
    if total > len(shown):
        click.echo(f"  ... {total - len(shown)} more items "
                   f"(stockade show {view.record.run_id} {sid} --all)")


def _print_item(view: history.RunView, d: history.ItemView) -> None:
    rec = d.record
    click.echo(f"{rec.step}/{rec.label}  (item #{rec.item} of run {view.record.run_id}, "
               f"step kind {d.kind})")
    click.echo(f"  status {rec.status}" + (f"  {printable(rec.message)}" if rec.message else ""))
    if rec.not_reused:
        click.echo(f"  not reused: {rec.not_reused}")
    if d.kind == "keep":
        click.echo(f"  decision: {'kept' if rec.result is True else 'dropped'}")
    for a in d.attempts:
        worker = (a.provenance or {}).get("worker") or {}
        click.echo(f"  attempt {a.attempt}: {a.outcome}  started {when(a.started_at)}  "
                   f"{a.ended_at - a.started_at:.2f}s"
                   + (f"  exit {a.exit_code}" if a.exit_code is not None else "")
                   + (f"  on worker {worker.get('name')}" if worker else "")
                   + (f"  {printable(a.message)}" if a.message else ""))
    if rec.status in UNFINISHED and all(a.attempt != rec.attempt for a in d.attempts):
        click.echo(f"  attempt {rec.attempt}: {rec.status}"
                   + (f"  {printable(rec.message)}" if rec.message else ""))
    if rec.usage:
        click.echo(f"  tokens: {_tokens(rec.usage)}")
    for o in rec.outputs:
        click.echo(f"  out/{printable(o.name)}  {o.size} bytes  sha256 {o.sha256}")
    if d.publish:
        p = d.publish
        click.echo(f"  published key {p.get('key')!r} to {p.get('to')} under lease "
                   f"{p.get('lease')!r} with token {p.get('token')}: {p.get('status')}")
    if d.tail:
        click.echo("  last lines of stderr:")
        for line in lines(d.tail):
            click.echo(f"    {printable(line)}")
    if d.kind in ("run", "agent") and (d.attempts or rec.status in UNFINISHED):
        click.echo(f"  logs: stockade logs {view.record.run_id} "
                   f"{shlex.quote(f'{rec.step}/{rec.label}')} [--stderr] [--attempt N]")


@click.command()
@click.argument("run_id")
@click.argument("target")
@click.option("--attempt", type=int, default=None, help="attempt number (default: the last)")
@click.option("--stderr", "which", flag_value="stderr", help="show stderr instead of stdout")
@click.option("--stdout", "which", flag_value="stdout", default=True)
@root_option
@read_store_option
@friendly
def logs(run_id: str, target: str, attempt: int | None, which: str, root: str | None) -> None:
    """Print an item's captured stdout (or stderr) for an attempt."""
    store = _store(_root(root).resolve())
    record = resolve_run(store, run_id)
    view = history.run_summary(store, record, 0)
    item = find_item(store, record, target, steps=view.step_ids)
    kind = view.kinds.get(item.step, "")
    path = history.log_path(store, record, item, which, attempt, kind=kind)
    if not _copy_out(path):
        # An empty answer is easy to take for a broken command: say which
        # stream has the output, on stderr so that a pipe still gets nothing.
        other = "stdout" if which == "stderr" else "stderr"
        lines = _count_lines(history.log_path(store, record, item, other, attempt, kind=kind))
        said = f"{item.step}/{item.label} wrote nothing to {which}"
        if lines:
            again = f" --attempt {attempt}" if attempt is not None else ""
            said += (f"; its {other} has {lines} line{'' if lines == 1 else 's'}: stockade logs "
                     f"{record.run_id} {shlex.quote(f'{item.step}/{item.label}')} "
                     f"--{other}{again}")
        click.echo(said, err=True)


#: What ``logs`` holds of a capture at a time: it may be gigabytes.
CHUNK = 1 << 20


def _copy_out(path: Path) -> int:
    """Copy a capture to stdout in pieces; the bytes copied (0: none, or no file)."""
    copied = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                sys.stdout.buffer.write(chunk)
                copied += len(chunk)
    except FileNotFoundError:
        pass  # stderr is kept only when the attempt wrote any
    return copied


def _count_lines(path: Path) -> int:
    """Lines in a capture, the last one counted without its newline too."""
    lines, last = 0, b"\n"
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
    except FileNotFoundError:
        return 0
    return lines + (last != b"\n")


@click.command()
@click.argument("run_id")
@click.argument("target")
@click.argument("output", required=False)
@root_option
@read_store_option
@json_option
@friendly
def why(run_id: str, target: str, output: str | None, root: str | None, as_json: bool) -> None:
    """The provenance chain of an item's output: inputs, producers, hashes."""
    store = _store(_root(root).resolve())
    record = resolve_run(store, run_id)
    view = history.run_summary(store, record, 0)
    item = find_item(store, record, target, steps=view.step_ids)
    chain = history.provenance_chain(store, record, item, output,
                                     kind=view.kinds.get(item.step, ""))
    if as_json:
        click.echo(json.dumps(chain, indent=2, sort_keys=True, default=str))
    else:
        _print_chain(chain, 0)


def _print_chain(node: dict[str, Any], indent: int) -> None:
    pad = "  " * indent
    if node.get("kind") == "publish":
        p = node.get("publish") or {}
        click.echo(f"{pad}{node['step']}/{node['key']} publish (run {node['run_id']}): "
                   f"key {p.get('key')!r} -> {p.get('to')}, lease {p.get('lease')!r}, "
                   f"token {p.get('token')}, {p.get('status')}")
        for a in node.get("payload_artifacts", []):
            click.echo(f"{pad}  <- payload artifact {a['step']}/{a.get('key', a['item'])}:"
                       f"out/{printable(a['name'])}  sha256 {str(a['sha256'])[:16]}")
            if "from" in a:
                _print_chain(a["from"], indent + 2)
        return
    sb = node["sandbox"]
    reused = node.get("reused_from")
    via = f", reused from run {reused['run_id']}" if reused else ""
    click.echo(f"{pad}{node['step']}/{node['key']} attempt {node['attempt']} (run {node['run_id']}"
               f"{via}, sandbox {sb['backend']}{'' if sb['enforced'] else ' NOT enforced'})")
    if node.get("not_reused"):
        click.echo(f"{pad}  not reused: {node['not_reused']}")
    if node.get("status") not in (None, "succeeded"):
        label = shlex.quote(f"{node['step']}/{node['key']}")
        click.echo(f"{pad}  {node['status']}: nothing it wrote counts as an output; its "
                   f"stderr: stockade logs {node['run_id']} {label} --stderr")
    for o in node["outputs"]:
        click.echo(f"{pad}  out/{printable(o['name'])}  sha256 {o['sha256']}  {o['size']} bytes")
    for inp in node["inputs"]:
        src = inp["source"]
        origin = src.get("kind")
        if origin == "artifact":
            origin = (f"{src['step']}/{src.get('key', src['item'])}:out/{printable(src['name'])} "
                      f"attempt {src['attempt']}")
        elif origin in ("file", "tree"):
            origin = f"{origin}({src['path']!r})"
        elif src.get("refs"):
            origin = f"{origin} of {', '.join(src['refs'])}"
        click.echo(f"{pad}  <- {printable(inp['name'])}  sha256 {inp['sha256'][:16]}  from {origin}")
        if "from" in inp:
            _print_chain(inp["from"], indent + 2)


__all__ = ["logs", "runs", "show", "why"]
