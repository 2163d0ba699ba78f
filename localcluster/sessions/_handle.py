"""The master's handle on one node process: spawn, ready, reap, kill, and
the error that describes a death.

A `NodeHandle` is one incarnation of a node: its place in the batch its
zygote started (`_zygote`), its pid once it said ready, its inbox (the
messages and the death its zygote relayed), its output stream
(`_logpump`), its shared control word (the run id to cancel) and the
mirror of the plans it keeps.  A restart is a new handle.

The master starts nodes a batch at a time: a `ZygoteLink` starts one
zygote, which forks every node of the batch and relays between them and
the master.  `Mux` is the one wait of the master: a single ``poll`` on
the control sockets of its zygotes, whose events go to the handles'
inboxes -- a reply and a death are seen alike, in the order the zygote
saw them (a node's messages before its death), and no wait is unbounded
by accident (``deadline`` is on the `time.monotonic` clock; None waits
until something happens).  `wait_events(handles, deadline)` waits for
some of ``handles``; what arrives meanwhile for other nodes waits in
their inboxes.
"""

import collections
import ctypes
import enum
import logging
import math
import multiprocessing.process
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time

import numpy as np

from ..errors import NodeFailedError, RunTimeoutError
from ..runtime import shm
from . import _bell
from . import _protocol as P
from . import _zygote as Z
from ._node import EXIT_MEMORY, NodeSpec, node_main
from ._plumbing import MASTER_ENDS

__all__ = ["NodeState", "NodeHandle", "ControlWords", "Board", "Mux",
           "ZygoteLink",
           "wait_events", "CONN", "SENTINEL", "await_ready",
           "read_goodbyes", "join_all", "START_TIMEOUT", "SHUTDOWN_STEP",
           "send_all", "send_each", "signal_all", "kill_all"]

log = logging.getLogger(__name__)

#: seconds a node gets to start and report ready
START_TIMEOUT = 30.0
#: seconds for each step of shutdown: ask, SIGTERM, SIGKILL
SHUTDOWN_STEP = 1.0
#: seconds the master waits for a zygote that said it is done to exit
ZYGOTE_WAIT = 5.0

CONN, SENTINEL = "conn", "sentinel"

#: a handle's inbox ends with this once its zygote reaped the node
DEATH = object()

#: a node's answer to a request read from the board comes straight to the
#: master on its batch's reply pipe -- one write, so whole, whichever node
#: of the batch writes at the same time (a pipe keeps a write of at most
#: PIPE_BUF bytes in one piece): its id in the batch and the length of the
#: pickled message, then the message -- if that fits; a longer one goes
#: through the zygote.  The master takes every answer waiting in one read.
REPLY_HEAD = struct.Struct("!II")
REPLY_MAX = select.PIPE_BUF - REPLY_HEAD.size


