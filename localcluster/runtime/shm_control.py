"""The control words and doorbell FIFOs of a cross-node queue, and the
master's side of them (`ChannelParts`); a node's end is
`shm_channel.ShmChannel`, whose docstring says how they are used.
"""

import array
import os
import threading

# a POSIX named semaphore, opened by name in every node: what
# multiprocessing's own locks are made of (its public classes can only be
# handed to processes it starts itself)
import _multiprocessing

from . import shm
from ..errors import Cancelled, PlanError

__all__ = ["ChannelParts", "MAX_CAPACITY", "control_words", "layout", "fifo",
           "drain", "ring_bell", "ProcessLock"]

# The control segment is int64 words, grouped by who writes them how
# often, each group on its own 64-byte cache line: a word one side writes
# per record must not share a line with words the other side reads per
# record, or the line moves between the two cores every time.
TAIL, REUSED = 0, 1                       # the producer's, per record
HEAD, FREED = 8, 9                        # the consumer's, per record
(CLOSED, CAPACITY, WAIT_PRODUCERS, WAIT_CONSUMERS,
 CONSUMER_SLEEPS, ENDED, WRITERS, RING_AT) = range(16, 24)   # seldom
#: (``RING_AT``: the ``tail`` at which sleeping consumers want their ring)
#: then, each array on lines of its own (see `layout`): one generation
#: per slot, the record ring (slot id per position), one layout stamp per
#: slot (bumped when the producer writes a new layout) and the free ring
#: (slot ids handed back, in the order they were)
GENERATIONS = 24


def layout(capacity):
    """``(generations, ring, stamps, free ring, words in all)``: where the
    arrays of a channel of ``capacity`` slots start."""
    line = -(-capacity // 8) * 8
    return (GENERATIONS, GENERATIONS + line, GENERATIONS + 2 * line,
            GENERATIONS + 3 * line, GENERATIONS + 4 * line)


#: the most records a queue between two nodes holds (its control words
#: grow with it)
MAX_CAPACITY = 16384
_BELL = b"x"


def fifo(path):
    # O_RDWR: never blocks to wait for the other end, and keeps the FIFO's
    # bytes while this end is open
    return shm.open_fd(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)


def drain(fd):
    """Empty doorbell FIFO ``fd``."""
    try:
        while len(os.read(fd, 4096)) == 4096:
            pass
    except BlockingIOError:
        pass


def ring_bell(fd):
    try:
        os.write(fd, _BELL)
    except BlockingIOError:
        pass  # the FIFO is full of rings: every waiter wakes anyway


_SEMAPHORE = 1   # a SemLock of kind semaphore: any process may release it


def _semaphore_name(prefix):
    # /dev/shm/sem.<prefix>lock: swept with the channel's other parts
    return "/" + prefix + "lock"


class ProcessLock:
    """A channel end's lock when several node processes write (or read)
    its queue: the end's thread lock, then the queue's semaphore shared by
    all its nodes (a futex: no system call while nobody waits).

    A wait for the semaphore looks every `SLICE` seconds whether the run
    was aborted (a node that died holding it: the master cancels the run,
    then frees the semaphore before the next), so it never outlives it."""

    SLICE = 0.05

    def __init__(self, prefix, aborted):
        self._thread = threading.Lock()
        self._semaphore = _multiprocessing.SemLock._rebuild(
            0, _SEMAPHORE, 1, _semaphore_name(prefix))
        self._aborted = aborted

    def __enter__(self):
        self._thread.acquire()
        semaphore = self._semaphore
        try:
            while not semaphore.acquire(True, self.SLICE):
                if self._aborted():
                    raise Cancelled("queue wait ended: the run was cancelled")
        except BaseException:
            self._thread.release()
            raise
        return self

    def __exit__(self, *exc):
        self._semaphore.release()
        self._thread.release()


def control_words(buffer, capacity):
    return memoryview(buffer).cast("B")[:_control_size(capacity)].cast("q")


def _control_size(capacity):
    return 8 * layout(capacity)[4]


class ChannelParts:
    """Master side: a channel's control segment and FIFOs.

    The master keeps them (the FIFOs open: a FIFO drops its bytes when
    nobody holds it) for as long as the queue is used, and `reset` them
    before every run -- empty and open -- while the slot segments the nodes
    made stay, already mapped, so records do not fault in fresh pages every
    run.  `close` and a sweep of ``prefix`` remove everything.
    """

    def __init__(self, prefix, capacity, queue=None, shared_lock=False):
        if capacity > MAX_CAPACITY:
            raise PlanError(
                f"a queue between two nodes holds at most {MAX_CAPACITY} "
                f"records, this one asks for capacity={capacity}; lower it "
                "(larger records, fewer of them) or keep both ends on one "
                "node")
        self.prefix = prefix
        self.capacity = capacity
        self.desc = {"prefix": prefix, "control": prefix + "ctl",
                     "capacity": capacity, "queue": queue,
                     "shared_lock": shared_lock}
        self._fds = []
        self._words = None
        self._made = []       # the parts' names, once this made them
        self._semaphore = None
        # the free ring of a reset: every slot id, in order
        self._every_slot = memoryview(array.array("q", range(capacity)))
        try:
            self._control = shm.create_segment(
                prefix + "ctl", _control_size(capacity),
                what=f"the control words of queue {queue!r}")
            self._made.append(prefix + "ctl")
            self._words = control_words(self._control, capacity)
            for kind in ("free", "full"):
                path = os.path.join(shm.SHM_DIR, prefix + kind)
                os.mkfifo(path, 0o600)
                self._made.append(prefix + kind)
                self._fds.append(fifo(path))
            if shared_lock:
                # several writer or reader nodes: one lock for all their
                # ends (created here: O_EXCL, mode 0600)
                self._semaphore = _multiprocessing.SemLock(
                    _SEMAPHORE, 1, 1, _semaphore_name(prefix), False)
                self._made.append("sem." + prefix + "lock")
        except BaseException:
            # what failed may be the descriptors running out: remove the
            # parts by name, listing nothing, so the error stays the first
            self._close_parts()
            raise
        self.reset()

    def reset(self, writers=1):
        """Empty and open, every slot free (nodes idle), for a run in which
        ``writers`` writers end (the last closes the queue)."""
        # (slot generations and layout stamps stay: the nodes keep their
        # slot segments and views across runs)
        words, capacity = self._words, self.capacity
        free = layout(capacity)[3]
        words[free:free + capacity] = self._every_slot
        for index, value in ((CLOSED, 0), (TAIL, 0), (HEAD, 0),
                             (FREED, capacity), (REUSED, 0),
                             (WAIT_PRODUCERS, 0), (WAIT_CONSUMERS, 0),
                             (CONSUMER_SLEEPS, 0), (RING_AT, 0), (ENDED, 0),
                             (WRITERS, writers), (CAPACITY, capacity)):
            words[index] = value
        for fd in self._fds:
            drain(fd)
        if self._semaphore is not None and \
                self._semaphore._get_value() == 0:
            # a node that died in a run held it: nodes are idle now
            self._semaphore.release()

    def close(self):
        self._close_parts()
        shm.sweep(self.prefix)    # and the slot segments the nodes made

    def _close_parts(self):
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self._words is not None:
            self._words.release()
            self._words = None
        self._semaphore = None
        for name in self._made:
            shm.unlink(name)
        self._made = []
