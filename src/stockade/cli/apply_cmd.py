"""``stockade apply RUN_ID STEP/KEY --to DIR``: hand a coding step's diff to a checkout.

Parses, asks ``stockade.agent.apply`` for a checked plan, prints every
resolved target, confirms (``--yes`` skips) and applies. Exit status: 0
applied, 1 refused or failed (``ApplyRefused``), 2 bad input.

Must not import the engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from stockade._show import printable
from stockade.agent.apply import ApplyRefused, execute, plan_apply
from stockade.cli.main import _root, friendly, read_store_option, root_option, store_url
from stockade.runner.runs import resolve_item, resolve_run


@click.command("apply")
@click.argument("run_id")
@click.argument("step_item", metavar="STEP/KEY")
@click.option("--to", "dest", required=True,
              type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="the host checkout (a git work tree) to apply the diff to")
@click.option("--yes", is_flag=True, help="do not ask for confirmation (automation)")
@root_option
@read_store_option
@friendly
def apply(run_id: str, step_item: str, dest: Path, yes: bool, root: str | None) -> None:
    """Apply the diff an agent step handed out to a git checkout."""
    from stockade.runner.history import item_dir
    from stockade.runner.roots import open_run_store

    store = open_run_store(_root(root).resolve(), store_url(), os.environ)
    try:
        record = resolve_run(store, run_id)
        item = resolve_item(store, record.run_id, step_item)
    finally:
        store.close()
    label = f"{item.step}/{item.label}"
    plan = plan_apply(item_dir(record, item), label, dest)
    if plan.empty:
        click.echo(f"{label} changed nothing; nothing to apply.")
        return
    for t in plan.targets:
        click.echo(f"TARGET: {printable(str(t.host))}{'  (new file)' if t.new else ''}")
    if not yes and not click.confirm(f"Apply {len(plan.targets)} change(s) to {plan.dest}?",
                                     default=False):
        raise ApplyRefused("not confirmed; nothing applied")
    execute(plan)
    click.echo(f"applied {len(plan.targets)} change(s) to {plan.dest}")
