"""Browse runs: ``runs``, ``show``, ``logs``, ``why``.

Read-only views over the store and the run folders. Must not import the runner's
engine or any sandbox backend.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from stockade.cli.main import _root, friendly, json_option, root_option
from stockade.errors import UserError
from stockade.store.base import ItemRecord, Store
from stockade.workspace.layout import RunDir, read_json


def _store(root: Path) -> Store:
    import os

    from stockade.runner.session import open_run_store

    if not (root / "stockade.db").exists() and not os.environ.get("STOCKADE_STORE"):
        raise UserError(f"no runs under {root} (set --root or $STOCKADE_HOME)")
    return open_run_store(root, None, os.environ)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _target(spec: str) -> tuple[str, int | None]:
    step, _, item = spec.partition("/")
    if item and not item.isdigit():
        raise UserError(f"{spec!r}: expected STEP or STEP/ITEM with a numeric item")
    return step, int(item) if item else None


@click.command()
@root_option
@click.option("--limit", default=50, show_default=True)
@json_option
@friendly
def runs(root: str | None, limit: int, as_json: bool) -> None:
    """List runs, newest first."""
    store = _store(_root(root))
    records = store.list_runs(limit)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in records], indent=2, sort_keys=True))
        return
    for r in records:
        sandbox = r.sandbox + ("" if r.enforced else " (not enforced)")
        click.echo(f"{r.run_id}  {r.status:<11} {_when(r.started_at)}  {r.workflow}  sandbox: {sandbox}")


def _item_json(rec: ItemRecord) -> dict[str, Any]:
    d = dict(rec.__dict__)
    d["outputs"] = [o.__dict__ for o in rec.outputs]
    return d


@click.command()
@click.argument("run_id")
@click.argument("target", required=False)
@root_option
@json_option
@friendly
def show(run_id: str, target: str | None, root: str | None, as_json: bool) -> None:
    """Show a run, a step, or one item with its attempts and outputs."""
    r = _root(root)
    store = _store(r)
    run = store.get_run(run_id)
    if run is None:
        raise UserError(f"no run {run_id!r} in {r} (see `stockade runs`)")
    step, item = _target(target) if target else (None, None)
    items = store.items(run_id, step)
    if item is not None:
        items = [i for i in items if i.item == item]
    if target and not items:
        raise UserError(f"run {run_id} has no item {target!r}")
    if as_json:
        out: dict[str, Any] = {"run": run.__dict__, "items": [_item_json(i) for i in items]}
        if item is not None and step is not None:
            out["attempts"] = [a.__dict__ for a in store.attempts(run_id, step, item)]
        click.echo(json.dumps(out, indent=2, sort_keys=True, default=str))
        return
    sandbox = run.sandbox + (" (enforced)" if run.enforced else " (NOT enforced)")
    click.echo(f"run {run.run_id}  {run.status}  workflow {run.workflow}  sandbox {sandbox}")
    click.echo(f"started {_when(run.started_at)}  ended {_when(run.ended_at)}")
    for rec in items:
        line = f"  {rec.step}/{rec.item}  {rec.status:<9} attempt {rec.attempt}"
        if rec.message:
            line += f"  {rec.message}"
        click.echo(line)
        if item is not None or len(items) <= 20:
            for o in rec.outputs:
                click.echo(f"      out/{o.name}  {o.size} bytes  sha256 {o.sha256[:16]}")
    if item is not None and step is not None:
        for a in store.attempts(run_id, step, item):
            click.echo(f"  attempt {a.attempt}: {a.outcome} exit={a.exit_code} "
                       f"{a.ended_at - a.started_at:.2f}s {a.message}".rstrip())


@click.command()
@click.argument("run_id")
@click.argument("target")
@click.option("--attempt", type=int, default=None, help="attempt number (default: the last)")
@click.option("--stderr", "which", flag_value="stderr", help="show stderr instead of stdout")
@click.option("--stdout", "which", flag_value="stdout", default=True)
@root_option
@friendly
def logs(run_id: str, target: str, attempt: int | None, which: str, root: str | None) -> None:
    """Print an item's captured stdout (or stderr) for an attempt."""
    step, item = _target(target)
    idir = RunDir(_root(root).resolve(), run_id).item(step, item or 0)
    n = attempt or idir.last_attempt()
    path = idir.attempt_dir(n) / which
    if not path.exists():
        raise UserError(f"no {which} for {target} attempt {n} of run {run_id}")
    sys.stdout.buffer.write(path.read_bytes())


@click.command()
@click.argument("run_id")
@click.argument("target")
@click.argument("output", required=False)
@root_option
@json_option
@friendly
def why(run_id: str, target: str, output: str | None, root: str | None, as_json: bool) -> None:
    """The provenance chain of an item's output: inputs, producers, hashes."""
    rundir = RunDir(_root(root).resolve(), run_id)
    step, item = _target(target)
    chain = _chain(rundir, step, item or 0, output, depth=0, seen=set())
    if as_json:
        click.echo(json.dumps(chain, indent=2, sort_keys=True))
    else:
        _print_chain(chain, 0)


def _chain(rundir: RunDir, step: str, item: int, output: str | None, depth: int,
           seen: set[tuple[str, int]]) -> dict[str, Any]:
    idir = rundir.item(step, item)
    try:
        done = read_json(idir.completion)
        prov = read_json(idir.attempt_dir(done["attempt"]) / "provenance.json")
    except (OSError, ValueError, KeyError):
        raise UserError(f"no provenance for {step}/{item} in run {rundir.run_id}") from None
    outputs = prov["outputs"]
    if output is not None:
        outputs = [o for o in outputs if o["name"] == output]
        if not outputs:
            raise UserError(f"{step}/{item} has no output {output!r}")
    node: dict[str, Any] = {
        "step": step, "item": item, "attempt": prov["attempt"], "run_id": prov["run_id"],
        "sandbox": prov["sandbox"], "outputs": outputs, "inputs": [],
    }
    seen.add((step, item))
    for inp in prov["inputs"]:
        entry = dict(inp)
        src = inp["source"]
        if src.get("kind") == "artifact" and (src["step"], src["item"]) not in seen and depth < 50:
            entry["from"] = _chain(rundir, src["step"], src["item"], src["name"], depth + 1, seen)
        node["inputs"].append(entry)
    return node


def _print_chain(node: dict[str, Any], indent: int) -> None:
    pad = "  " * indent
    sb = node["sandbox"]
    click.echo(f"{pad}{node['step']}/{node['item']} attempt {node['attempt']} (run {node['run_id']}, "
               f"sandbox {sb['backend']}{'' if sb['enforced'] else ' NOT enforced'})")
    for o in node["outputs"]:
        click.echo(f"{pad}  out/{o['name']}  sha256 {o['sha256']}  {o['size']} bytes")
    for inp in node["inputs"]:
        src = inp["source"]
        origin = src.get("kind")
        if origin == "artifact":
            origin = f"{src['step']}/{src['item']}:out/{src['name']} attempt {src['attempt']}"
        elif origin in ("file", "tree"):
            origin = f"{origin}({src['path']!r})"
        elif src.get("refs"):
            origin = f"{origin} of {', '.join(src['refs'])}"
        click.echo(f"{pad}  <- {inp['name']}  sha256 {inp['sha256'][:16]}  from {origin}")
        if "from" in inp:
            _print_chain(inp["from"], indent + 2)
