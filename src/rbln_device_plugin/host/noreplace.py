"""Rename an entry within one directory without ever replacing what is at the new name.

``rename(2)`` silently replaces a file or an empty directory at the new name (lost), and
fails on a non-empty directory. ``renameat2(RENAME_NOREPLACE)`` fails with EEXIST
instead, atomically. Python has no binding for it, so it is resolved from the libc the
interpreter is linked against (as ``inotify`` does: no ``find_library``, which runs
programs). Where libc has no ``renameat2`` (glibc before 2.28) or the kernel or file
system refuses the flag (ENOSYS, EINVAL), a look with ``lstat`` followed by a plain
rename stands in: correct unless an entry appears at the new name between the two, which
only a writer racing the daemon for a name it has just chosen can cause.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from typing import Final

RENAME_NOREPLACE: Final = 1
# What a plain rename says when something is already at the new name: a non-empty
# directory (ENOTEMPTY, EEXIST), or an entry of the other kind (EISDIR, ENOTDIR).
_OCCUPIED: Final = frozenset({errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR})
_UNSUPPORTED: Final = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})

_Renameat2 = Callable[[int, bytes, int, bytes, int], int]
_renameat2: _Renameat2 | None = None
_resolved = False
# Set once the kernel or a file system refused the flag: the fallback from then on.
_refused = False


def _function() -> _Renameat2 | None:
    global _renameat2, _resolved
    if not _resolved:
        _resolved = True
        try:
            function = ctypes.CDLL(None, use_errno=True).renameat2
        except (AttributeError, OSError):
            return None
        function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                             ctypes.c_uint)  # fmt: skip
        function.restype = ctypes.c_int
        _renameat2 = function
    return _renameat2


def rename_noreplace(dir_fd: int, old: str, new: str) -> None:
    """Rename ``old`` to ``new``, both names inside the directory ``dir_fd``.

    FileExistsError when something is at ``new`` already (nothing changes then);
    FileNotFoundError when ``old`` has gone; any other OSError as the kernel says it.
    """
    global _refused
    function = None if _refused else _function()
    if function is not None:
        if function(dir_fd, os.fsencode(old), dir_fd, os.fsencode(new), RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code not in _UNSUPPORTED:
            raise _error(code, new if code == errno.EEXIST else old)
        _refused = True
    _checked_rename(dir_fd, old, new)


def _checked_rename(dir_fd: int, old: str, new: str) -> None:
    try:
        os.stat(new, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        raise _error(errno.EEXIST, new)
    try:
        os.rename(old, new, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _OCCUPIED:
            raise _error(errno.EEXIST, new) from None
        raise


def _error(code: int, name: str) -> OSError:
    exc_type = {errno.EEXIST: FileExistsError, errno.ENOENT: FileNotFoundError}.get(code, OSError)
    return exc_type(code, os.strerror(code), name)
