"""Reuse across runs: an item's key, and taking its outputs from an earlier run.

The key is the sha256 of everything that could change an item's outputs:
the cache format version, the step kind, the rendered command (or the agent
settings with the rendered prompt), each input's name and sha256, the
environment the step gets (the host's allowlisted variables, the step's own
``env``, and ``STOCKADE_STEP``, ``STOCKADE_ITEM`` and ``STOCKADE_ITEM_KEY``;
never the per-run ``STOCKADE_RUN_ID`` or per-attempt ``STOCKADE_ATTEMPT``), an HMAC of each secret
value it receives (keyed with ``<root>/reuse.key``, so the store never holds
a plain hash of a secret), the declared ``outputs``, and the sandbox: backend,
whether it is enforced, ``isolate``, ``network``, ``resources`` and the
step's toolchain (each mount's stat fingerprint, the image's digest).

``decide`` looks the key up in the store's reuse index (newest first) and
takes the first earlier item whose every output still hashes to what was
recorded, by sha256, never by size or mtime; ``place`` puts those outputs in
this run (a reflink where the filesystem has them, else a hard link to a
file made read-only, else a copy) and returns the item's provenance, which
names the earlier item as ``reused_from``. A tampered, missing or unreadable earlier output is never
reused: the item runs, and the store records why (``not_reused``), as it does
for every item a run with reuse on runs.

Must not import the engine or the CLI.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.runner.attempt import ITEM_ERRORS, Attempt, Outcome
from stockade.runner.status import AttemptStatus
from stockade.spec.model import Step
from stockade.store.base import ReuseCandidate, Store
from stockade.workspace.artifacts import (
    Artifact,
    HostFile,
    HostTree,
    Output,
    input_bytes,
    outputs_problem,
)
from stockade.workspace.layout import RunDir
from stockade.workspace.records import InputRecord, OutputRecord, Provenance, SandboxUse

#: Bump when what goes into a key changes: every earlier key stops matching.
CACHE_FORMAT = 3
#: What the jail's environment holds that is not keyed. The run id differs in
#: every run and the attempt number differs between the engine's lookup (the
#: first attempt) and an item that succeeded on a retry: keyed, neither would
#: ever be reused. HOME and TMPDIR are the jail's own folders. A command that
#: prints one of these is reused with the value of the run that made it.
UNKEYED_ENV = frozenset({"STOCKADE_RUN_ID", "STOCKADE_ATTEMPT", "HOME", "TMPDIR"})
KEY_FILE = "reuse.key"
#: ioctl(FICLONE): a copy-on-write clone on btrfs, XFS and others.
FICLONE = 0x40049409
#: Why an item ran, as ``show`` gives it: one string shared by every such item.
NO_MATCH = "no earlier item with the same inputs, command, environment and sandbox"
UNKEYED = "its inputs, env or command could not be rendered, so it has no reuse key"


def unseen_reads(step: Step) -> str | None:
    """What lets ``step`` read what the engine never sees, and so cannot key; None: nothing."""
    if not step.isolate:
        return "isolate: false lets it read the host's files"
    if step.network == "open":
        return "network: open lets it read from the network"
    if step.network != "none":
        return "network: lets it read from the hosts it lists"
    return None


def not_reused_because(step: Step) -> str | None:
    """Why ``step``'s items are never taken from earlier runs, even in a run with
    reuse on; None: they may be."""
    if step.kind in ("publish", "keep"):
        return f"{step.kind}: steps are never reused"
    if step.reuse is not None:
        # An explicit ``reuse: true`` is the user's word that what the step
        # reads beyond its inputs does not change its outputs.
        return None if step.reuse else "reuse: false on this step"
    unseen = unseen_reads(step)
    if unseen:
        return f"reuse is off for this step: {unseen} (reuse: true on the step allows it)"
    if step.kind == "agent":
        return "reuse is off for agent: steps unless the step says reuse: true"
    return None


def secret_key(root: Path) -> bytes:
    """The root's HMAC key for secret values (made once, 0600, never in the store)."""
    path = root / KEY_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    root.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


@dataclass(frozen=True)
class InputDigest:
    name: str
    sha256: str
    size: int
    source: Mapping[str, Any]


def input_digest(name: str, value: Any, refs: Sequence[str] = ()) -> InputDigest:
    """The sha256 an input will have in ``work/``, without writing it (as ``materialise``
    would hash it), and where it comes from."""
    more: dict[str, Any] = {"refs": list(refs)} if refs else {}
    if isinstance(value, Artifact):
        return InputDigest(name, value.sha256, value.size,
                           {"kind": "artifact", **value.ref(), **more})
    if isinstance(value, HostFile):
        return InputDigest(name, value.sha256, -1, {"kind": "file", "path": value.rel, **more})
    if isinstance(value, HostTree):
        return InputDigest(name, value.sha256, len(value.files),
                           {"kind": "tree", "path": value.rel, **more})
    data, kind = input_bytes(value)
    return InputDigest(name, hashlib.sha256(data).hexdigest(), len(data), {"kind": kind, **more})


