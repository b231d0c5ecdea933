"""A guard against a PySide6 6.12.0 bug on Python < 3.12.

PySide6/shiboken6 6.12.0 return `None` from every void method (setText, setVisible, ...) without
taking a reference to it. From Python 3.12 on None is immortal and nothing happens; on 3.11 each
call lowers None's reference count by one, and after some thousands of calls (a few minutes of a
streaming chat) Python aborts with "none_dealloc: deallocating None". pyproject.toml excludes
6.12.0; if it is installed anyway, `guard()` raises None's reference count far out of reach (as
3.12's immortal objects do), so the app cannot crash this way.
"""

from __future__ import annotations

import ctypes
import sys

BROKEN = {"6.12.0"}
_RESERVE = 1 << 40  # references; at one per Qt call this lasts far longer than any session


def guard() -> bool:
    """Apply the workaround when it is needed; True when it was applied."""
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    try:
        import shiboken6
    except ImportError:
        return False
    if getattr(shiboken6, "__version__", "") not in BROKEN or getattr(sys, "_flashdesk_none_guard", False):
        return False
    # ob_refcnt is the first field of every CPython object.
    ctypes.c_ssize_t.from_address(id(None)).value += _RESERVE
    sys._flashdesk_none_guard = True
    return True
