"""Retention and control: ``gc``, ``rm``, ``cancel``.

None of them ever touches a running run: ``gc`` and ``rm`` skip or refuse it,
``cancel`` asks its engine to stop (SIGTERM: the engine ends the run as
``interrupted``, resumable). Must not import the runner's engine.
"""

from __future__ import annotations

import time

import click

from stockade._show import when
from stockade.cli.browse import _store
from stockade.cli.main import _root, friendly, read_store_option, root_hint, root_option
from stockade.errors import UserError
from stockade.runner.runs import (
    parse_age,
    remove_run,
    resolve_run,
    retention,
    run_path,
    signal_cancel,
    state,
    sweep_trash,
)
from stockade.workspace.runlock import is_held

#: How long ``cancel`` waits for the engine to let go of its run.
CANCEL_WAIT = 60.0


@click.command()
@click.option("--keep", type=click.IntRange(0, None), default=None,
              help="keep the newest N runs")
@click.option("--older-than", "older_than", default=None, metavar="AGE",
              help="delete runs started longer ago than AGE (30d, 12h, ...)")
@click.option("--dry-run", is_flag=True, help="list what would be deleted, delete nothing")
@root_option
@read_store_option
@friendly
def gc(keep: int | None, older_than: str | None, dry_run: bool, root: str | None) -> None:
    """Delete old run folders and their store records; never a running run."""
    if keep is None and older_than is None:
        raise UserError("gc needs --keep N and/or --older-than AGE (nothing is deleted by default)")
    age = parse_age(older_than) if older_than is not None else None
    runs_root = _root(root).resolve()
    store = _store(runs_root)
    sweep_trash(runs_root / "runs")
    chosen = retention(store.list_runs(1_000_000), keep=keep, older_than=age, now=time.time())
    for r in chosen:
        verb = "would delete" if dry_run else "deleted"
        if not dry_run:
            remove_run(store, r)
        click.echo(f"{verb} {r.run_id}  {state(r)}  {when(r.started_at)}  {r.workflow}")
    if not chosen:
        click.echo("nothing to delete")


@click.command()
@click.argument("run_id")
@root_option
@read_store_option
@friendly
def rm(run_id: str, root: str | None) -> None:
    """Delete one run's folder and store records (refused while it runs)."""
    store = _store(_root(root).resolve())
    record = resolve_run(store, run_id)
    remove_run(store, record)
    click.echo(f"deleted {record.run_id}")


@click.command()
@click.argument("run_id")
@root_option
@read_store_option
@friendly
def cancel(run_id: str, root: str | None) -> None:
    """Stop a running run from another terminal; it ends as interrupted, resumable."""
    store = _store(_root(root).resolve())
    record = resolve_run(store, run_id)
    holder = signal_cancel(record)
    path = run_path(record)
    click.echo(f"cancelling {record.run_id} (engine pid {holder.pid}) ...")
    deadline = time.monotonic() + CANCEL_WAIT
    while is_held(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    if is_held(path):
        raise UserError(f"run {record.run_id}: the engine has not stopped after "
                        f"{CANCEL_WAIT:.0f} s")
    after = store.get_run(record.run_id)
    click.echo(f"run {record.run_id} is {after.status if after else 'gone'}; "
               f"resume it with: stockade resume {record.run_id}{root_hint()}")