#: Built once: ``json.dumps`` with options makes an encoder per call, a
#: measurable part of keying 10,000 items.
_dumps = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str).encode


def _static_part(attempt: Attempt) -> str:
    step, run = attempt.step, attempt.run
    hit = run.key_statics.get(step.id)
    if hit is not None:
        return hit
    sandbox = {
        "backend": attempt.backend.name, "enforced": attempt.enforced, "isolate": step.isolate,
        "network": step.network, "resources": step.resources.model_dump(),
    }
    toolchain = run.toolchains.get(step.id)
    if toolchain:
        # Each mount's fingerprint and the image's digest (absent without any,
        # so the keys of steps without a toolchain stay as they were).
        sandbox["toolchain"] = toolchain.key()
    static = _dumps({"format": CACHE_FORMAT, "kind": step.kind,
                     "outputs": sorted(step.outputs), "sandbox": sandbox})
    run.key_statics[step.id] = static
    return static


def key_for(attempt: Attempt, inputs: Sequence[tuple[str, str]], env: Mapping[str, str],
            action: Any) -> str:
    """An item's key from its inputs ``(name, sha256)``, built environment and action:
    a sha256 over the step's fixed part (format, kind, outputs, sandbox; the
    same for all its items) and the item's own.

    The engine (deciding reuse) and the worker (indexing what ran) both call
    this with the same parts, so an item that ran is found by the next run.
    """
    step, run = attempt.step, attempt.run
    secret_names = [s for s in step.secrets if s in run.secrets_allowed]
    # The item's step, index and key are keyed: a command that reads them
    # makes other outputs for another item.
    plain = {k: v for k, v in env.items() if k not in UNKEYED_ENV and k not in secret_names}
    # A secret's value enters only as an HMAC keyed with the root's own key.
    hashed = {n: hmac.new(run.reuse_secret, env[n].encode(), hashlib.sha256).hexdigest()
              for n in secret_names if n in env}
    own = _dumps({"action": action, "inputs": sorted(inputs), "env": plain, "secrets": hashed})
    return hashlib.sha256(f"{_static_part(attempt)}\n{own}".encode()).hexdigest()


def unverified(candidate: ReuseCandidate) -> str | None:
    """Why a recorded output of the earlier item no longer stands, or None: each is
    there and hashes as recorded."""
    out = RunDir(Path(candidate.root), candidate.run_id).item(candidate.step, candidate.item).out
    why = outputs_problem(out, ((o.name, o.sha256, o.size) for o in candidate.outputs))
    return None if why is None else f"its {why}"


def decide(candidates: Sequence[ReuseCandidate]) -> ReuseCandidate | str:
    """The newest earlier item whose outputs still verify, or why the newest does not
    (the item runs)."""
    first = None
    for c in candidates:
        why = unverified(c)
        if why is None:
            return c
        first = first or f"an earlier item matched (run {c.run_id}, {c.step}/#{c.item}) but {why}"
    return first or NO_MATCH


def _link_or_copy(src: Path, dst: Path) -> str:
    """Place ``src`` at ``dst`` without a copy where possible; say how."""
    sfd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o444)
        try:
            try:
                fcntl.ioctl(dfd, FICLONE, sfd)
                return "reflink"
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY,
                                     errno.EBADF, errno.ENOSYS):
                    raise
        finally:
            os.close(dfd)
        os.unlink(dst)
        # A hard link shares the inode: make it read-only for everyone but the
        # engine first, so no jail can change what both runs point at.
        st = os.fstat(sfd)
        if os.geteuid() in (0, st.st_uid):
            if st.st_uid != os.geteuid():
                os.fchown(sfd, os.geteuid(), -1)
            os.fchmod(sfd, stat.S_IMODE(st.st_mode) & ~0o222)
            try:
                os.link(src, dst, follow_symlinks=False)
                return "hardlink"
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o444)
        with os.fdopen(dfd, "wb") as out, os.fdopen(os.dup(sfd), "rb") as inp:
            shutil.copyfileobj(inp, out, 1 << 20)
        return "copy"
    finally:
        os.close(sfd)


