"""Each ``run:`` step's toolchain on this machine: its mounts and its image.

Resolved once when a run starts or resumes (``resolve``), after preflight
and the sandbox choice, before anything is created: every ``mounts:`` path
(the workflow's, then the step's) made absolute (relative ones from the
workflow's folder) and real, a venv's base interpreter added as an implied
mount where the jail would not see it otherwise (a pyenv build under
``/root``), each fingerprinted (``sandbox.toolchain``); the ``image:``
opened (an OCI or docker image unpacked once under ``<root>/images``).
Problems are ``FILE:LINE:COL`` errors: a mount holding the run root (the
jail would read every item's records), a ``bin/`` symlink that would lead
out of the jail, an image the backend cannot use or that cannot be read.

The result enters the manifest (``to_json``), each item's reuse key
(``key``) and each attempt's policy (``mounts_for``, ``path_for``).

Reads the disk; must not import the engine or the CLI.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stockade.errors import Problem, UserError
from stockade.sandbox.base import Backend
from stockade.sandbox.policy import SYSTEM_DIRS, ExtraMount
from stockade.sandbox.toolchain import fingerprint, needs_of, within
from stockade.spec import Spec

if TYPE_CHECKING:  # imported by the steps that have an image: (tarfile, gzip, layers)
    from stockade.sandbox.image import Image

#: Where unpacked images live under the root.
IMAGES = "images"


@dataclass(frozen=True)
class MountUse:
    """A folder shown read-only in the jail: ``path`` (resolved) and, when the
    workflow named it through a symlink, also at ``declared``."""

    path: str
    declared: str
    fingerprint: str
    entries: int
    #: The mount whose venv runs an interpreter from here (an implied mount).
    implied_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "fingerprint": self.fingerprint,
                               "entries": self.entries}
        if self.declared != self.path:
            out["declared"] = self.declared
        if self.implied_by is not None:
            out["implied_by"] = self.implied_by
        return out


@dataclass(frozen=True)
class Toolchain:
    mounts: tuple[MountUse, ...] = ()
    image: Image | None = None

    def __bool__(self) -> bool:
        return bool(self.mounts or self.image)

    @cached_property
    def bins(self) -> tuple[str, ...]:
        """The declared mounts' ``bin/`` folders (by their resolved paths, which
        every backend shows), in PATH order. Looked for once per run, as the
        mounts were fingerprinted once: not a stat per mount per item."""
        return tuple(f"{m.path}/bin" for m in self.mounts
                     if m.implied_by is None and os.path.isdir(f"{m.path}/bin"))

    def path_for(self, path: str) -> str:
        """``PATH`` with the mounts' ``bin/`` first; under an image, the image's
        own ``PATH`` instead of the host's (``path``)."""
        base = self.image.path if self.image is not None else path
        bins = self.bins
        rest = [p for p in base.split(":") if p and p not in bins]
        return ":".join([*bins, *rest])

    def mounts_for(self, remaps: bool) -> tuple[ExtraMount, ...]:
        """The policy's read-only mounts; ``remaps``: the backend can show a
        folder at another path too (the declared one, where it differs)."""
        out = []
        for m in self.mounts:
            out.append(ExtraMount(Path(m.path), m.path))
            if remaps and m.declared != m.path:
                out.append(ExtraMount(Path(m.path), m.declared))
        return tuple(out)

    def key(self) -> dict[str, Any]:
        """What enters an item's reuse key (nothing when there is no toolchain)."""
        out: dict[str, Any] = {}
        if self.mounts:
            out["mounts"] = [[m.declared, m.path, m.fingerprint] for m in self.mounts]
        if self.image is not None:
            out["image"] = self.image.digest
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mounts": [m.to_json() for m in self.mounts]}
        if self.image is not None:
            out["image"] = self.image.to_json()
        return out


