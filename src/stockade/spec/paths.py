"""What a path written in a workflow may be: below the workflow's folder
(``inputs`` names, ``file()``), or a host path to mount (``mounts:``,
``image:``), and which host folders are never a mount.

Pure: no I/O. Must not import workspace, sandbox, runner, agent, publish,
store, web or cli.
"""

from __future__ import annotations


def bad_host_path(path: str) -> str | None:
    """Why ``path`` cannot name a host path for ``mounts:`` or ``image:``, or None.

    Absolute, or relative to the workflow file (``..`` allowed: a toolchain
    often sits next to the project, not in it).
    """
    if not path.strip():
        return "is empty"
    if "\x00" in path:
        return "contains a NUL byte"
    if "{{" in path:
        return "is a template; mounts: and image: are literal paths, checked before the run"
    if path.startswith("~"):
        return "starts with '~', which is not expanded; write the absolute path"
    if "\\" in path:
        return "contains a backslash; use '/'"
    return None


#: Host folders that are interfaces of the kernel or of the host's services,
#: never a toolchain, and what a jail that mounted one would see.
_INTERFACES = {"/proc": "the host's processes and their command lines",
               "/sys": "the host's kernel settings and devices",
               "/dev": "the host's devices", "/run": "the host's service sockets"}


def interface_mount(norm: str) -> tuple[str, str] | None:
    """For a normalised absolute path that is, or lies in, /proc, /sys, /dev or
    /run: that folder and why a jail must not mount it; else None."""
    for top, what in _INTERFACES.items():
        if norm == top or norm.startswith(top + "/"):
            return top, (f"mounted, the jail would see {what}; mount the toolchain's own "
                         "folder (a venv, /opt/tool)")
    return None


def bad_relative(path: str) -> str | None:
    """Why ``path`` cannot name something below the workflow folder, or None."""
    if not path:
        return "is empty"
    if "\x00" in path:
        return "contains a NUL byte"
    if path.startswith("/") or path.startswith("\\") or (len(path) > 1 and path[1] == ":"):
        return "is absolute"
    if "\\" in path:
        return "contains a backslash; use '/'"
    if ".." in path.split("/"):
        return "contains '..'"
    return None
