"""Shared-memory segments for node workspaces, and sweeping stale ones.

One segment per blob: a file in /dev/shm named

    lc_<master pid>_<session token>_<node index>_<incarnation>_<seq>

created by the node that owns the blob (``ShmStore``) or by the master when
it feeds a value (the node adopts it), and unlinked by the node when the
blob is replaced or the node shuts down.  The name says whose it is: the
master sweeps its session's prefix on ``close()`` and after a node dies,
and any new scheduler removes segments whose master pid is gone (a master
that was SIGKILLed).  Measured against arenas, a segment per blob costs one
``ftruncate`` + ``mmap`` (~20 us) when a blob is first created or changes
shape; every other write is an in-place ``np.copyto``.

The master maps segments read-only (``map_segment``) to fetch blobs
without copying them through a pipe.

Descriptors.  A mapping does not keep its file open: `create_segment` and
`map_segment` close the descriptor once the segment is mapped.  Python's
``mmap`` keeps a duplicate of it for the mapping's life (until 3.13's
``trackfd=False``), so on older versions the duplicate is detached from the
object (`_detach_fd`); a process's descriptors then do not grow with its
blobs, and a process out of descriptors raises its soft limit to its hard
limit before it fails (`open_fd`).

Space.  A page of a tmpfs file is allocated when it is first touched, and
on a full /dev/shm that touch is a SIGBUS that kills the process.  So
`create_segment` reserves the whole segment (``posix_fallocate``) before
anything is written: a full /dev/shm is a `SharedMemoryFullError` naming
the blob, its size and the space left.
"""

import ctypes
import errno
import logging
import mmap
import os
import resource
import secrets
import sys
import threading

import numpy as np
import psutil

from ..errors import SharedMemoryFullError

__all__ = ["SHM_DIR", "PREFIX", "session_prefix", "ShmStore",
           "create_segment", "map_segment", "open_fd", "unlink", "sweep",
           "sweep_stale", "segments"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "lc_"


def session_prefix():
    """A new session's prefix: ``lc_<pid>_<token>_``."""
    return f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}_"


def _path(name):
    return os.path.join(SHM_DIR, name)


# -- descriptors ---------------------------------------------------------------

def open_fd(path, flags, mode=0o600):
    """``os.open``; out of descriptors (EMFILE), the process's soft limit is
    raised to its hard limit and the open tried once more -- the soft
    limit (often 1024) is kept low for programs that ``select()``, which
    this one does not -- else an EMFILE that says what holds them."""
    try:
        return os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        if _raise_fd_limit():
            return os.open(path, flags, mode)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        raise OSError(
            errno.EMFILE,
            f"out of file descriptors opening {path} (this process may "
            f"have {soft} open: raise `ulimit -n`); every queue between two "
            "node processes keeps 2 open in the master and in each of its "
            "nodes") from exc


def _raise_fd_limit():
    """Raise RLIMIT_NOFILE's soft limit to the hard one; False if there is
    no headroom."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft >= target:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return False
    log.info("out of file descriptors: raised this process's limit from %d "
             "to %d", soft, target)
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
    def _map(fd, size, prot):
        return mmap.mmap(fd, size, mmap.MAP_SHARED, prot, trackfd=False)
else:
    def _map(fd, size, prot):
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        _detach_fd(mm, fd)
        return mm


# -- segments ------------------------------------------------------------------

def create_segment(name, nbytes, blob=None, what=None):
    """Create segment ``name`` of ``nbytes`` (>= 1), its memory reserved,
    and map it read-write.  ``blob`` (a blob name) or ``what`` (a phrase)
    says what it is for in a `SharedMemoryFullError`."""
    size = max(int(nbytes), 1)
    fd = open_fd(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR |
                 os.O_NOFOLLOW, 0o600)
    try:
        _reserve(fd, size, blob,
                 what or (f"blob {blob!r}" if blob is not None else name))
        return _map(fd, size, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.unlink(_path(name))
        raise
    finally:
        os.close(fd)


def _reserve(fd, size, blob, what):
    """Allocate the segment's memory now: fail here, not with SIGBUS on
    the first write to a page that /dev/shm has no room for."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
            os.ftruncate(fd, size)  # cannot reserve here: size it only
            return
        if exc.errno not in (errno.ENOSPC, errno.EFBIG):
            raise
        fs = os.statvfs(SHM_DIR)
        free, total = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
        raise SharedMemoryFullError(
            f"no room in {SHM_DIR} for {what}: it needs {_human(size)}, "
            f"{_human(free)} of {_human(total)} is free; free shared memory "
            "(stale segments: python -m localcluster.run --cleanup), "
            f"enlarge {SHM_DIR}, or make the blob smaller",
            blob=blob, nbytes=size, free=free) from None