@dataclass
class _Resolver:
    spec: Spec
    base: Path
    root: Path
    echo: Callable[[str], None]
    problems: list[Problem] = field(default_factory=list)
    prints: dict[str, tuple[str, int]] = field(default_factory=dict)

    def add(self, path: tuple[str | int, ...], message: str) -> None:
        line, col = self.spec.position(*path)
        self.problems.append(Problem(self.spec.filename, line, col, message))

    def absolute(self, declared: str) -> str:
        return os.path.normpath(declared if declared.startswith("/") else self.base / declared)

    def fingerprint(self, path: str) -> tuple[str, int]:
        hit = self.prints.get(path)
        if hit is None:
            fp = fingerprint(path)
            hit = self.prints[path] = (fp.digest, fp.entries)
        return hit

    def mount(self, at: tuple[str | int, ...], declared: str) -> MountUse | None:
        absolute = self.absolute(declared)
        real = os.path.realpath(absolute)
        root = str(self.root)
        if within(root, real) or within(real, root):
            self.add(at, f"mounts: {declared} holds the stockade root {root} (or lies in it): "
                         "the jail would read every item's records; mount the toolchain's own "
                         "folder, or keep the root elsewhere (--root, STOCKADE_HOME)")
            return None
        try:
            digest, entries = self.fingerprint(real)
        except OSError as exc:
            self.add(at, f"mounts: {declared}: {exc.strerror} ({real})")
            return None
        return MountUse(real, absolute, digest, entries)

    def step(self, i: int) -> Toolchain:
        step = self.spec.workflow.steps[i]
        # The step's own mounts first: they come first on PATH.
        declared: list[tuple[tuple[str | int, ...], str]] = [
            (("steps", i, "mounts", j), m) for j, m in enumerate(step.mounts)]
        declared += [(("mounts", j), m) for j, m in enumerate(self.spec.workflow.mounts)]
        mounts: list[MountUse] = []
        where: dict[str, tuple[str | int, ...]] = {}
        for at, text in declared:
            use = self.mount(at, text)
            if use is not None and use.path not in where:
                mounts.append(use)
                where[use.path] = at
        image = self.image(i) if step.image is not None else None
        visible = [] if image is not None else list(SYSTEM_DIRS)
        implied, outside = needs_of([m.path for m in mounts], visible)
        for prefix, owner in implied:
            digest, entries = self.fingerprint(prefix)
            mounts.append(MountUse(prefix, prefix, digest, entries, implied_by=owner))
        for o in outside:
            top = next((p for p in where if within(o.link, p)), "")
            self.add(where.get(top, ("steps", i, "mounts")),
                     f"mounts: {o.link} -> {o.target}, which the jail would not see"
                     + (" (the step's image: has its own /usr, not the host's)"
                        if image is not None else "")
                     + f"; add the folder holding {o.target} to mounts:")
        return Toolchain(tuple(mounts), image)

    def image(self, i: int) -> Image | None:
        step = self.spec.workflow.steps[i]
        assert step.image is not None
        source = os.path.realpath(self.absolute(step.image))

        def progress(text: str) -> None:
            self.echo(f"{step.id}: unpacking image {step.image}: {text}")

        from stockade.sandbox.image import ImageError, open_image

        try:
            return open_image(source, self.root / IMAGES, progress)
        except ImageError as exc:
            self.add(("steps", i, "image"), f"image: {exc}")
        except OSError as exc:
            self.add(("steps", i, "image"), f"image: {step.image}: {exc.strerror or exc}")
        return None


def declared(spec: Spec) -> list[str]:
    """The ``run:`` steps that declare a toolchain (``mounts:``, theirs or the
    workflow's, or ``image:``), without looking at any path."""
    return [s.id for s in spec.workflow.steps
            if s.kind == "run" and (s.mounts or spec.workflow.mounts or s.image)]


def resolve(spec: Spec, base: Path, root: Path, backend: type[Backend],
            echo: Callable[[str], None]) -> dict[str, Toolchain]:
    """Every ``run:`` step's toolchain (those with none are left out); a
    ``UserError`` lists every problem, located."""
    r = _Resolver(spec, base, root, echo)
    out: dict[str, Toolchain] = {}
    wanted = set(declared(spec))
    for i, step in enumerate(spec.workflow.steps):
        if step.id not in wanted:
            continue
        if step.image is not None:
            if not backend.mount_namespace:
                r.add(("steps", i, "image"),
                      f"image: the {backend.name} backend cannot give a step another root filesystem "
                      "(it has no mount namespace); image: needs the bwrap backend "
                      "(apt-get install bubblewrap, or --sandbox bwrap)")
                continue
            if isinstance(step.network, list):
                r.add(("steps", i, "network"),
                      "network: a list of hosts goes through a relay that runs the host's "
                      "python3, which a step with image: does not have; use none or open")
                continue
        tc = r.step(i)
        if tc:
            out[step.id] = tc
    if r.problems:
        raise UserError(problems=sorted(r.problems, key=lambda p: (p.line, p.col)))
    for sid, tc in out.items():
        implied = [f"{m.path} (for {m.implied_by})" for m in tc.mounts if m.implied_by]
        if implied:
            echo(f"{sid}: also mounting, read-only, what its venv runs: {', '.join(implied)}")
    return out


def changed(before: Mapping[str, Any], now: Mapping[str, Toolchain]) -> list[str]:
    """Toolchain folders or images that differ from a manifest's record (for resume)."""
    out = []
    for sid, tc in now.items():
        old = before.get(sid) or {}
        was = {m.get("path"): m.get("fingerprint") for m in old.get("mounts", [])}
        for m in tc.mounts:
            if was.get(m.path) not in (None, m.fingerprint):
                out.append(f"{sid}: mounts {m.path}")
        image = old.get("image") or {}
        if tc.image is not None and image.get("digest") not in (None, tc.image.digest):
            out.append(f"{sid}: image {tc.image.source}")
    return out