def place(attempt: Attempt, candidate: ReuseCandidate, inputs: Sequence[InputDigest],
          now: float) -> dict[str, Any]:
    """Put the earlier item's outputs into this run's ``work/out/``; return the
    provenance record (it names the earlier item as ``reused_from``).

    Only the item's folder, ``work/`` and ``out/`` are created: nothing ran, so
    there are no captures, and the records go to the store.
    """
    src_out = RunDir(Path(candidate.root), candidate.run_id).item(candidate.step,
                                                                   candidate.item).out
    out = attempt.dirs.out
    attempt.dirs.make_folder()
    os.makedirs(out)
    for o in candidate.outputs:
        dst = out / o.name
        if "/" in o.name:
            dst.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(src_out / o.name, dst)
    origin = {"run_id": candidate.run_id, "step": candidate.step, "item": candidate.item,
              "attempt": candidate.attempt}
    run, step = attempt.run, attempt.step
    backend, enforced = attempt.backend.name, attempt.enforced
    return Provenance(
        run_id=run.run_id, step=step.id, item=attempt.item.index, key=attempt.item.key,
        attempt=attempt.number, status="succeeded",
        message=f"reused from run {candidate.run_id}", started_at=now, ended_at=now,
        sandbox=SandboxUse(backend, enforced, step.isolate),
        inputs=tuple(InputRecord(i.name, i.sha256, i.size, run.masker.value(dict(i.source)))
                     for i in inputs),
        outputs=tuple(OutputRecord(
            name=o.name, sha256=o.sha256, size=o.size, run_id=run.run_id, step=step.id,
            item=attempt.item.index, key=attempt.item.key, attempt=attempt.number,
            sandbox=backend, enforced=enforced, reused_from={**origin, "sha256": o.sha256})
            for o in candidate.outputs),
        reused_from=origin,
    ).to_json()


@dataclass
class Keyed:
    """An item's reuse key, what its inputs hash to, and the earlier items with the key."""

    key: str | None = None
    digests: list[InputDigest] = field(default_factory=list)
    candidates: list[ReuseCandidate] = field(default_factory=list)


def lookup(attempts: Sequence[Attempt], store: Store, run_id: str) -> list[Keyed]:
    """Key each attempt's item (as its worker would) and find earlier items in one query.

    An item whose templates fail to render gets no key: it runs and reports the error.
    """
    from stockade.runner.kinds import kind_of
    from stockade.runner.kinds.process import render_inputs, step_environment, template_refs

    out: list[Keyed] = []
    refs: dict[str, dict[str, list[str]]] = {}  # per step: what each input is computed from
    for attempt in attempts:
        step = attempt.step
        if step.id not in refs:
            refs[step.id] = {n: template_refs(t) for n, t in step.inputs.items()}
        try:
            values = render_inputs(attempt)
            env = step_environment(attempt)
            action = kind_of(step).action(attempt)
        except ITEM_ERRORS:
            out.append(Keyed())
            continue
        digests = [input_digest(n, v, refs[step.id][n]) for n, v in values.items()]
        out.append(Keyed(key_for(attempt, [(d.name, d.sha256) for d in digests], env, action),
                         digests))
    by_key = {k.key: k for k in out if k.key}
    # The newest candidate per key: almost always the one taken (``take``
    # asks for older ones only when it no longer verifies).
    for key, cands in store.reuse_candidates(list(by_key), exclude_run=run_id,
                                             limit=1).items():
        by_key[key].candidates = cands
    return out


def take(attempt: Attempt, keyed: Keyed, now: float) -> Outcome | str:
    """The item's outcome taken from the newest earlier item that still verifies, with its
    outputs placed in this run; else why not (the item runs)."""
    chosen = decide(keyed.candidates)
    if isinstance(chosen, str) and keyed.key is not None:
        # The newest no longer verifies (tampered, removed): try the older ones.
        tried = {(c.run_id, c.step, c.item) for c in keyed.candidates}
        older = attempt.run.store.reuse_candidates(
            [keyed.key], exclude_run=attempt.run.run_id).get(keyed.key, [])
        rest = [c for c in older if (c.run_id, c.step, c.item) not in tried]
        if rest and not isinstance(found := decide(rest), str):
            chosen = found
    if isinstance(chosen, str):
        # The newest candidate's reason: the one a user would look at first.
        return chosen
    record = place(attempt, chosen, keyed.digests, now)
    origin = {"run_id": chosen.run_id, "step": chosen.step, "item": chosen.item,
              "attempt": chosen.attempt}
    return Outcome(
        AttemptStatus.SUCCEEDED, attempt.number, result=chosen.result,
        message=f"reused from run {chosen.run_id}", started_at=now, ended_at=now,
        outputs=[Output(o.name, o.sha256, o.size) for o in chosen.outputs],
        reuse_key=keyed.key, reused_from=origin, provenance=record,
    )