class NodeState(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    DEAD = "dead"


class NodeHandle:
    """The master's handle on one node process (one incarnation)."""

    def __init__(self, name, prefix, kwargs):
        self.name = name
        self.prefix = prefix
        self.kwargs = kwargs
        self.link = None       # its zygote's ZygoteLink
        self.id = None         # its place in the zygote's batch
        self.inbox = collections.deque()
        self.gone = False      # its zygote reported its death
        self._exitcode = None
        self.log = None       # LogPump stream
        self.state = NodeState.IDLE
        self.pid = None       # known once it said ready
        self.plans = collections.OrderedDict()  # mirror of the node's cache
        self.control_word = None  # shared int64 words (`ControlWords`)
        self.board = None   # the scheduler's `Board`, if runs go there
        self.bit = 0        # the node's bit of the run word (`_bell`)
        self.started_at = None    # monotonic seconds: when it was started

    def __repr__(self):
        return f"NodeHandle({self.name!r}, pid={self.pid}, {self.state.value})"

    def send(self, msg):
        """Send ``msg`` to the node (OSError: its zygote is gone)."""
        if send_all([self], msg):
            raise OSError(f"the zygote of node {self.name!r} is gone")

    def recv(self):
        """The next message the node sent; EOFError once only its death
        is left."""
        inbox = self.inbox
        if not inbox or inbox[0] is DEATH:
            raise EOFError(f"node {self.name!r} is gone")
        msg = inbox.popleft()
        if not inbox and self.link is not None:
            self.link.mux.ready.pop(self, None)
        return msg

    def kind(self):
        """What the inbox holds first: CONN (a message), SENTINEL (the
        death), or None."""
        if not self.inbox:
            return None
        return SENTINEL if self.inbox[0] is DEATH else CONN

    def alive(self):
        return self.state is not NodeState.DEAD

    # -- stop ---------------------------------------------------------------

    def killpg(self, sig):
        """Send ``sig`` to the node's process group (through its zygote:
        only the parent of a process can signal it without racing the
        reuse of its pid)."""
        if self.link is not None and not self.gone:
            self.link.command(Z.KILL, [self.id], sig)

    def reap(self, wait=SHUTDOWN_STEP, sweep=True):
        """Collect a (dying) node: wait for its zygote to report its death
        (killed past ``wait`` seconds), sweep its segments (unless the
        caller sweeps those of every node at once: not ``sweep``)."""
        _wait_gone([self], time.monotonic() + wait)
        if not self.gone:
            self.killpg(signal.SIGKILL)
            _wait_gone([self], time.monotonic() + SHUTDOWN_STEP)
        if not self.gone and self.link is not None:
            # its zygote relays nothing (stopped, or hung): it goes, and
            # the nodes it started with it -- not a wait per node
            self.link.kill()
        self.state = NodeState.DEAD
        if self.link is not None:
            self.link.forget(self)
        if self.log is not None:
            self.log.closed.wait(0.5)
        if sweep:
            shm.sweep(self.prefix)

    def kill(self):
        self.killpg(signal.SIGKILL)
        self.reap()

    @property
    def exitcode(self):
        """The node process's exit status (None while it runs, or if its
        zygote died first)."""
        return self._exitcode

    def release(self):
        """Once reaped: nothing of it is left in the master."""
        self.inbox.clear()

    def death_error(self, during, fault=None):
        """Reap a dead node; the NodeFailedError describing its death
        (``fault``: the `Kill` fault that fired on it, if one did)."""
        self.reap()
        code = self.exitcode
        signame = signal_name(code)
        lines = self.log.last if self.log else ()
        if fault is not None:
            cause = f"{fault!r} fired"
        elif code == EXIT_MEMORY:
            limit = self.kwargs.get("memory_limit")
            cause = (f"it exceeded its memory_limit of {limit} bytes" if limit
                     else "it ran out of memory (MemoryError)")
            cause += "; " + _memory_fix(limit)
        elif signame == "SIGKILL":
            cause = ("likely killed by the OOM killer or a test" +
                     (f" (memory_limit={self.kwargs['memory_limit']})"
                      if self.kwargs.get("memory_limit") else ""))
        elif signame == "SIGSEGV":
            cause = "it crashed (segmentation fault) in native code"
        elif signame:
            cause = f"it was killed by {signame}"
        elif code is None:
            cause = ("the process that started it (its zygote) died, and "
                     "it with it")
        else:
            cause = f"it exited with status {code}"
        what = f"{signame}, exit {code}" if signame else f"exit {code}"
        tail = "; last log lines:\n  " + "\n  ".join(lines) if lines else ""
        return NodeFailedError(
            f"node {self.name!r} died ({what}) while {during}; {cause}; "
            f"it restarts with an empty workspace on the next run{tail}",
            node=self.name, exitcode=code, signal_name=signame,
            last_log_lines=lines)

    def memory_error(self, info):
        """Reap a node that answered with a ``memory`` error (`_node`:
        it ran out of memory and ends); the NodeFailedError saying so."""
        self.reap(wait=START_TIMEOUT)
        limit = self.kwargs.get("memory_limit")
        doing = f" while {info['doing']}" if info.get("doing") else ""
        what = info["type"] + (f": {info['message']}" if info["message"]
                               else "")
        error = NodeFailedError(
            (f"node {self.name!r} exceeded its memory_limit of {limit} bytes"
             if limit else f"node {self.name!r} ran out of memory")
            + f"{doing} ({what}); it was stopped and restarts with an empty "
            f"workspace on the next run; {_memory_fix(limit)}",
            node=self.name, exitcode=self.exitcode)
        error.__cause__ = P.RemoteTraceback(info["traceback"])
        return error




def _memory_fix(limit):
    """What to do about a node that ran out of memory."""
    return ("give it fewer or smaller blobs, or more memory" +
            (" (a higher memory_limit)" if limit else ""))


class ControlWords:
    """Each node's control slot, in a page shared by many nodes: four
    int64 words -- the run id to cancel, how many requests the master
    made of the node (`Board.ring`), how many of them were posted on the
    `Board`, and where the last one is (``offset << 32 | length``).

    One page holds the slots of 512 node starts, so the master maps one
    segment per 512 nodes, not one per node: every mapping of the master
    is copied into each node forked after it, so per-node mappings made
    start-up quadratic (and a mapping kept out of forks with
    MADV_DONTFORK is not safe either: the child's copy of its Python
    object would unmap whatever the child mapped later at that address).
    A slot is not reused: a page is a few KiB per 512 starts, swept with
    the scheduler's prefix on close.
    """

    #: int64 words per node, and the index of each
    WORDS, CANCEL, ASKED, POSTS, WHERE = (_bell.WORDS, _bell.CANCEL,
                                          _bell.ASKED, _bell.POSTS,
                                          _bell.WHERE)
    SLOTS = 512

    def __init__(self, prefix):
        self._prefix = prefix
        self._page = None      # (segment, int64 array)
        self._used = 0
        self._pages = 0

    def take(self):
        """``((segment, slot), words)``: where the node finds its slot,
        and the master's view of its four words."""
        if self._page is None or self._used == self.SLOTS:
            segment, mm = shm.create_unique(
                f"{self._prefix}{self._pages}_", self.SLOTS * self.WORDS * 8,
                what="the nodes' control words")
            self._pages += 1
            self._page = (segment, np.ndarray(self.SLOTS * self.WORDS,
                                              np.int64, buffer=mm))
            self._used = 0
        segment, words = self._page
        slot = self._used
        self._used += 1
        at = slot * self.WORDS
        return (segment, slot), words[at:at + self.WORDS]


class Board:
    """Where the master posts a run's messages for the nodes to read, and
    the run word they sleep on (`_bell`): one segment of the scheduler's,
    which every node maps.  A run writes each distinct message once; a
    node is told where its own is (its control slot), and the run's nodes
    are woken together, with one system call.  A run's messages stay until
    the next run: every node of a run reads its message before it
    answers, and a run ends only once each node answered or was killed.
    What does not fit goes through the zygote.  (256 KiB: the messages of
    hundreds of distinct plans -- a prototype's instances share one.)"""

    SIZE = 1 << 18
    #: the run word, then the messages from here
    HEAD = 64

    def __init__(self, prefix):
        self.segment, self._mm = shm.create_unique(
            f"{prefix}b_", self.SIZE, what="the run board")
        self._word = np.ndarray(1, np.int32, buffer=self._mm)
        self.word = _bell.address_of(self._word)
        self._address = ctypes.c_void_p(self.word)
        self._end = self.HEAD
        self._lock = threading.Lock()   # the counts: one writer at a time

    def clear(self):
        self._end = self.HEAD

    def put(self, data):
        """Write ``data`` (bytes) after what the run put already; its
        offset, or None if it does not fit."""
        start, end = self._end, self._end + len(data)
        if end > self.SIZE:
            return None
        self._mm[start:end] = data
        self._end = end
        return start

    def ring(self, handles, posts=None):
        """Count a request in each of ``handles``' slots -- posted at
        ``posts[i]`` ``(offset, length)`` of the board, if given, else
        sent through its zygote -- then wake them all at once."""
        bits = 0
        asked, posted, where = (ControlWords.ASKED, ControlWords.POSTS,
                                ControlWords.WHERE)
        with self._lock:
            for i, handle in enumerate(handles):
                words = handle.control_word
                if posts is not None:
                    offset, length = posts[i]
                    words[where] = (offset << 32) | length
                    words[posted] += 1
                words[asked] += 1
                bits |= handle.bit
            if bits:
                self._word[0] += 1   # (the master alone writes it)
                _bell.wake(self._address, bits)

    def close(self):
        self._word = self._mm = None   # the segment goes with the prefix


def ring_all(handles):
    """Wake ``handles``, sent a request through their zygote."""
    if handles and handles[0].board is not None:
        handles[0].board.ring(handles)


def signal_name(exitcode):
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return None


# -- starting ---------------------------------------------------------------


class ZygoteLink:
    """The master's end of one zygote and the batch of nodes it started:
    its control socket (in the scheduler's `Mux`), its process and the
    output pipe of its nodes (in the `LogPump`)."""

    def __init__(self, mux, handles, process, conn, on_gone=None,
                 replies=None):
        self.mux = mux
        self.handles = list(handles)   # by id; None once forgotten
        self.process = process
        self.pid = process.pid
        self.conn = conn
        self.replies = replies   # the batch's reply pipe, or None
        self._replied = bytearray()   # what was read of it: whole answers
        self.on_gone = on_gone
        self.closed = False

    def __repr__(self):
        return f"ZygoteLink(pid={self.pid}, nodes={len(self.handles)})"

    @classmethod
    def start(cls, ctx, mux, pump, batch, handles, sinks, on_gone=None,
              replies=False):
        """Start the zygote of ``batch`` (its nodes' ``handles`` and log
        ``sinks``, in batch order); returns before any node is ready.
        ``replies``: give the batch a reply pipe (its nodes answer the
        requests they read from the board on it)."""
        control, zygote_end = ctx.Pipe(duplex=True)
        out_r, out_w = ctx.Pipe(duplex=False)
        ends = [control, out_r, zygote_end, out_w]
        reply_r = reply_w = None
        if replies:
            try:
                reply_r, reply_w = ctx.Pipe(duplex=False)
            except BaseException:
                for end in ends:
                    end.close()
                raise
            os.set_blocking(reply_r.fileno(), False)
            ends += [reply_r, reply_w]
        # A zygote forked later closes these (and this zygote its copy).
        MASTER_ENDS.update((control, out_r))
        if reply_r is not None:
            MASTER_ENDS.add(reply_r)
        process = ctx.Process(target=Z.zygote_main,
                              args=(batch, zygote_end, out_w, reply_w),
                              name="lc-zygote", daemon=False)
        try:
            deferred = _start(process)
        except BaseException:
            for end in ends:
                MASTER_ENDS.discard(end)
                end.close()
            raise
        # only the zygote and its nodes hold these now: their EOF is real
        zygote_end.close()
        out_w.close()
        if reply_w is not None:
            reply_w.close()
        try:   # its own group, before the group watcher may kill it
            os.setpgid(process.pid, process.pid)
        except OSError:
            pass   # it did it first (or is no child of ours: forkserver)
        link = cls(mux, handles, process, control, on_gone, reply_r)
        now = time.monotonic()
        streams = pump.add_shared(out_r, [(h.name, s) for h, s in
                                          zip(handles, sinks)])
        for node_id, (handle, stream) in enumerate(zip(handles, streams)):
            handle.link, handle.id, handle.log = link, node_id, stream
            handle.started_at = now
        mux.add(link)
        log.debug("zygote %d starts %d node(s)", process.pid, len(handles))
        try:
            for sig in dict.fromkeys(deferred):  # the handlers run here
                signal.raise_signal(sig)
        except BaseException:
            for handle in handles:   # the caller never gets them
                handle.kill()
            raise
        return link

    def kill(self):
        """The zygote does not answer: SIGKILL it (its nodes get their
        parent-death signal) and close the link, every node of it dead."""
        try:
            self.process.kill()
        except (OSError, ValueError):
            pass   # gone, or closed already
        self.close(wait=SHUTDOWN_STEP)

    def command(self, kind, ids, arg):
        """``(kind, ids, arg)`` to the zygote; OSError if it is gone."""
        P.send(self.conn, (kind, ids, arg))

    def forget(self, handle):
        if self.handles[handle.id] is handle:
            self.handles[handle.id] = None
        self.mux.ready.pop(handle, None)

    def read(self):
        """Take one frame of events from the zygote into the inboxes."""
        try:
            events = P.recv(self.conn)
        except (EOFError, OSError):
            self.close()
            return
        if self.replies is not None and \
                any(kind != Z.MESSAGE for kind, _, _ in events):
            # what a node answered on the reply pipe before it died
            # comes before its death
            self.read_replies()
        ready = self.mux.ready
        for kind, node_id, value in events:
            handle = self.handles[node_id]
            if handle is None:
                continue
            if kind == Z.MESSAGE:
                handle.inbox.append(pickle.loads(value))
            else:
                handle._exitcode = value
                handle.gone = True
                handle.inbox.append(DEATH)
            ready[handle] = None

    def read_replies(self):
        """Take the answers waiting on the batch's reply pipe into the
        inboxes."""
        replies, ready = self.replies, self.mux.ready
        if replies is None:
            return
        buffer = self._replied
        try:
            while True:
                data = os.read(replies.fileno(), 1 << 16)
                if not data:
                    # every node and the zygote are gone: nothing more
                    # comes (the control socket says the rest)
                    self.mux.drop_replies(self)
                    break
                buffer += data
                if len(data) < 1 << 16:
                    break
        except BlockingIOError:
            pass
        except OSError:
            self.mux.drop_replies(self)
        at, size, head = 0, len(buffer), REPLY_HEAD.size
        while size - at >= head:
            node_id, length = REPLY_HEAD.unpack_from(buffer, at)
            if size - at < head + length:
                break   # (never: a write of an answer is whole)
            handle = self.handles[node_id] if node_id < len(self.handles) \
                else None
            if handle is not None:
                handle.inbox.append(pickle.loads(
                    buffer[at + head:at + head + length]))
                ready[handle] = None
            at += head + length
        del buffer[:at]

    def close(self, wait=ZYGOTE_WAIT):
        """The zygote is gone (EOF) or is told to go: reap it; a node it
        did not report is dead with it."""
        if self.closed:
            return
        self.read_replies()   # what came before the end
        self.closed = True
        try:
            P.send(self.conn, (Z.BYE, (), None))
        except OSError:
            pass
        self.mux.remove(self)
        process = self.process
        process.join(wait)
        if process.exitcode is None:
            process.kill()
            process.join(wait)
        for handle in self.handles:
            if handle is not None and not handle.gone:
                handle.gone = True
                handle.inbox.append(DEATH)
                self.mux.ready[handle] = None
        MASTER_ENDS.discard(self.conn)
        self.conn.close()
        if self.replies is not None:
            MASTER_ENDS.discard(self.replies)
            self.replies.close()
            self.replies = None
        try:
            process.close()
        except ValueError:   # reaped by someone else: no status to close
            log.warning("zygote %d could not be reaped", self.pid)
        if self.on_gone is not None:
            self.on_gone(self)


def _start(process):
    """``process.start()``; the stop signals that came meanwhile, to be
    raised by the caller once the process is wholly its own."""
    # Unflushed output would be written again by the forked child.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    # A Python signal handler that raises during the fork loses its
    # exception (it runs inside an at-fork hook, whose exceptions CPython
    # prints and drops) and the master would go on as if nothing came:
    # while the process starts, the handlers of the stop signals only
    # note a signal, raised again once the zygote is wholly ours -- or
    # its nodes killed, if that raises.  (Handlers run in the main thread
    # only: from another thread there is nothing to hold.)
    deferred, master, held = [], os.getpid(), {}

    def note(signum, frame):
        if os.getpid() != master:
            # the new process, before it reset the master's handlers: a
            # signal does to it what it would have done without them
            if signum != signal.SIGINT:  # Ctrl-C is the master's
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        deferred.append(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if callable(signal.getsignal(sig)):
                held[sig] = signal.signal(sig, note)
    started = False
    try:
        process.start()
        started = True
        # The link reaps its process itself: out of multiprocessing's list
        # of children, which every Process.start polls with one waitpid
        # per live child.
        multiprocessing.process._children.discard(process)
    finally:
        for sig, old in held.items():
            signal.signal(sig, old)
        if not started:  # the start failed: the signal still counts
            for sig in dict.fromkeys(deferred):
                signal.raise_signal(sig)
    return deferred


def make_batch(ctx, specs, plans=None):
    """The `Batch` of a zygote that starts ``specs``."""
    method = ctx.get_start_method()
    if method == "fork":
        Z.preload()   # once in the master: every zygote inherits them
    return Z.Batch(os.getpid(),
                   pdeathsig=method != "forkserver" and
                   threading.current_thread() is threading.main_thread(),
                   forked=method == "fork", target=node_main, specs=specs,
                   plans=plans)


def node_spec(name, prefix, kwargs, control, faults=None, plan_ids=(),
              board=None):
    return NodeSpec(name, prefix, kwargs, os.getpid(), pdeathsig=True,
                    control=control, faults=faults, plan_ids=plan_ids,
                    board=board)


def send_all(handles, msg):
    """Send ``msg`` to each of ``handles``: pickled once, one command per
    zygote (then the nodes are woken); the handles whose zygote is gone
    (not sent)."""
    raw = Z.frame(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))
    failed = []
    for link, group in _by_link(handles).items():
        try:
            if link is None:
                raise OSError
            link.command(Z.SEND, [h.id for h in group], raw)
        except OSError:
            failed.extend(group)
            continue
        ring_all(group)
    return failed


def send_each(sends, board=None):
    """Send each ``(handles, msg)`` of ``sends``; the handles whose zygote
    is gone (not sent).  Each message is pickled once.  With a `Board`, a
    message that fits is written there once, each of its nodes is told
    where, and all of them are woken with one system call: none of their
    zygotes' is on the way.  The others go through the zygotes, all of a
    zygote's in one command (a run's requests reach a batch in one write,
    whatever their number)."""
    by_link, failed, posted, where = {}, [], [], []
    if board is not None:
        board.clear()
    for handles, msg in sends:
        data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        offset = None if board is None else board.put(data)
        if offset is not None:
            for handle in handles:
                link = handle.link
                if link is None or link.closed:
                    failed.append(handle)
                else:
                    posted.append(handle)
                    where.append((offset, len(data)))
            continue
        raw = Z.frame(data)
        for link, group in _by_link(handles).items():
            by_link.setdefault(link, []).append((group, raw))
    if posted:
        board.ring(posted, where)
    for link, pairs in by_link.items():
        try:
            if link is None:
                raise OSError
            link.command(Z.SENDS, None,
                         [([h.id for h in group], raw)
                          for group, raw in pairs])
        except OSError:
            for group, _ in pairs:
                failed.extend(group)
            continue
        ring_all([h for group, _ in pairs for h in group])
    return failed


def signal_all(handles, sig):
    """Send ``sig`` to each of ``handles``' processes (not their
    groups), through their zygotes."""
    for link, group in _by_link(handles).items():
        try:
            if link is not None:
                link.command(Z.SIGNAL, [h.id for h in group], sig)
        except OSError:
            pass   # the zygote is gone: so are its nodes


def _by_link(handles):
    """``{link: [handle, ...]}`` (None: the handles of no live zygote)."""
    out = {}
    for handle in handles:
        link = handle.link
        if link is not None and link.closed:
            link = None
        out.setdefault(link, []).append(handle)
    return out


# -- waiting ----------------------------------------------------------------


class Mux:
    """One persistent poll set over the control sockets of a scheduler's
    zygotes; ``ready``: the handles whose inbox holds something."""

    def __init__(self):
        self._poll = select.poll()
        self._links = {}
        self._replies = {}   # reply pipe fd -> link
        self.ready = {}   # handle -> None, in arrival order

    def __len__(self):
        return len(self._links)

    def links(self):
        return list(self._links.values())

    def add(self, link):
        fd = link.conn.fileno()
        self._poll.register(fd, select.POLLIN)
        self._links[fd] = link
        if link.replies is not None:
            fd = link.replies.fileno()
            self._poll.register(fd, select.POLLIN)
            self._replies[fd] = link

    def remove(self, link):
        for fd, owner in list(self._links.items()):
            if owner is link:
                self._poll.unregister(fd)
                del self._links[fd]
        self.drop_replies(link)

    def drop_replies(self, link):
        """Stop waiting on ``link``'s reply pipe."""
        for fd, owner in list(self._replies.items()):
            if owner is link:
                self._poll.unregister(fd)
                del self._replies[fd]

    def discard(self, handle):
        self.ready.pop(handle, None)

    def read(self, deadline):
        """Read what the zygotes sent before ``deadline``; False if
        nothing came."""
        if deadline is None:
            ms = None
        else:
            ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
        if not self._links:
            # nothing can come; a caller without a deadline looks again
            time.sleep(0.05 if ms is None else ms / 1000)
            return False
        ready = self._poll.poll(ms)
        for fd, _ in ready:
            link = self._replies.get(fd)
            if link is not None:
                link.read_replies()
                continue
            link = self._links.get(fd)
            if link is not None:
                link.read()
        return bool(ready)

    def wait(self, deadline):
        """``(handle, kind)`` of every node whose inbox holds something,
        waiting until ``deadline`` for one."""
        while not self.ready:
            if not self.read(deadline):
                if deadline is not None and time.monotonic() >= deadline:
                    return []
        return [(h, h.kind()) for h in list(self.ready) if h.inbox]


def _mux_of(handles):
    for handle in handles:
        if handle.link is not None:
            return handle.link.mux
    return None


def wait_events(handles, deadline, kinds=(CONN, SENTINEL)):
    """``(handle, kind)`` of ``handles`` whose inbox holds a message
    (CONN) or only their death (SENTINEL) -- of the ``kinds`` asked for --
    before ``deadline`` (monotonic seconds; None: no bound); an empty list
    when the deadline passed first.  (What is ready is looked up among
    the handles with something in their inbox: a wait for many nodes
    costs nothing per node that has not spoken.)"""
    if not isinstance(handles, (set, frozenset)):
        handles = set(handles)
    mux = _mux_of(handles)
    while True:
        if mux is not None:
            found = [(h, h.kind()) for h in list(mux.ready)
                     if h in handles and h.kind() in kinds]
        else:
            found = [(h, h.kind()) for h in handles if h.kind() in kinds]
        if found:
            return found
        if mux is None:
            if deadline is not None:
                time.sleep(max(0.0, deadline - time.monotonic()))
            return []
        if not mux.read(deadline) and deadline is not None and \
                time.monotonic() >= deadline:
            return []


def _wait_gone(handles, deadline, extend=None):
    """Wait until the zygotes reported the death of each of ``handles``
    (or ``deadline``; with ``extend``, the deadline moves to ``extend``
    seconds after each death that came: many nodes stopping on few cores
    are given the time they take, as long as they keep stopping)."""
    mux = _mux_of(handles)
    left = [h for h in handles if not h.gone]
    while mux is not None and left:
        if not mux.read(deadline) and deadline is not None and \
                time.monotonic() >= deadline:
            return
        still = [h for h in left if not h.gone]
        if extend is not None and len(still) < len(left):
            deadline = time.monotonic() + extend
        left = still


def kill_all(handles, sig):
    """Send ``sig`` to the process group of each of ``handles`` (one
    command per zygote)."""
    for link, group in _by_link([h for h in handles if not h.gone]).items():
        if link is None:
            continue
        try:
            link.command(Z.KILL, [h.id for h in group], sig)
        except OSError:
            pass   # the zygote is gone: so are its nodes


def await_ready(handles, timeout=None):
    """Wait for each new node's READY, each within `START_TIMEOUT` of its
    start -- or within ``timeout`` (the run's, in seconds) if that is
    shorter: a node stopped or starved before it is ready holds a run no
    longer than the run's own bound.  If one does not start, kill every
    node still starting and raise: a `RunTimeoutError` naming the late
    nodes when the run's timeout was the bound, else a `NodeFailedError`
    (as for a node that died starting, whose error says why)."""
    bound = START_TIMEOUT if timeout is None else min(START_TIMEOUT, timeout)
    waiting = set(handles)
    problems = []
    # (the earliest start among the waiting, worked out again only when
    # its deadline passes: not once per event)
    first = min(h.started_at for h in waiting) if waiting else 0
    while waiting:
        ready = wait_events(waiting, first + bound)
        if not ready:
            now = time.monotonic()
            late = [h for h in waiting if now >= h.started_at + bound]
            if not late:
                first = min(h.started_at for h in waiting)
                continue
            kill_all(waiting, signal.SIGKILL)
            _wait_gone(waiting, time.monotonic() + SHUTDOWN_STEP)
            for handle in waiting:
                handle.reap()
            raise _not_started(sorted(h.name for h in late),
                               sorted(h.name for h in waiting), bound,
                               by_run=timeout is not None and
                               timeout <= START_TIMEOUT)
        for handle, kind in ready:
            if handle not in waiting:
                continue
            waiting.discard(handle)
            problem = _ready_problem(handle, kind)
            if problem is not None:
                problems.append(problem)
    if problems:
        raise problems[0]


def _not_started(late, killed, bound, by_run):
    """The error of nodes ``late`` that were not ready ``bound`` seconds
    after they were started (``killed``: the nodes killed for it)."""
    names = ", ".join(map(repr, late))
    what = f"node {names}" if len(late) == 1 else f"nodes {names}"
    what += " did not start"
    why = ("stopped, or starved of CPU, before ready; killed, it starts "
           "again on the next run")
    if not by_run:
        return NodeFailedError(f"{what} within {bound:g} s ({why})",
                               node=late[0])
    return RunTimeoutError(
        f"{what} within the run's timeout of {bound:g} s ({why})",
        nodes=late, killed=killed, starting=True)


def _ready_problem(handle, kind):
    """None when ``handle`` said READY; else its NodeFailedError."""
    try:
        msg = handle.recv()
    except EOFError:
        return handle.death_error("starting")
    handle.pid = msg[1]
    if msg[2] is None:
        return None
    handle.reap()
    return NodeFailedError(
        f"node {handle.name!r} could not start: {msg[2]}; check its "
        "Node(...) options", node=handle.name)


def read_goodbyes(handles, deadline, extend=None):
    """Read each node's answer to SHUTDOWN: a node whose pipe ends without
    its ``bye`` crashed while shutting down (said in the log).  Waits
    until ``deadline`` -- moved to ``extend`` seconds after each answer,
    if given."""
    waiting = set(handles)
    while waiting:
        ready = wait_events(waiting, deadline)
        if not ready:
            break
        if extend is not None:
            deadline = time.monotonic() + extend
        for handle, _ in ready:
            try:
                msg = handle.recv()
            except EOFError:
                waiting.discard(handle)
                log.warning(
                    "node %r crashed while shutting down (exit %s) before it"
                    " said goodbye", handle.name, handle.exitcode)
                continue
            if msg[0] == P.BYE:
                waiting.discard(handle)


def join_all(handles, timeout, extend=False):
    """Wait (``timeout`` seconds at most -- after the last death that
    came, if ``extend``) until the nodes' zygotes reaped them -- and what
    they started, which goes with them."""
    _wait_gone(list(handles), time.monotonic() + timeout,
               timeout if extend else None)
