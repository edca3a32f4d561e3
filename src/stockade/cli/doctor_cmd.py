"""``stockade doctor``: which sandbox backends exist here, which is active, and
whether it is enforced, proved by running a probe jail on each.

The CLI group registers it. Must not import the runner, workspace or store.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click


def _render(report: dict[str, Any]) -> None:
    from rich.console import Console
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
            b["reason"]
            + (f" (needs {b['install']})" if b.get("install") else "")
            + (f"; {b['detail']}" if b.get("detail") else ""),
        )
    console.print(table)
    if report.get("error"):
        console.print(f"[red]error:[/red] {report['error']}")
        return
    console.print(report["start_line"], markup=False)
    life = report["lifetime"]
    if life.get("error"):
        console.print(f"[red]jail lifetime:[/red] {life['error']}")
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


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def doctor(as_json: bool) -> None:
    """Show the sandbox backends, which is active and whether a probe jail proved it enforced."""
    from stockade import sandbox

    try:
        report = sandbox.doctor(os.environ)
    finally:
        sandbox.close_all()
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        _render(report)
