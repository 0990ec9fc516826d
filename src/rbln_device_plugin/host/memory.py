"""Giving the C heap that start-up freed back to the system.

Start-up (imports, the first scan's listing and tables, the servers' set-up) frees much
of what it allocated, but glibc keeps freed heap pages mapped for reuse: about 0.8 MiB
of the idle daemon's resident memory. ``malloc_trim`` returns every whole free page.
"""

from __future__ import annotations

import ctypes


def release_free_heap() -> bool:
    """``malloc_trim(0)`` where the C library has it (glibc); False where it does not."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # musl and other C libraries: nothing to do
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True
