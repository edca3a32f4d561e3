"""``stockade doctor``: which sandbox backends exist here, which is active, and
whether it is enforced, proved by running a probe jail on each; with
``--executor dask://HOST:PORT``, the same for every worker of that cluster.

The CLI group registers it. Must not import the engine, workspace or store.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click


def _render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title="sandbox backends", show_lines=False)
    for col in ("backend", "available", "enforced (probed)", "active", "reason"):
        table.add_column(col)
    for b in report["backends"]:
        table.add_row(
            b["name"],
            "yes" if b["available"] else "no",
            "[green]yes[/green]" if b["enforced"] else "[red]no[/red]",
            "*" if b.get("active") else "",
            escape(b["reason"]
                   + (f" (needs {b['install']})" if b.get("install") else "")
                   + (f"; {b['detail']}" if b.get("detail") else "")),
        )
    console.print(table)
    if report.get("error"):
        console.print(f"[red]error:[/red] {escape(report['error'])}")
        return
    console.print(report["start_line"], markup=False)
    life = report["lifetime"]
    if life.get("error"):
        console.print(f"[red]jail lifetime:[/red] {escape(life['error'])}")
        return
    console.print(f"jail lifetime: {life['mechanism']}: {life['detail']}", markup=False)
    for what, key in (("memory", "memory"), ("processes", "processes")):
        console.print(f"  resources.{what}: {life[key] or 'rlimits only'}", markup=False)
    if life["watchdog"]:
        console.print(f"  watchdog: pid {life['watchdog']} ends every jail if the engine dies")
    if report["limitations"]:
        console.print(f"What {report['active']} does not do:")
        for line in report["limitations"]:
            console.print(f"  - {line}", markup=False)


def _cluster(url: str, requested: str | None) -> dict[str, Any]:
    """Each worker's report, probed on the worker (``runner.worker.probe_worker``)."""
    from stockade.runner.dask_cluster import connect, probe_workers

    client = connect(url)
    try:
        workers = probe_workers(client, requested, full=True)
        address = str(client.scheduler.address)
    finally:
        client.close(timeout=10)
    enforced = bool(workers) and all(w.get("enforced") for w in workers.values())
    return {"executor": url, "scheduler": address, "workers": workers, "enforced": enforced}


def _render_cluster(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=f"workers of {report['scheduler']}")
    for col in ("worker", "host", "backend", "enforced (probed)", "also available", "reason"):
        table.add_column(col)
    for address, w in sorted(report["workers"].items(), key=lambda kv: str(kv[1].get("name"))):
        others = ", ".join(b["name"] + ("" if b["enforced"] else " (not enforced)")
                           for b in w.get("backends", ())
                           if b["available"] and b["name"] != w.get("backend"))
        table.add_row(escape(f"{w.get('name')} ({address})"), escape(str(w.get("host"))),
                      escape(str(w.get("backend"))),
                      "[green]yes[/green]" if w.get("enforced") else "[red]no[/red]",
                      escape(others), escape(str(w.get("reason"))))
    console.print(table)
    if not report["workers"]:
        console.print("[red]the cluster has no workers[/red]")
    elif report["enforced"]:
        console.print("every worker jails its items (enforced)")
    else:
        console.print("[red]some workers do not enforce their sandbox:[/red] runs with "
                      "sandbox.require or --require-sandbox refuse them")


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
@click.option("--executor", default=None,
              help="check the workers of a Dask cluster (dask://HOST:PORT) instead of this "
                   "machine")
def doctor(as_json: bool, executor: str | None) -> None:
    """Show the sandbox backends, which is active and whether a probe jail proved it enforced."""
    from stockade import sandbox

    if executor and executor != "local":
        from stockade.cli.main import friendly

        report = friendly(_cluster)(executor, os.environ.get("STOCKADE_SANDBOX") or None)
        if as_json:
            click.echo(json.dumps(report, indent=2, sort_keys=True))
        else:
            _render_cluster(report)
        return

    try:
        report = sandbox.doctor(os.environ)
    finally:
        sandbox.close_all()
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        _render(report)