def _human(n):
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"


def map_segment(name, writable=False, inherit=True):
    """Map an existing segment; returns the mmap.

    ``inherit=False`` keeps the mapping out of processes forked later (the
    master's mappings must not pin memory in every node it starts)."""
    fd = open_fd(_path(name), os.O_RDWR if writable else os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mm = _map(fd, size, prot)
    finally:
        os.close(fd)
    if not inherit and hasattr(mmap, "MADV_DONTFORK"):
        mm.madvise(mmap.MADV_DONTFORK)
    return mm


def array_on(mm, shape, dtype):
    """A writable ndarray of ``shape``/``dtype`` on mmap ``mm``."""
    return np.ndarray(shape, dtype=dtype, buffer=mm)


def unlink(name):
    try:
        os.unlink(_path(name))
        return True
    except FileNotFoundError:
        return False


def segments(prefix=PREFIX):
    """Names of the segments in /dev/shm starting with ``prefix``."""
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def sweep(prefix):
    """Unlink every segment starting with ``prefix``; returns their names."""
    removed = [n for n in segments(prefix) if unlink(n)]
    if removed:
        log.debug("swept %d segment(s) with prefix %s", len(removed), prefix)
    return removed


def _owner_alive(pid, created):
    try:
        proc = psutil.Process(pid)
        # A pid reused by a process that started after the segment was
        # made is not its owner.
        return proc.create_time() <= created + 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def sweep_stale():
    """Unlink segments of masters that are gone; returns their names."""
    removed = []
    for name in segments(PREFIX):
        try:
            pid = int(name[len(PREFIX):].split("_", 1)[0])
            created = os.stat(_path(name)).st_mtime
        except (ValueError, FileNotFoundError):
            continue
        if not _owner_alive(pid, created) and unlink(name):
            removed.append(name)
    if removed:
        log.info("removed %d stale shared-memory segment(s) of dead masters",
                 len(removed))
    return removed


class ShmStore(dict):
    """A workspace store keeping each array blob in its own segment.

    Maps blob name -> ndarray view on the blob's segment; ``segment_of``
    gives the segment name for fetches.  Arrays of Python objects cannot
    live in shared memory and are kept as they are (not fetchable
    zero-copy).
    """

    #: `put` never keeps the array it is given: it copies it into a segment
    #: (an object array, which it keeps, is never lent by a queue)
    copies = True

    def __init__(self, prefix):
        super().__init__()
        self.prefix = prefix
        self._seq = 0
        self._segments = {}   # blob name -> segment name

    def segment_of(self, name):
        return self._segments.get(name)

    def _new_name(self):
        self._seq += 1
        return f"{self.prefix}{self._seq}"

    def put(self, name, value):
        value = value if isinstance(value, np.ndarray) else np.asarray(value)
        current = dict.get(self, name)
        if current is value:
            return
        if (current is not None and name in self._segments and
                current.shape == value.shape and current.dtype == value.dtype):
            np.copyto(current, value)
            return
        if value.dtype.hasobject:
            self._drop_segment(name)
            dict.__setitem__(self, name, value)
            return
        np.copyto(self.reserve(name, value.shape, value.dtype), value)

    def reserve(self, name, shape, dtype):
        """The array blob ``name`` lives in, made to have ``shape`` and
        ``dtype`` (its segment kept if it has them, else a new one); the
        caller fills it."""
        dtype = np.dtype(dtype)
        current = dict.get(self, name)
        if current is not None and name in self._segments and \
                current.shape == tuple(shape) and current.dtype == dtype:
            return current
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        segment = self._new_name()
        array = array_on(create_segment(segment, nbytes, blob=name),
                         tuple(shape), dtype)
        self._drop_segment(name)
        self._segments[name] = segment
        dict.__setitem__(self, name, array)
        return array

    def adopt(self, name, segment, shape, dtype):
        """Take over a segment the master created for ``name``."""
        array = array_on(map_segment(segment, writable=True), shape, dtype)
        self._drop_segment(name)
        self._segments[name] = segment
        dict.__setitem__(self, name, array)

    def _drop_segment(self, name):
        segment = self._segments.pop(name, None)
        if segment is not None:
            unlink(segment)

    def pop(self, name, default=None):
        self._drop_segment(name)
        return dict.pop(self, name, default)

    def close(self):
        """Unlink every segment of this store."""
        for segment in self._segments.values():
            unlink(segment)
        self._segments.clear()
        self.clear()
