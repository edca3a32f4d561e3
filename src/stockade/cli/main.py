"""The ``stockade`` command line.

Every user mistake ends as one actionable message and exit 2, never a
traceback; a failed step exits 1; an interrupt exits 130. Heavy modules are
imported inside commands so that ``stockade run`` starts its first item fast.

Must not import the engine or the sandbox backends.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import click

# Ctrl-C while the command line loads and parses ends it quietly (130): the
# handler is the stockade package's own, installed when it loads
# (``stockade._pending``); each command then takes SIGINT as a counted
# KeyboardInterrupt (``friendly``).
from stockade import _pending
from stockade._show import printable
from stockade.cli.streams import outlive_readers
from stockade.errors import StaleOutput, StockadeError, TamperedArtifact, UserError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    click.echo(message.rstrip("\n"), err=True)
    sys.exit(code)


def friendly(fn: F) -> F:
    """Translate engine errors at the boundary into a message and an exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _take_interrupts()
            return fn(*args, **kwargs)
        except UserError as exc:
            _fail(str(exc), exc.exit_code)
        except (StaleOutput, TamperedArtifact) as exc:
            _fail(f"error: {exc}", exc.exit_code)
        except StockadeError as exc:
            _fail(f"error: {exc}", exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", EXIT_INTERRUPTED)
        except BrokenPipeError:
            sys.exit(EXIT_OK)

    return wrapper  # type: ignore[return-value]


def _take_interrupts() -> None:
    """A command begins: from here a Ctrl-C is a KeyboardInterrupt this wrapper
    turns into exit 130. Until now (click parsing the command line) it was a
    quiet exit; one counted but not raised meanwhile ends the command now."""
    if signal.getsignal(signal.SIGINT) is _pending.quiet_interrupt:
        signal.signal(signal.SIGINT, _pending.interrupt)
        if _pending.take():
            raise KeyboardInterrupt


def _root(root: str | None) -> Path:
    from stockade.runner.roots import default_root

    return Path(root) if root else default_root(os.environ)


def _remember_root(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value:
        ctx.meta[ROOT_META] = value
    return value


#: Where a command's ``--root`` is kept for ``root_hint()``.
ROOT_META = "stockade.root"
root_option = click.option("--root", type=click.Path(file_okay=False), default=None,
                           callback=_remember_root,
                           help="runs folder (default: $STOCKADE_HOME or ./.stockade)")


def root_hint() -> str:
    """`` --root PATH`` for a command printed for the user to run next, when this
    command's root is not the one that command would find by itself."""
    ctx = click.get_current_context(silent=True)
    given = ctx.meta.get(ROOT_META) if ctx is not None else None
    if not given:
        return ""
    from stockade.runner.roots import default_root

    path = Path(given).resolve()
    return "" if path == default_root(os.environ).resolve() else f" --root {shlex.quote(str(path))}"


json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output")


def _remember_store(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[STORE_META] = value


#: Where a read command's ``--store`` is kept for ``store_url()``.
STORE_META = "stockade.store"
#: ``--store`` for the commands that read runs: the store ``run --store`` wrote to.
read_store_option = click.option(
    "--store", expose_value=False, callback=_remember_store, metavar="URL",
    help="run store: a PostgreSQL URL (default: $STOCKADE_STORE, else SQLite in the root)")


def store_url() -> str | None:
    """The current command's ``--store``, else ``$STOCKADE_STORE``."""
    ctx = click.get_current_context(silent=True)
    given = ctx.meta.get(STORE_META) if ctx is not None else None
    return given or os.environ.get("STOCKADE_STORE") or None
executor_option = click.option(
    "--executor", default=None, envvar="STOCKADE_EXECUTOR",
    help="where items run: local (default) or dask://HOST:PORT, a Dask scheduler whose "
         "workers have stockade installed")
artifacts_option = click.option(
    "--artifacts", default=None, metavar="URL",
    help="an fsspec URL (file:///shared, s3://bucket/prefix) for large files between the "
         "engine and Dask workers (default: by content)")


class _Commands(click.Group):
    """A group whose feature commands are imported only when used.

    ``stockade run`` must start its first item fast, so it does not pay for
    the agent, web and browse modules; an import error still fails loudly.
    """

    lazy: ClassVar[dict[str, str]] = {
        "apply": "stockade.cli.apply_cmd:apply",
        "cancel": "stockade.cli.manage:cancel",
        "doctor": "stockade.cli.doctor_cmd:doctor",
        "gc": "stockade.cli.manage:gc",
        "rm": "stockade.cli.manage:rm",
        "logs": "stockade.cli.browse:logs",
        "runs": "stockade.cli.browse:runs",
        "show": "stockade.cli.browse:show",
        "ui": "stockade.web.server:ui",
        "why": "stockade.cli.browse:why",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            import importlib

            module, _, attr = self.lazy[cmd_name].partition(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="stockade")
def cli() -> None:
    """Run workflows of shell and AI-agent steps in jails, with provenance."""


# -- run / resume ---------------------------------------------------------------


def _parse_vars(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--var {pair!r}: expected KEY=VALUE")
        if key in out and out[key] != value:
            # A script that appends a second --var (say, a date) would
            # otherwise run on whichever came last, without a word.
            raise UserError(f"--var {key} is given twice ({out[key]!r}, then {value!r}): "
                            "give it once")
        out[key] = value
    return out


def _reporter(as_json: bool) -> Any:
    from stockade.cli.progress import LiveReporter, PlainReporter

    if not as_json and sys.stderr.isatty() and os.environ.get("TERM") != "dumb":
        return LiveReporter()
    return PlainReporter(quiet=False)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _finish(result: Any, as_json: bool, t0: float) -> None:
    s = result.summary
    if as_json:
        click.echo(json.dumps({
            "run_id": result.run_id, "status": str(s.status), "run_dir": str(result.run_path),
            "sandbox": {"backend": result.sandbox.name, "enforced": result.sandbox.enforced},
            "steps": {k: str(v) for k, v in s.steps.items()}, "items": s.items,
            "retries": dict(s.retries), "reused": dict(s.reused), "problems": list(s.messages),
            "usage": dict(s.usage),
            "duration": round(time.monotonic() - t0, 3),
        }, indent=2, sort_keys=True))
    else:
        for m in s.messages[:20]:
            click.echo(f"  {printable(m)}", err=True)
        if len(s.messages) > 20:
            click.echo(f"  ... and {len(s.messages) - 20} more (stockade show {result.run_id}{root_hint()})", err=True)
        total = sum(sum(c.values()) for c in s.items.values())
        retried = sum(s.retries.values())
        extra = f", {retried} {'retry' if retried == 1 else 'retries'}" if retried else ""
        reused = sum(s.reused.values())
        extra += f", {reused} reused" if reused else ""
        click.echo(f"run {result.run_id} {s.status} in {time.monotonic() - t0:.1f}s "
                   f"({_plural(total, 'item')}{extra}); details: stockade show {result.run_id}{root_hint()}",
                   err=True)
        if str(s.status) == "interrupted":
            click.echo(f"resume with: stockade resume {result.run_id}{root_hint()}", err=True)
    sys.exit({"succeeded": EXIT_OK, "interrupted": EXIT_INTERRUPTED}.get(str(s.status), EXIT_FAILED))


def _announce(as_json: bool, reporter: Any) -> Callable[[str, Path, Any], None]:
    def on_start(run_id: str, path: Path, choice: Any) -> None:
        reporter.run_id = run_id
        if not as_json:
            click.echo(f"run {run_id} in {path}", err=True)
        click.echo(choice.line, err=True)

    return on_start


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--run-id", default=None, help="an id chosen by an external scheduler (never reused)")
@click.option("--var", "vars_", multiple=True, metavar="K=V", help="override a declared var")
@click.option("--jobs", "-j", type=click.IntRange(1, 1024), default=None,
              help="items at once (default: the CPUs this process may use)")
@root_option
@click.option("--require-sandbox", is_flag=True, help="refuse to start unless the sandbox is enforced")
@click.option("--sandbox", "sandbox_name", default=None, envvar="STOCKADE_SANDBOX",
              help="backend: bwrap, landlock, sandbox-exec or none (default: best available)")
@click.option("--store", "store_url", default=None, envvar="STOCKADE_STORE",
              help="run store: a PostgreSQL URL (default: SQLite in the root)")
# Two flags, not click's --reuse/--no-reuse pair, where the last one given
# wins: a script that appends one to a command holding the other is refused.
@click.option("--reuse", "reuse_on", is_flag=True,
              help="take unchanged items from earlier runs (default: the workflow's reuse:)")
@click.option("--no-reuse", "reuse_off", is_flag=True,
              help="run every item, whatever the workflow's reuse: says")
@executor_option
@artifacts_option
@json_option
@friendly
def run(file: Path, run_id: str | None, vars_: tuple[str, ...], jobs: int | None, root: str | None,
        require_sandbox: bool, sandbox_name: str | None, store_url: str | None,
        reuse_on: bool, reuse_off: bool, executor: str | None, artifacts: str | None,
        as_json: bool) -> None:
    """Start a run of FILE and execute it."""
    if reuse_on and reuse_off:
        raise UserError("--reuse and --no-reuse contradict each other: give one of them")
    reuse = True if reuse_on else False if reuse_off else None
    # The sandbox's probe jail runs while the run path is imported.
    from stockade.runner import early_probe

    probing = early_probe.start(sandbox_name, executor, os.environ)
    from stockade.runner.session import RunOptions, start_run

    if probing is not None:
        probing.join()
    t0 = time.monotonic()
    opts = RunOptions(root=_root(root), jobs=jobs, run_id=run_id, overrides=_parse_vars(vars_),
                      sandbox=sandbox_name, require_sandbox=require_sandbox, store_url=store_url,
                      reuse=reuse, executor=executor, artifacts=artifacts)
    outlive_readers()  # a reader that goes away (| head) must not end the run
    reporter = _reporter(as_json)
    reporter.start()
    try:
        result = start_run(file, opts, reporter, on_start=_announce(as_json, reporter),
                           interactive=sys.stdin.isatty(),
                           on_warning=lambda line: click.echo(line, err=True))
    finally:
        reporter.stop()
    _finish(result, as_json, t0)


@cli.command()
@click.argument("run_id")
@root_option
@click.option("--jobs", "-j", type=click.IntRange(1, 1024), default=None,
              help="items at once (default: the CPUs this process may use)")
@click.option("--sandbox", "sandbox_name", default=None, envvar="STOCKADE_SANDBOX")
@click.option("--store", "store_url", default=None, envvar="STOCKADE_STORE")
@click.option("--allow-stale", is_flag=True, help="let a run older than its window publish")
@click.option("--executor", default=None,
              help="where items run: local, or dask://HOST:PORT (default: $STOCKADE_EXECUTOR, "
                   "else the run's own cluster)")
@artifacts_option
@json_option
@friendly
def resume(run_id: str, root: str | None, jobs: int | None, sandbox_name: str | None,
           store_url: str | None, allow_stale: bool, executor: str | None,
           artifacts: str | None, as_json: bool) -> None:
    """Continue an interrupted or crashed run (RUN_ID, a prefix, or 'last'); verified items are kept."""
    from stockade.runner.roots import open_run_store
    from stockade.runner.runs import resolve_run
    from stockade.runner.session import RunOptions, resume_run

    t0 = time.monotonic()
    store = open_run_store(_root(root).resolve(), store_url, os.environ)
    try:
        run_id = resolve_run(store, run_id).run_id
    finally:
        store.close()
    opts = RunOptions(root=_root(root), jobs=jobs, sandbox=sandbox_name, store_url=store_url,
                      allow_stale=allow_stale, executor=executor, artifacts=artifacts)
    outlive_readers()  # a reader that goes away (| head) must not end the run
    reporter = _reporter(as_json)
    reporter.start()
    try:
        result = resume_run(run_id, opts, reporter, on_start=_announce(as_json, reporter),
                            interactive=sys.stdin.isatty())
    finally:
        reporter.stop()
    _finish(result, as_json, t0)


# -- static commands ------------------------------------------------------------------


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@friendly
def validate(file: Path) -> None:
    """Check a workflow; print each problem as FILE:LINE:COL: message."""
    from stockade.plan import build_plan
    from stockade.runner import preflight
    from stockade.runner.given import load_spec

    spec = load_spec(file)
    build_plan(spec)
    preflight.check(spec, file.resolve().parent, None, dict(spec.workflow.vars))
    for warning in spec.warnings:
        click.echo(str(warning), err=True)
    n = len(spec.workflow.steps)
    click.echo(f"{file}: ok ({n} step{'' if n == 1 else 's'})")


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@json_option
@friendly
def plan(file: Path, as_json: bool) -> None:
    """Show steps, fan-out and which values flow into which step."""
    from stockade.plan import build_plan, format_plan, plan_json
    from stockade.runner.given import load_spec

    spec = load_spec(file)
    p = build_plan(spec)
    if as_json:
        click.echo(json.dumps(plan_json(spec, p), indent=2, sort_keys=True))
    else:
        click.echo(format_plan(spec, p))


@cli.command()
def schema() -> None:
    """Print the JSON Schema of the workflow format (for editors)."""
    from stockade.spec import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


#: The exit status the command ended with, for ``_end_now``; None while it runs,
#: and after an exception other than SystemExit (Python then ends as usual).
_status: int | None = None


def _end_now() -> None:
    """The process's last exit handler: flush stdout and stderr, and end now.

    Registered when ``main`` starts, and only when no handler is registered
    yet (``stockade`` is the whole program, not run by coverage or a
    benchmark's wrapper that registered one of its own), so it runs after all
    of them (they run last registered first): the handlers of the modules a
    command imported (logging, weakref finalizers, Dask) have run, and the
    threads that are not daemons were joined before them. What it skips is
    Python's teardown of every module and object, which nobody sees: 130-160
    ms after a ``stockade run`` (pydantic, Jinja and click's modules), about 20
    ms after ``show``. The commands close every file they write themselves.
    """
    if _status is None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a reader that went away (| head)
            stream.flush()
    os._exit(_status)


def main() -> None:
    global _status
    if not atexit._ncallbacks():
        atexit.register(_end_now)
    try:
        if _pending.count:
            raise SystemExit(EXIT_INTERRUPTED)  # a Ctrl-C while importing, dropped by Python
        # Quiet until a command begins (``friendly``): click turns a KeyboardInterrupt
        # in its own parsing into "Aborted!" and exit 1.
        signal.signal(signal.SIGINT, _pending.quiet_interrupt)
        cli(prog_name="stockade")
    except SystemExit as exc:
        # As Python maps it: None is 0, a message (already printed by then) is 1.
        _status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        raise


if __name__ == "__main__":
    main()
