"""The write guard: which paths an agent may read and write, decided before any I/O.

Every rule here is a pure function of strings, except ``resolve_inside`` which
asks the file system where a path really leads (symlinks). The jail runs these
checks before a tool acts; the host broker runs them again before it allows a
write, so a bug on one side is not enough to write somewhere unasked.

Imports only the standard library.
"""

from __future__ import annotations

import os
import posixpath
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path


class PathRejected(ValueError):
    """A tool path that must not be used; the message is shown to the model."""


_PROMPT_TRIM = ".,;:!?()[]{}<>\"'`*"

#: Bidirectional text controls: they reorder what a terminal shows
#: (``out/\u202egpj.sh`` reads as ``out/hs.jpg``).
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
#: Characters a name part of a ``writes`` glob may match: never a control,
#: a bidi control or a line separator, whatever the pattern says.
_NAME_CHAR = r"[^/\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]"


def unprintable(text: str) -> str | None:
    """Why ``text`` cannot name a file an agent writes, or None.

    A carriage return or an escape sequence rewrites the terminal line that
    echoes the target or asks for approval; a newline forges sections of the
    handed-out diff; a bidi control shows the name in another order. So C0
    and C1 controls, DEL, format characters (category Cf, bidi controls
    among them), line and paragraph separators and lone surrogates are out.
    """
    for c in text:
        cat = unicodedata.category(c)
        if cat == "Cc":
            kind = "a control character"
        elif c in _BIDI:
            kind = "a bidirectional text control"
        elif cat == "Cf":
            kind = "an invisible format character"
        elif cat in ("Zl", "Zp"):
            kind = "a line or paragraph separator"
        elif cat == "Cs":
            kind = "an unpaired surrogate"
        else:
            continue
        return (f"the path contains {kind} (U+{ord(c):04X}); name files with printable "
                "characters. Nothing was written")
    return None


def normalise(raw: object, *, allow_root: bool = False) -> str:
    """A work-relative POSIX path, or ``PathRejected``.

    No absolute paths, no ``~``, no ``..`` anywhere (even ones that would
    cancel out), no backslashes, no NUL nor any character ``unprintable``
    names. ``allow_root`` admits ``.`` (for
    ``list_dir``); write targets always name a file below the root.
    """
    if not isinstance(raw, str):
        raise PathRejected("path must be a string")
    if raw.strip() != raw or not raw:
        raise PathRejected("path must be a non-empty string without surrounding spaces")
    if "\x00" in raw or "\\" in raw:
        raise PathRejected(f"path {raw!r} contains a NUL or a backslash")
    why = unprintable(raw)
    if why:
        raise PathRejected(why)
    if raw.startswith(("/", "~")):
        raise PathRejected(f"absolute paths are forbidden: {raw!r}; use a path relative to the work directory")
    parts = raw.split("/")
    if ".." in parts:
        raise PathRejected(f"parent traversal is forbidden: {raw!r}")
    norm = posixpath.normpath(raw)
    if norm == ".":
        if allow_root:
            return "."
        raise PathRejected("path must name a file, not the work directory")
    return norm


