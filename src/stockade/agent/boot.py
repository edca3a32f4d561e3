"""The jail's second boot stage: serve the shipped modules, then run the loop.

The jail's command line (``ship.BOOT``) names no path: it reads one frame
from fd 3, its already-connected broker socket, and calls ``main`` from it.
The frame (``ship.image``) carries this module, the jail's modules (code
objects, or source for another interpreter) and the item's config, so the
jail's code and config never sit in a file another process could read or
replace. ``main`` serves those modules from memory through a meta path finder
and hands the socket to ``stockade.agent.jail.serve``.

Sent to the jail as code: standard library only, and as little of it as
possible (it runs at every agent start).
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import socket
    from importlib.abc import Loader
    from types import CodeType, ModuleType


class ShippedModules:
    """A meta path finder and loader for the modules the image carries."""

    def __init__(self, modules: dict[str, tuple[bool, CodeType | str]]) -> None:
        #: module name -> (is a package, code object or source)
        self._modules = modules

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        entry = self._modules.get(name)
        if entry is None:
            return None
        # A Loader by protocol; importing importlib.abc would cost the jail's start.
        return ModuleSpec(name, cast("Loader", self), origin="stockade image", is_package=entry[0])

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        _package, code = self._modules[module.__name__]
        if isinstance(code, str):
            code = compile(code, f"<stockade>/{module.__name__}", "exec", dont_inherit=True)
        exec(code, module.__dict__)


def main(sock: socket.socket, image: dict[str, Any]) -> int:
    # Nothing the jail may start later inherits the broker connection.
    sock.set_inheritable(False)
    sys.meta_path.insert(0, ShippedModules(image["modules"]))
    from stockade.agent.jail import serve

    return serve(sock, image["config"])
