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
"""

import logging
import mmap
import os
import secrets

import numpy as np
import psutil

__all__ = ["SHM_DIR", "PREFIX", "session_prefix", "ShmStore",
           "create_segment", "map_segment", "unlink", "sweep",
           "sweep_stale", "segments"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "lc_"


def session_prefix():
    """A new session's prefix: ``lc_<pid>_<token>_``."""
    return f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}_"


def _path(name):
    return os.path.join(SHM_DIR, name)


def create_segment(name, nbytes):
    """Create segment ``name`` of ``nbytes`` (>= 1) and map it read-write."""
    fd = os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(int(nbytes), 1))
        return mmap.mmap(fd, max(int(nbytes), 1))
    except BaseException:
        os.unlink(_path(name))
        raise
    finally:
        os.close(fd)


def map_segment(name, writable=False, inherit=True):
    """Map an existing segment; returns the mmap.

    ``inherit=False`` keeps the mapping out of processes forked later (the
    master's mappings must not pin memory in every node it starts)."""
    fd = os.open(_path(name), os.O_RDWR if writable else os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
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
        array = array_on(create_segment(segment, nbytes), tuple(shape), dtype)
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
