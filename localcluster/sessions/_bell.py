"""A node's bell: a 32-bit word in shared memory that the master rings
(adds one to) for every request it makes of the node, and that the idle
node sleeps on (a Linux futex), so that a run reaches a node with one
system call of the master's and none of its zygote's.

``ring`` adds one and wakes the word's sleeper in one call
(``FUTEX_WAKE_OP``: the add is atomic, so the master may ring from any
of its threads); ``sleep`` returns once the word is no longer the value
the caller saw, it is woken, a signal comes, or ``timeout`` seconds
pass -- never later.  Where futexes cannot be called (not Linux, an
architecture whose system call number is not known here),
`AVAILABLE` is False and the scheduler sends every request through the
zygote instead.
"""

import ctypes
import ctypes.util
import os
import platform

__all__ = ["AVAILABLE", "address_of", "ring", "sleep", "WORDS", "CANCEL",
           "BELL", "POSTS", "WHERE"]

#: a node's control slot (`_handle.ControlWords`): int64 words -- the run
#: id to cancel, the bell (its first 4 bytes, a futex word), how many
#: requests were posted on the board for the node, where the last one is
#: (``offset << 32 | length``)
WORDS, CANCEL, BELL, POSTS, WHERE = 4, 0, 1, 2, 3

#: the futex system call's number, by machine
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98,
              "riscv64": 98, "ppc64le": 221, "ppc64": 221, "s390x": 238,
              "i386": 240, "i686": 240}

_FUTEX_WAIT, _FUTEX_WAKE_OP = 0, 5
#: FUTEX_OP(FUTEX_OP_ADD, 1, FUTEX_OP_CMP_EQ, 0): add one to the word;
#: the second wake-up (of the same word) is never wanted -- its count is 0
_ADD_ONE = (1 << 28) | (0 << 24) | (1 << 12) | 0


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall():
    number = _SYS_FUTEX.get(platform.machine().lower())
    if number is None or not platform.system() == "Linux":
        return None, None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6",
                           use_errno=True)
        call = libc.syscall
    except (OSError, AttributeError):
        return None, None
    call.restype = ctypes.c_long
    return call, number


_call, _NR = _syscall()
AVAILABLE = _call is not None


def address_of(array):
    """The address of the first element of a numpy ``array`` (a word of
    a shared mapping, 4-byte aligned)."""
    address = array.__array_interface__["data"][0]
    if address % 4:
        raise ValueError("a futex word must be 4-byte aligned")
    return address


def ring(address):
    """Add one to the 32-bit word at ``address`` and wake its sleeper."""
    _call(_NR, ctypes.c_void_p(address), _FUTEX_WAKE_OP, 1, None,
          ctypes.c_void_p(address), _ADD_ONE)


def sleep(address, seen, timeout):
    """Sleep while the 32-bit word at ``address`` holds ``seen`` (its
    value as a signed 32-bit int), ``timeout`` seconds at most."""
    whole = int(timeout)
    spec = _Timespec(whole, int((timeout - whole) * 1e9))
    if _call(_NR, ctypes.c_void_p(address), _FUTEX_WAIT,
             ctypes.c_int(seen), ctypes.byref(spec), None, 0) == -1:
        error = ctypes.get_errno()
        if error not in (0, 11, 4, 110):  # EAGAIN, EINTR, ETIMEDOUT: fine
            raise OSError(error, os.strerror(error))
