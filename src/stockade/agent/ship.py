"""What an agent's jail starts from: a command line naming no path, and an image.

The jail gets its broker connection as an inherited, already-connected socket
at fd ``BROKER_FD``. ``BOOT`` (its ``python -c`` program) reads one frame from
it: ``image(config)``, eight bytes of length and a marshalled dict with the
boot stage (``stockade.agent.boot``), the jail's stdlib-only modules and the
item's config (prompt, tools, writes, max_turns). So the jail needs no file of
the engine's: no copy of its code and no config file that another local user
or a sibling jail could read, replace or find by name, and ``/proc/PID/cmdline``
shows only the interpreter and ``BOOT``.

The modules travel as code objects when the jail's interpreter reads the
engine's bytecode (the same magic number, as for a .pyc: loading them then
costs what loading .pyc files does), as source for any other interpreter
(compiled in the jail, some ms more).

Must not import the runner, workspace or cli.
"""

from __future__ import annotations

import functools
import importlib.util
import marshal
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import CodeType
from typing import Any

#: Where the jail finds its broker connection (the first of ``Policy.pass_fds``).
BROKER_FD = 3

#: The jail's whole program on its command line: read the image, run its boot.
BOOT = (
    "import marshal,socket\n"
    f"s=socket.socket(fileno={BROKER_FD})\n"
    "h=s.recv(8,socket.MSG_WAITALL)\n"
    "n=int.from_bytes(h,'big') if len(h)==8 else -1\n"
    "b=bytearray()\n"
    "while 0<=len(b)<n:\n"
    " c=s.recv(min(n-len(b),1<<20))\n"
    " if not c:break\n"
    " b+=c\n"
    "if n<0 or len(b)!=n:raise SystemExit('agent: the broker connection closed during the start')\n"
    "d=marshal.loads(b)\n"
    "g={'__name__':'stockade.agent.boot'}\n"
    "exec(d['boot'],g)\n"
    "raise SystemExit(g['main'](s,d))\n"
)

#: (module, file in stockade/agent/ or None for the package stub, is a package)
JAIL_MODULES: tuple[tuple[str, str | None, bool], ...] = (
    ("stockade", None, True),
    ("stockade.agent", "__init__.py", True),
    ("stockade.agent.fs", "fs.py", False),
    ("stockade.agent.guard", "guard.py", False),
    ("stockade.agent.jail", "jail.py", False),
    ("stockade.agent.loop", "loop.py", False),
    ("stockade.agent.patch", "patch.py", False),
    ("stockade.agent.tools", "tools.py", False),
)
_PACKAGE_STUB = '"""stockade, as the agent jail sees it: only stockade.agent\'s jail side."""\n'
#: Readable by every interpreter the jail may run (3.10 and later).
_PORTABLE_MARSHAL = 4


@functools.cache
def reads_our_bytecode(exe: str) -> bool:
    """Whether interpreter ``exe`` loads this interpreter's code objects (asked once)."""
    if exe == os.path.realpath(sys.executable):
        return True
    probe = "import importlib.util,sys;sys.stdout.write(importlib.util.MAGIC_NUMBER.hex())"
    try:
        r = subprocess.run([exe, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.stdout.strip() == importlib.util.MAGIC_NUMBER.hex()


def _compile(src: str, name: str, code: bool) -> CodeType | str:
    if not code:
        return src
    return compile(src, f"<stockade>/{name}", "exec", dont_inherit=True)


@functools.cache
def _parts(code: bool) -> tuple[CodeType | str, dict[str, tuple[bool, CodeType | str]]]:
    """The boot stage and the jail's modules, read and compiled once per engine process."""
    here = Path(__file__).resolve().parent
    boot = _compile((here / "boot.py").read_text(encoding="utf-8"), "stockade.agent.boot", code)
    modules: dict[str, tuple[bool, CodeType | str]] = {}
    for name, file, package in JAIL_MODULES:
        src = _PACKAGE_STUB if file is None else (here / file).read_text(encoding="utf-8")
        modules[name] = (package, _compile(src, name, code))
    return boot, modules


def image(config: Mapping[str, Any], *, code: bool) -> bytes:
    """The frame ``BOOT`` reads: length, then the marshalled boot, modules and config.

    ``code``: the jail's interpreter ``reads_our_bytecode``, so code objects
    load as is; otherwise the modules go as source, in a marshal format any
    version reads.
    """
    boot, modules = _parts(code)
    payload = {"boot": boot, "modules": modules, "config": dict(config)}
    blob = marshal.dumps(payload) if code else marshal.dumps(payload, _PORTABLE_MARSHAL)
    return len(blob).to_bytes(8, "big") + blob