def resolve_inside(root: Path, rel: str) -> Path:
    """The host path of ``rel`` under ``root``, refusing any symlink escape.

    The deepest existing ancestor is resolved (following symlinks) and must
    stay inside ``root``; a final component that is itself a symlink is
    refused outright for writes by the callers that open with ``O_NOFOLLOW``.
    """
    real_root = root.resolve()
    candidate = real_root / rel
    resolved = candidate.resolve()
    if resolved != real_root and real_root not in resolved.parents:
        raise PathRejected(f"path {rel!r} leads outside the work directory")
    return candidate


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Compile a ``writes`` glob: ``**`` spans directories, ``*`` and ``?`` do not.

    No wildcard matches a control or format character (``_NAME_CHAR``).
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append(f"(?:{_NAME_CHAR}+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(f"(?:{_NAME_CHAR}|/)*")
            i += 2
        elif c == "*":
            out.append(f"{_NAME_CHAR}*")
            i += 1
        elif c == "?":
            out.append(_NAME_CHAR)
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


def allowed_by(path: str, writes: Iterable[str]) -> bool:
    """Whether a normalised path matches one of the step's ``writes`` globs."""
    if unprintable(path):
        return False  # whatever a pattern spells out literally
    return any(glob_to_regex(posixpath.normpath(g)).match(path) for g in writes)


def mentions(prompt: str) -> frozenset[str]:
    """The path-like words of the operator's request, normalised.

    A word counts when it contains ``/`` or ``.`` between name characters
    (``billing/utils.py``, ``README.md``). The parser is deliberately plain:
    a target the operator wants patched must be written out in the prompt.
    """
    found: set[str] = set()
    for token in re.split(r"[\s`'\"()\[\]<>,;|]+", prompt):
        token = re.sub(r"(:\d+)+$", "", token.strip(_PROMPT_TRIM))  # billing/utils.py:12
        if token.startswith("./"):
            token = token[2:]
        if not token or not re.search(r"[A-Za-z0-9_-][/.][A-Za-z0-9_-]", token):
            continue
        try:
            found.add(normalise(token))
        except PathRejected:
            continue
    return frozenset(found)


def named_in(path: str, named: frozenset[str]) -> bool:
    """Whether ``path`` was named: exactly, or below one top-level input folder.

    The second form serves coding steps, where a checkout is an input folder
    (``repo/``) and the operator names ``billing/utils.py`` inside it.
    """
    if path in named:
        return True
    _head, sep, rest = path.partition("/")
    return bool(sep) and rest in named


def check_write_target(
    raw: object, *, writes: Iterable[str], prompt: str | None
) -> str:
    """Normalise a write target and check ``writes`` and (for patches) mentions.

    ``prompt`` is ``None`` when the tool does not need mention coupling.
    """
    path = normalise(raw)
    if isinstance(raw, str) and raw.endswith(("/", "/.")):
        raise PathRejected(f"path {raw!r} names a folder; write tools write files: name the file "
                           "inside it. Nothing was written")
    writes = list(writes)
    if not allowed_by(path, writes):
        raise PathRejected(
            f"path {path!r} is not inside the step's allowed writes {writes}; nothing was written"
        )
    if prompt is not None and not named_in(path, mentions(prompt)):
        raise PathRejected(
            f"path {path!r} was not named in the operator's request; only files the request names may be patched"
        )
    return path


#: What Linux file systems take when ``pathconf`` cannot say.
NAME_MAX, PATH_MAX = 255, 4096


def _limit(root: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(root, name)
    except (OSError, ValueError):
        return default
    return value if value > 0 else default


def check_length(root: Path, rel: str) -> None:
    """``PathRejected`` when the file system under ``root`` cannot take the name ``rel``.

    Checked before the write is asked for, so a name too long neither
    reaches the operator nor leaves half a folder chain behind.
    """
    name_max = _limit(root, "PC_NAME_MAX", NAME_MAX)
    for part in rel.split("/"):
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > name_max:
            raise PathRejected(f"file name too long: {part[:24]!r}... has {size} bytes, the file "
                               f"system takes at most {name_max} in one name. Nothing was written")
    path_max = _limit(root, "PC_PATH_MAX", PATH_MAX)
    size = len(str(root.absolute() / rel).encode("utf-8", "surrogateescape"))
    if size >= path_max:
        raise PathRejected(f"file name too long: the path has {size} bytes from the file system's "
                           f"root, which takes fewer than {path_max}. Nothing was written")


def is_symlink_free(root: Path, rel: str) -> bool:
    """True when no component of ``rel`` under ``root`` is a symlink."""
    cur = root
    for part in rel.split("/"):
        cur = cur / part
        if os.path.islink(cur):
            return False
    return True
