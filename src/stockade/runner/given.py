"""What a run takes from outside its steps, checked and fingerprinted.

The workflow file itself, the ``--var`` overrides (typed like the declared
defaults), the host files and trees its templates name (``file()``,
``tree()``: fingerprinted before the run starts, and read at most once
each), and the values of the secrets it declares (a ``Masker``). Every
mistake here is a ``UserError`` naming what to change. Must not import the
engine, the executors, the sandbox or the CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stockade.errors import UserError
from stockade.runner.env import Masker
from stockade.spec import Spec, load_workflow
from stockade.workspace.artifacts import HostFile, HostTree, host_file, host_tree


def apply_overrides(spec: Spec, overrides: Mapping[str, str] | None) -> dict[str, Any]:
    values = dict(spec.workflow.vars)
    for key, value in (overrides or {}).items():
        if key not in values:
            declared = ", ".join(sorted(values)) or "none"
            raise UserError(f"--var {key}=...: {key!r} is not declared under vars: (declared: {declared})")
        values[key] = _coerce(key, value, values[key])
    return values


_TYPE_WORDS = {bool: "true or false", int: "a number", float: "a number", list: "a JSON list",
               dict: "a JSON mapping"}


def _coerce(key: str, raw: str, default: Any) -> Any:
    """Give an override the type of the declared default (``--var threshold=30`` stays a number)."""
    if isinstance(default, str) or default is None:
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int | float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        want = _TYPE_WORDS.get(type(default), type(default).__name__)
        raise UserError(f"--var {key}={raw}: expected {want} like the declared "
                        f"default {json.dumps(default)}")
    return value


def fingerprint_inputs(spec: Spec, base: Path) -> tuple[dict[str, HostFile], dict[str, HostTree]]:
    files = {rel: host_file(base, rel) for rel in spec.files}
    trees = {rel: host_tree(base, rel) for rel in spec.trees}
    return files, trees


def input_fingerprint(vars: Mapping[str, Any], files: Mapping[str, HostFile],
                      trees: Mapping[str, HostTree]) -> str:
    blob = json.dumps({
        "vars": vars,
        "files": {k: v.sha256 for k, v in files.items()},
        "trees": {k: v.sha256 for k, v in trees.items()},
    }, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def template_functions(base: Path, files: dict[str, HostFile],
                       trees: dict[str, HostTree]) -> dict[str, Callable[..., Any]]:
    lock = threading.Lock()

    def file_fn(rel: str) -> HostFile:
        with lock:
            if rel not in files:
                files[rel] = host_file(base, rel)
            return files[rel]

    def tree_fn(rel: str) -> HostTree:
        with lock:
            if rel not in trees:
                trees[rel] = host_tree(base, rel)
            return trees[rel]

    return {"file": file_fn, "tree": tree_fn}


#: The largest workflow file read: far above any written by hand or
#: generated with a literal list of 100,000 items, far below what would
#: hold the machine's memory.
MAX_WORKFLOW_BYTES = 64 << 20


def load_spec(path: Path) -> Spec:
    return load_workflow(_workflow_bytes(path), str(path))


def _workflow_bytes(path: Path) -> bytes:
    """The file's bytes. A device or a socket (``/dev/zero``, ``/dev/stdin``
    from a terminal) is refused before it is read, as its reading could
    block or never end, and so is a file larger than ``MAX_WORKFLOW_BYTES``.
    A pipe is read (``stockade run <(generate)``), and one with no writer
    reads as empty."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied") from None
    except OSError as e:
        raise UserError(f"{path}: cannot open: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise UserError(f"{path}: is a directory, not a workflow file")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise UserError(f"{path}: not a file but a device or a socket; a workflow is "
                            "read from a file (or a pipe)")
        os.set_blocking(fd, True)
        try:
            data = f.read(MAX_WORKFLOW_BYTES + 1)
        except OSError as e:
            raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if len(data) > MAX_WORKFLOW_BYTES:
        raise UserError(f"{path}: larger than {MAX_WORKFLOW_BYTES >> 20} MiB; a workflow this "
                        "large is not one written or generated for stockade")
    return data


def secret_masker(spec: Spec, env: Mapping[str, str]) -> Masker:
    """Masks the value of every secret the workflow declares (and every notify secret)."""
    names = {*spec.workflow.secrets, *(h.secret for h in spec.workflow.notify if h.secret)}
    return Masker(env[n] for n in names if n in env)
