"""Mapping a file without keeping its descriptor, and the descriptor limit.

A process of localcluster may map thousands of segments (blobs, queue
slots, fetched values) and hold hundreds of FIFOs (two per queue end);
neither may cost it a descriptor it does not need.

Mappings.  Python's ``mmap`` keeps a duplicate of the file's descriptor for
the mapping's life, unless asked not to (``trackfd=False``, Python 3.13).
Before 3.13 the duplicate is closed right after the mapping is made and
the object's fd field set to -1 -- the state CPython gives an anonymous
map, whose close and unmap then skip the descriptor.  Where that field is
is found once, by probing three mappings for an int that is another
descriptor on the probe's file, and checked the same way at every use;
if it cannot be found exactly, mappings keep their descriptor (correct,
only hungrier).

The limit.  The soft RLIMIT_NOFILE (often 1024) is kept low for programs
that ``select()``; localcluster polls, so `open_fd` raises the soft limit
to the hard one (`fdlimit`) -- before it runs out, and on EMFILE -- and
names the limit and the fix when there is no headroom left.
"""

import ctypes
import errno
import logging
import mmap
import os
import resource
import sys
import threading

from . import fdlimit

__all__ = ["open_fd", "map_fd"]

log = logging.getLogger(__name__)


#: a descriptor opened here numbered past this raises the soft limit
_fd_mark = None


def open_fd(path, flags, mode=0o600):
    """``os.open`` that keeps the process from running out of descriptors.

    The soft limit (often 1024) is kept low for programs that
    ``select()``; this one polls, so it raises the soft limit to the hard
    one -- early, once a descriptor opened here is numbered past 3/4 of
    it, so that the pipes and mappings opened next by any code find room
    too, and on EMFILE, retrying the open.  With no headroom left, EMFILE
    says what holds the descriptors."""
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        if not _raise_fd_limit():
            raise _out_of_fds(f"opening {path}") from exc
        fd = os.open(path, flags, mode)
    if fd >= (_fd_mark if _fd_mark is not None else _set_fd_mark()):
        _raise_fd_limit()
    return fd


def _out_of_fds(doing):
    return fdlimit.limit_error(doing)


def _set_fd_mark():
    global _fd_mark
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    _fd_mark = (sys.maxsize if soft == resource.RLIM_INFINITY
                else soft * 3 // 4)
    return _fd_mark


def _raise_fd_limit():
    """Raise RLIMIT_NOFILE's soft limit to the hard one (`fdlimit`'s
    rule); False if there is no headroom."""
    global _fd_mark
    if not fdlimit.raise_soft_limit():
        _fd_mark = sys.maxsize  # nothing to gain: stop asking
        return False
    _set_fd_mark()
    return True


_fd_field = None
_fd_field_lock = threading.Lock()


def _fd_field_offset():
    """Where a CPython ``mmap`` object keeps its duplicate descriptor (a
    C int), found once in three probe mappings; -1 if not found exactly
    (then mappings keep their descriptor: correct, only hungrier)."""
    global _fd_field
    with _fd_field_lock:
        if _fd_field is None:
            _fd_field = _find_fd_field()
        return _fd_field


def _dup_of(fd, value):
    """Whether descriptor ``value`` is another than ``fd`` on its file."""
    if value < 0 or value == fd or value > 1 << 24:
        return False
    try:
        mine, other = os.fstat(fd), os.fstat(value)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (other.st_dev, other.st_ino)


def _find_fd_field():
    if sys.implementation.name != "cpython":
        return -1
    fds, maps, found = [], [], None
    try:
        for _ in range(3):
            fds.append(os.memfd_create("lc-probe", os.MFD_CLOEXEC))
            os.ftruncate(fds[-1], mmap.PAGESIZE)
            maps.append(mmap.mmap(fds[-1], mmap.PAGESIZE))
            raw = ctypes.string_at(id(maps[-1]), type(maps[-1]).__basicsize__)
            here = {offset for offset in range(0, len(raw) - 3, 4)
                    if _dup_of(fds[-1], int.from_bytes(
                        raw[offset:offset + 4], sys.byteorder, signed=True))}
            found = here if found is None else found & here
    except (OSError, ValueError):
        return -1
    finally:
        for mm in maps:
            mm.close()
        for fd in fds:
            os.close(fd)
    return found.pop() if found is not None and len(found) == 1 else -1


def _detach_fd(mm, fd):
    """Close the duplicate of ``fd`` that ``mm`` keeps, leaving it an
    fd-less mapping -- the state CPython gives an anonymous map, whose
    close and unmap skip fd -1.  Checked: the field must hold another
    descriptor on ``fd``'s file."""
    offset = _fd_field_offset()
    if offset < 0:
        return
    field = ctypes.c_int.from_address(id(mm) + offset)
    dup = field.value
    if _dup_of(fd, dup):
        field.value = -1
        os.close(dup)


if sys.version_info >= (3, 13):
    def _mmap(fd, size, prot):
        return mmap.mmap(fd, size, mmap.MAP_SHARED, prot, trackfd=False)
else:
    def _mmap(fd, size, prot):
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        _detach_fd(mm, fd)
        return mm


def map_fd(fd, size, prot):
    """A shared mapping of ``fd`` that keeps no descriptor (the duplicate
    mmap makes first may meet the limit: see `open_fd`)."""
    try:
        return _mmap(fd, size, prot)
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        if not _raise_fd_limit():
            raise _out_of_fds("mapping shared memory") from exc
        return _mmap(fd, size, prot)
