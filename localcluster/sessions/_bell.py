"""The run word: a 32-bit word at the head of the scheduler's run board
(shared memory) that every idle node sleeps on (a Linux futex), so that
one system call of the master's wakes every node of a run, and none of
their zygotes' is on the way.

Each node has a bit (``bit_of`` its control slot): it sleeps on the word
for that bit only (``FUTEX_WAIT_BITSET``), and the master, having counted
a request in each node's control slot (`_handle.ControlWords`), adds one
to the word and wakes the bits of the nodes it asked (`wake`): a node
not asked sleeps on, unless it shares a bit with one that is (32 bits for
any number of nodes: it then looks at its slot, finds nothing, and sleeps
again).  `Sleeper.sleep` returns once the word is no longer the value the
caller saw, it is woken, a signal comes, or ``timeout`` seconds pass --
never later.  ``wake_all`` adds one atomically and wakes every sleeper (a
node whose master hung up wakes itself so).  Where futexes cannot be
called (not Linux, not x86: see `_SYS_FUTEX`), `AVAILABLE` is False
and the scheduler sends every request through the zygote instead.
"""

import ctypes
import ctypes.util
import os
import platform
import time

__all__ = ["AVAILABLE", "address_of", "bit_of", "wake", "wake_all",
           "Sleeper", "WORDS", "CANCEL", "ASKED", "POSTS", "WHERE"]

#: a node's control slot (`_handle.ControlWords`): int64 words -- the run
#: id to cancel, how many requests the master made of the node, how many
#: of them were posted on the board, where the last one is (``offset <<
#: 32 | length``)
WORDS, CANCEL, ASKED, POSTS, WHERE = 4, 0, 1, 2, 3

#: the futex system call's number, by machine -- x86 only: the master
#: and the nodes read and write the words of the board and the control
#: slots with plain loads and stores (numpy), in an order the other side
#: relies on (the counts before the run word, the word before the
#: counts), which x86 keeps and weaker memory models (ARM, POWER,
#: RISC-V) do not
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "i386": 240, "i686": 240}

_FUTEX_WAKE_OP, _FUTEX_WAIT_BITSET, _FUTEX_WAKE_BITSET = 5, 9, 10
#: FUTEX_OP(FUTEX_OP_ADD, 1, FUTEX_OP_CMP_EQ, 0): add one to the word;
#: the second wake-up (of the same word) is never wanted -- its count is 0
_ADD_ONE = (1 << 28) | (0 << 24) | (1 << 12) | 0
_EVERYONE = 0x7fffffff


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


def bit_of(slot):
    """The bit a node of control slot ``slot`` sleeps for."""
    return 1 << (slot % 32)


def wake(address, bits):
    """Wake the sleepers on the word at ``address`` (an int, or a
    `ctypes.c_void_p` made once) whose bit is in ``bits`` (the caller
    changed the word first)."""
    if not isinstance(address, ctypes.c_void_p):
        address = ctypes.c_void_p(address)
    _call(_NR, address, _FUTEX_WAKE_BITSET, _EVERYONE, None, None,
          ctypes.c_uint(bits))


def wake_all(address):
    """Add one to the word at ``address`` (atomically) and wake every
    sleeper on it."""
    _call(_NR, ctypes.c_void_p(address), _FUTEX_WAKE_OP, _EVERYONE, None,
          ctypes.c_void_p(address), _ADD_ONE)


class Sleeper:
    """A sleep on one word for one bit, its arguments made once (a node
    sleeps after every request): `sleep` while the 32-bit word holds
    ``seen`` (its value as a signed 32-bit int) until a wake-up for the
    bit -- ``timeout`` seconds at most."""

    def __init__(self, address, bit):
        self._address = ctypes.c_void_p(address)
        self._bit = ctypes.c_uint(bit)
        self._spec = _Timespec()
        self._at = ctypes.byref(self._spec)

    def sleep(self, seen, timeout):
        deadline = time.monotonic() + timeout   # CLOCK_MONOTONIC
        spec = self._spec
        spec.tv_sec = whole = int(deadline)
        spec.tv_nsec = int((deadline - whole) * 1e9)
        if _call(_NR, self._address, _FUTEX_WAIT_BITSET, seen, self._at,
                 None, self._bit) == -1:
            error = ctypes.get_errno()
            if error not in (0, 11, 4, 110):  # EAGAIN, EINTR, ETIMEDOUT
                raise OSError(error, os.strerror(error))
