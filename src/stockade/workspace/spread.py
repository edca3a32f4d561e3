"""Ask the filesystem to spread a folder's subfolders apart (ext4's Orlov hint).

Why: ext4 places a new folder near its parent, and on an ext4 without a
journal, every new inode's search starts at the front of its block group and
passes over, one check each, every free inode there that was removed in the
last half minute (``recently_deleted`` in ``fs/ext4/ialloc.c``; five and a
half minutes while its inode table block is still dirty). A run's item folders are created
where the last run's were just removed, so each ``mkdir`` walked past
thousands of them: 1,000 items of four folders and a file took 2.0 s, then
2.2, 3.2, 3.7, 4.1, 4.3 and 4.8 s as the removed ones piled up, against
0.41-0.51 s when their parent had the flag (alternating rounds, each tree
removed after its round).

``FS_TOPDIR_FL`` (``chattr +T``) marks a folder whose subfolders are unrelated
trees: ext4 then places each one in a group with few folders, away from
the rest, and everything inside an item stays near its item. The flag is
not inherited, so only the folder it is set on spreads its children. It is
a hint: tmpfs refuses it, and nothing changes but speed (overlayfs passes it
to an ext4 upper layer; both were tried; XFS's and btrfs's code accept no
such flag, which was read, not tried).

Must not import the runner, the sandbox or the CLI.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys


def _ioc(direction: int, number: int, long_size: int = struct.calcsize("l")) -> int:
    """``_IOR``/``_IOW('f', number, long)`` of ``linux/fs.h``, for a ``long`` of
    ``long_size`` bytes (this platform's unless told)."""
    return (direction << 30) | (long_size << 16) | (ord("f") << 8) | number


#: Declared with ``long``, though the kernel reads and writes an ``int`` through them.
FS_IOC_GETFLAGS = _ioc(2, 1)
FS_IOC_SETFLAGS = _ioc(1, 2)
FS_TOPDIR_FL = 0x00020000


def make_spread_folder(path: str, mode: int = 0o777) -> bool:
    """Make the folder ``path`` (and any missing parents) to hold unrelated
    trees, and spread it if this call made it; whether this call made it.

    A folder that already exists is left as it is, flag or no flag: the flag
    only changes where folders made after it go, and setting it once, where
    the folder is made, keeps the ioctl off every later caller's path.
    """
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return False
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            return False
    spread_subfolders(path)
    return True


def spread_subfolders(path: str) -> bool:
    """Set ``FS_TOPDIR_FL`` on the folder ``path``; whether it is set now.

    Best effort: any refusal (another filesystem, another owner, not Linux)
    returns False and changes nothing.
    """
    return _topdir(path, set_=True)


def is_spread(path: str) -> bool:
    """Whether the folder ``path`` has ``FS_TOPDIR_FL``; False wherever its
    flags cannot be read."""
    return _topdir(path, set_=False)


def _topdir(path: str, *, set_: bool) -> bool:
    """The folder's ``FS_TOPDIR_FL`` (set first if ``set_``), never through a link."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        flags = inode_flags(fd)
        if set_ and not flags & FS_TOPDIR_FL:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags | FS_TOPDIR_FL))
            flags = inode_flags(fd)
        return bool(flags & FS_TOPDIR_FL)
    except OSError:
        return False
    finally:
        os.close(fd)


def inode_flags(fd: int) -> int:
    """The ``FS_*_FL`` flags of the open file ``fd`` (``OSError`` where there are none)."""
    (flags,) = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("i", 0)))
    return int(flags)
