"""Preflight: everything that can be known before the first item runs.

``stockade validate`` and ``stockade run`` both call ``preflight``; each
problem is a ``FILE:LINE:COL`` ``Problem`` and they are reported together,
with exit 2, before any run folder exists. What it checks beyond the pure
spec checks: the host paths ``file()``/``tree()`` name (they must exist and
be a file or a folder), the ``mounts:`` and ``image:`` paths (they must
exist), the item keys of a step whose ``for_each`` is a literal list and
whose ``key:`` reads only ``item`` (each must name an item, none twice)
and a ``publish.to`` made from vars alone (rendered with the run's vars,
or the defaults for ``validate``) and, for a run only, the declared secrets and what
each agent step's provider and ``endpoint:`` need from the engine's
environment (a key or base URL; Azure's resource URL and key; the variable
``endpoint.api_key_env`` names).

Reads the disk and the environment; must not import the engine or the CLI.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from stockade.errors import Problem, UserError
from stockade.expr import ExprError, RenderError, compile_template, render
from stockade.runner.keys import check_key, key_problem
from stockade.spec import Spec
from stockade.spec.model import Step
from stockade.spec.paths import interface_mount
from stockade.spec.sinkurl import SinkUrlError, parse_sink_url
from stockade.workspace.host import host_path_problem, records_folder


def preflight(spec: Spec, base: Path, env: Mapping[str, str] | None,
              values: Mapping[str, Any] | None = None) -> list[Problem]:
    """Problems a run of ``spec`` would meet; ``env`` None checks no environment
    (``validate``); ``values``: the run's vars, for what is known from them alone."""
    problems: list[Problem] = []

    def add(path: tuple[str | int, ...], message: str) -> None:
        line, col = spec.position(*path)
        problems.append(Problem(spec.filename, line, col, message))

    for path, template in spec.templates().items():
        for rel in template.files:
            why = (_host_path_problem(base, rel, want_dir=False)
                   or host_path_problem(base, rel, tree=False))
            if why:
                add(path, f"file({rel!r}): {why}")
        for rel in template.trees:
            why = (_host_path_problem(base, rel, want_dir=True)
                   or host_path_problem(base, rel, tree=True))
            if why:
                add(path, f"tree({rel!r}): {why}")
    for j, mount in enumerate(spec.workflow.mounts):
        if (why := _toolchain_problem(base, mount) or _mount_problem(base, mount)) is not None:
            add(("mounts", j), f"mounts: {mount}: {why}")
    for i, step in enumerate(spec.workflow.steps):
        for j, mount in enumerate(step.mounts):
            if (why := _toolchain_problem(base, mount) or _mount_problem(base, mount)) is not None:
                add(("steps", i, "mounts", j), f"mounts: {mount}: {why}")
        if step.image is not None and (why := _toolchain_problem(base, step.image)) is not None:
            add(("steps", i, "image"), f"image: {step.image}: {why}")
        if (why := _literal_keys_problem(step)) is not None:
            add(("steps", i, "key"), why)
        if values is not None and (why := _sink_problem(step, values)) is not None:
            add(("steps", i, "publish", "to"), why)
    if env is None:
        return _sorted(problems)
    for j, name in enumerate(spec.workflow.secrets):
        if name not in env:
            add(("secrets", j), f"secret {name} is declared but not set in the environment; "
                                f"export {name}=... before `stockade run`")
    for i, step in enumerate(spec.workflow.steps):
        if step.agent is None:
            continue
        # Here, not at the top: a workflow without agent steps (most) does not
        # pay for importing the agent package on its way to the first item.
        from stockade.agent import endpoints

        provider = step.agent.model.split("/", 1)[0]
        for field, message in endpoints.problems(provider, endpoints.step_endpoint(step.agent.endpoint),
                                                 env):
            if field == "model":
                add(("steps", i, "agent", "model"), f"{step.agent.model} {message}")
            else:
                add(("steps", i, "agent", "endpoint", field), message)
    return _sorted(problems)


def check(spec: Spec, base: Path, env: Mapping[str, str] | None,
          values: Mapping[str, Any] | None = None) -> None:
    """Raise a ``UserError`` listing every preflight problem, if there is any."""
    problems = preflight(spec, base, env, values)
    if problems:
        raise UserError(problems=problems)


def remote_problems(spec: Spec, url: str) -> list[Problem]:
    """What a run on the Dask cluster at ``url`` must not do: reach its
    scheduler, which runs any client's code on every worker, outside any jail.
    ``network: open`` reaches it. An allowlist entry reaches it when it names
    the scheduler's host or one of its addresses (the proxy lets a private or
    loopback address through when an entry names it as an IP literal), or
    names a host that resolves to one of them."""
    host = (urlparse(url).hostname or "").lower()
    scheduler = _addresses(host)
    problems = []
    for i, step in enumerate(spec.workflow.steps):
        if step.network == "open":
            problems.append(Problem(
                spec.filename, *spec.position("steps", i, "network"),
                f"step {step.id!r} has network: open, which on a Dask cluster reaches its "
                "scheduler, and the scheduler runs any client's code on every worker, outside "
                "any jail; give the step an allowlist (network: [host, ...]) or run it with "
                "--executor local"))
        elif isinstance(step.network, list):
            for j, pattern in enumerate(step.network):
                name = pattern.rsplit(":", 1)[0].lower()
                named = host and (name == host or (name.startswith("*.")
                                                   and host.endswith(name[1:])))
                if named or (not name.startswith("*.") and scheduler & _addresses(name)):
                    problems.append(Problem(
                        spec.filename, *spec.position("steps", i, "network", j),
                        f"step {step.id!r} may reach {pattern!r}, the Dask scheduler's host, "
                        "which runs any client's code on every worker, outside any jail; "
                        "leave it out"))
    return problems


