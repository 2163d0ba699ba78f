"""Shared-memory segments for node workspaces, and sweeping stale ones.

One segment per blob: a file in /dev/shm named

    lc_<master pid>_s<master start>_<session token>_<node index>_<seq>_<random>

created by the node that owns the blob (``ShmStore``) or by the master when
it feeds a value (the node adopts it), and unlinked by the node when the
blob is replaced or the node shuts down.  Measured against arenas, a
segment per blob costs one ``fallocate`` + ``mmap`` (~20 us) when a blob is
first created or changes shape; every other write is an in-place
``np.copyto``.  The master maps segments read-only (``map_segment``) to
fetch blobs without copying them through a pipe.

Names.  The head says whose a segment is: the master's pid *and* its start
time (clock ticks since boot, from ``/proc/<pid>/stat``) -- together they
name one process exactly, so a pid the kernel gave to a newer process is
not taken for the owner, and no clocks are compared.  The master sweeps its
session's prefix on ``close()`` and after a node dies, and any new
scheduler (or ``--cleanup``) removes this user's segments whose master is
gone (`sweep_stale`): no such process, a zombie, or another process under
the same pid.  What it may not remove -- another user's entry, a directory
-- it skips, saying so at debug level.  Every name the library makes ends
in a random part and is created exclusively (``O_EXCL``), with a new random
part when the name is taken (`create_unique`): anyone may create files in
/dev/shm, and a name nobody can guess cannot be taken first.

Descriptors.  A mapping does not keep its file open: `create_segment` and
`map_segment` close the descriptor once the segment is mapped, and the
mapping keeps no duplicate of it (`shm_map`), so a process's descriptors
do not grow with its blobs; the few it keeps open (FIFOs) go through
`open_fd`, which raises the soft limit before it runs out.

Space.  A page of a tmpfs file is allocated when it is first touched, and
on a full /dev/shm that touch is a SIGBUS that kills the process.  So
`create_segment` reserves the whole segment (``posix_fallocate``) before
anything is written: a full /dev/shm is a `SharedMemoryFullError` naming
the blob, its size and the space left.
"""

import errno
import logging
import mmap
import os
import secrets
import stat
import time

import numpy as np

from ..errors import SharedMemoryFullError
from .shm_map import map_fd as _map
from .shm_map import open_fd

__all__ = ["SHM_DIR", "PREFIX", "session_prefix", "ShmStore",
           "create_segment", "create_unique", "map_segment", "open_fd",
           "unlink", "sweep", "sweep_stale", "segments"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "lc_"
#: names tried (each with a new random part) before a creation gives up
CREATE_TRIES = 8
#: seconds of slack when a name without its master's start time (made by
#: an older version) is judged by the file's mtime: the start time psutil
#: and the kernel give is whole-second accurate at best
_LEGACY_SLACK = 1.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- names -------------------------------------------------------------------

def session_prefix():
    """A new session's prefix: ``lc_<pid>_s<start>_<token>_``."""
    return (f"{PREFIX}{os.getpid()}_s{_proc_stat(os.getpid())[1]}_"
            f"{secrets.token_hex(4)}_")


def _path(name):
    return os.path.join(SHM_DIR, name)


def unique_name(prefix):
    """``prefix`` and a random part nobody can guess."""
    return prefix + secrets.token_hex(4)


def _owner_of(name):
    """``(pid, start ticks or None)`` of the master a segment name says
    made it; None for a name that is none of ours."""
    if name.startswith(SEMAPHORE):
        name = name[len(SEMAPHORE):]
    fields = name[len(PREFIX):].split("_")
    try:
        pid = int(fields[0])
    except ValueError:
        return None
    start = None
    if len(fields) > 2 and fields[1][:1] == "s":
        try:
            start = int(fields[1][1:])
        except ValueError:
            pass
    return pid, start


# -- segments -----------------------------------------------------------------

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
        unlink(name)
        raise
    finally:
        os.close(fd)


def create_unique(prefix, nbytes, blob=None, what=None):
    """A new segment named ``prefix`` + a random part: ``(name, mmap)``.
    A name someone created first is skipped for another."""
    for _ in range(CREATE_TRIES):
        name = unique_name(prefix)
        try:
            return name, create_segment(name, nbytes, blob, what)
        except FileExistsError:
            log.debug("segment name %s is taken; trying another", name)
    raise FileExistsError(
        errno.EEXIST, f"{CREATE_TRIES} random segment names in {SHM_DIR} "
        f"starting {prefix} were all taken")


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
    """Remove ``name``; False if it was not there or may not be removed
    (another user's entry, a directory: said at debug level)."""
    try:
        os.unlink(_path(name))
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.debug("cannot remove %s: %s", _path(name), exc)
        return False


#: what the C library puts before a named semaphore's name in /dev/shm
SEMAPHORE = "sem."


def segments(prefix=PREFIX):
    """Names of the segments in /dev/shm starting with ``prefix`` -- and
    of the named semaphores (a queue's lock when several nodes write or
    read it) whose name does, ``sem.<name>`` there."""
    sem = SEMAPHORE + prefix
    try:
        return sorted(n for n in os.listdir(SHM_DIR)
                      if n.startswith(prefix) or n.startswith(sem))
    except FileNotFoundError:
        return []


def sweep(prefix):
    """Unlink every segment starting with ``prefix``; returns their names."""
    removed = [n for n in segments(prefix) if unlink(n)]
    if removed:
        log.debug("swept %d segment(s) with prefix %s", len(removed), prefix)
    return removed


# -- stale segments -----------------------------------------------------------

def _proc_stat(pid):
    """``(state, start ticks since boot)`` of process ``pid``; None if
    there is none.  Raises PermissionError where /proc hides it."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return fields[0].decode(), int(fields[19])


def _owner_alive(pid, created, start=None):
    """Whether the master ``pid`` that made a segment lives: a zombie is
    dead; a process under that pid is the owner if it started at
    ``start`` (ticks since boot, from the segment's name) or, for a name
    without it, if it started before the segment's mtime ``created``."""
    try:
        found = _proc_stat(pid)
    except (OSError, ValueError, IndexError):
        return True  # cannot tell: keep the segment
    if found is None:
        return False
    state, started = found
    if state in ("Z", "X"):
        return False
    if start is not None:
        return started == start
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + started / _CLK_TCK <= created + _LEGACY_SLACK


def sweep_stale():
    """Unlink this user's segments of masters that are gone; returns their
    names.  Others' entries, and entries that are neither files nor FIFOs,
    are skipped (debug log)."""
    uid = os.geteuid()
    removed = []
    for name in segments(PREFIX):
        owner = _owner_of(name)
        if owner is None:
            continue
        try:
            st = os.lstat(_path(name))
        except FileNotFoundError:
            continue
        if st.st_uid != uid or not (stat.S_ISREG(st.st_mode) or
                                    stat.S_ISFIFO(st.st_mode)):
            log.debug("not sweeping %s: another user's, or not a segment",
                      _path(name))
            continue
        if not _owner_alive(owner[0], st.st_mtime, owner[1]) and unlink(name):
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
        self._seq += 1
        segment, mm = create_unique(f"{self.prefix}{self._seq}_", nbytes,
                                    blob=name)
        array = array_on(mm, tuple(shape), dtype)
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