def _addresses(host: str) -> set[str]:
    """The IP addresses ``host`` names (itself, for an IP literal); none when it
    does not resolve (then the proxy cannot reach it either)."""
    if not host:
        return set()
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        pass
    try:
        return {str(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
                for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, ValueError):
        return set()


def _literal_keys_problem(step: Step) -> str | None:
    """Why the keys of a literal ``for_each`` list cannot name its items, or None.

    Only where they are known now: a list written in the workflow and a
    ``key:`` that reads nothing but ``item``. A key that does not render
    here is left to the run, which reports it where it always does."""
    if step.key is None or not isinstance(step.for_each, list):
        return None
    try:
        template = compile_template(step.key)
    except ExprError:
        return None  # the spec's own checks report it
    if (not template.uses_item or template.steps_used or template.vars_used
            or template.uses_run or template.files or template.trees):
        return None
    keys = []
    for value in step.for_each:
        try:
            rendered = render(template, {"item": value})
        except (ExprError, RenderError, UserError):
            return None
        try:
            keys.append(check_key(rendered))
        except UserError as exc:
            return str(exc)
    return key_problem(keys, lambda k: k)


def _sink_problem(step: Step, values: Mapping[str, Any]) -> str | None:
    """Why a ``publish.to`` made from vars alone names no sink, or None: known
    before the run, not after its steps have done their work."""
    if step.publish is None or "{{" not in step.publish.to:
        return None
    try:
        template = compile_template(step.publish.to)
    except ExprError:
        return None  # the spec's own checks report it
    if template.steps_used or template.uses_item or template.uses_run or template.files \
            or template.trees:
        return None
    try:
        to = render(template, {"vars": values})
    except (ExprError, RenderError, UserError):
        return None  # left to the run, which reports it where it always does
    try:
        parse_sink_url(str(to))
    except SinkUrlError as exc:
        return f"publish.to of step {step.id!r}: {exc}"
    return None


def _host_path_problem(base: Path, rel: str, *, want_dir: bool) -> str | None:
    target = base / rel
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return f"no such {'folder' if want_dir else 'file'} next to the workflow ({target})"
    except PermissionError:
        return f"permission denied ({target})"
    except OSError as exc:
        return f"{exc.strerror} ({target})"
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return f"is not a folder ({target})"
    if not want_dir and not stat.S_ISREG(st.st_mode):
        return f"is not a regular file ({target})"
    return None


def _mount_problem(base: Path, declared: str) -> str | None:
    """Why the host path of a ``mounts:`` entry cannot be mounted where it
    leads (a link to /proc, /sys, /dev or /run; a socket), or None. The path
    as written is checked with the workflow (``spec.paths.interface_mount``)."""
    absolute = os.path.normpath(declared if declared.startswith("/") else base / declared)
    real = os.path.realpath(absolute)
    for folder in (Path(real), *Path(real).parents):
        if records_folder(folder) is not None:
            return (f"{'is' if str(folder) == real else f'lies in {folder},'} a folder of "
                    "stockade's run records (any root's): the jail would read runs' outputs "
                    "with none of their provenance; mount the toolchain's own folder")
    if real != absolute and (inside := interface_mount(real)) is not None:
        top, why = inside
        return f"leads to {real}{'' if real == top else f', in {top}'}: {why}"
    try:
        if stat.S_ISSOCK(os.stat(real).st_mode):
            return ("is a socket: a jailed step could talk to whatever listens on it; mount "
                    "the toolchain's own folder")
    except OSError:
        return None  # the caller names what is missing
    return None


def _toolchain_problem(base: Path, declared: str) -> str | None:
    """Why a ``mounts:`` or ``image:`` path (absolute, or relative to the
    workflow's folder) cannot be used, or None."""
    target = Path(declared) if declared.startswith("/") else base / declared
    try:
        os.stat(target)
    except FileNotFoundError:
        where = "" if declared.startswith("/") else " (relative to the workflow's folder)"
        return f"no such file or folder{where}: {target}"
    except PermissionError:
        return f"permission denied ({target})"
    except OSError as exc:
        return f"{exc.strerror} ({target})"
    return None


def _sorted(problems: list[Problem]) -> list[Problem]:
    out: list[Problem] = []
    for p in sorted(problems, key=lambda p: (p.line, p.col, p.message)):
        if p not in out:
            out.append(p)
    return out
