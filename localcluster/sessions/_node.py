"""The node process: a thin adapter around one `NodeRuntime`.

::

    master ~ zygote --(requests)---------------------> [main thread]
       <--(replies, outputs as shm descriptors)------  runs one at a time
    cancel: rid -> control word (shm), then SIGUSR1 --> [watcher thread]
                                          runtime.cancel(rid)
    zygote hangs up (POLLRDHUP) ----------------------> [watcher thread]
    stdout/stderr fds --> [forwarder thread] --(frames)--> master

The node's socket leads to its zygote (`_zygote`), which relays every
message unchanged to and from the master; "the master" below is the
master behind it -- the zygote goes when the master goes.  A run comes
another way: the idle node sleeps on the run word (`_bell`), and the
master counts every request it makes of the node in the node's control
slot, then wakes it; a request posted on the master's run board is read
there (the slot says where) and answered on the batch's reply pipe,
straight to the master; any other comes on the socket (and is answered
there).  Asleep, the node wakes at the latest every `WORD_WAIT` seconds;
the watcher wakes it when the master hangs up, so the main loop reads
the socket's EOF.  Its output goes as frames on the pipe its batch
shares (`_plumbing.FrameWriter`).
A plan the zygote was given is inherited packed and loaded at the first
run that names it.

The runtime does the node's work (plans, workspace, runs, queues); this
module turns the pipe protocol (`_protocol`) into calls on it and owns
what is the process's: the shared-memory store the workspace lives in,
the descriptors outputs travel as (`_Outbox`), signals, the master
watch, output redirection and limits (`_plumbing`), and its process
title, ``localcluster: <node> (<master pid>)`` (`_title`), set first.

The main thread reads requests itself; no thread hand-off sits on the path
of a request.  A cancellation cannot come through the pipe while the main
thread is busy, so the master writes the run id to cancel into a shared
control word and sends SIGUSR1; the handler only wakes the watcher
thread (a byte on a pipe), which calls ``runtime.cancel(rid)`` -- a
cancel that arrives before its run starts cancels it as it starts.  The
watcher waits on that pipe and on the master's hang-up in one poll: two
threads beside the main one (the watcher, the output forwarder), not
three -- a thread is a good part of what starting a thousand nodes costs.

The process leads its own process group, which the processes it starts
share; whatever notices that the master is gone ends that whole group
(`end_own_group`), so neither the node nor its children outlive the
master: the parent-death signal when its parent, the zygote, dies
(Linux; its handler runs in the main thread, at once unless native code
holds the interpreter), the main loop at pipe EOF, or the watcher, which
on the pipe's hang-up cancels the run and ends the group if the main loop
has not within `MASTER_GONE_GRACE` (an op deaf to cancellation; no
parent-death signal under forkserver).  A clean exit is announced with
``("bye", rid)``, so any other exit is a crash.

A node out of memory outside its ops -- loading a plan, taking a fed
blob, packing outputs, reading a request, starting -- or past its
``memory_limit`` anywhere, answers the request (if it can) with a
``memory`` error saying what it was doing, and ends with `EXIT_MEMORY`:
the master reports one error naming the node and memory, and restarts it
empty on the next run.  No traceback is printed: that would be the only
thing the user saw of it, twice.  A `MemoryError` an op raises (without a
``memory_limit``) fails that op, like any other error of it.
"""

import gc
import logging
import os
import pickle
import select
import signal
import struct
import threading

import numpy as np

from ..errors import TaskFailedError
from ..plan.packing import unpack_plan
from ..runtime import shm
from ..runtime.channels import LocalChannel
from ..runtime.faults import NodeFaults, die_in_process, mapped_book
from ..runtime.host import NodeRuntime
from ..runtime.shm_channel import ShmChannel
from . import _bell
from . import _protocol as P
from ._plumbing import (MASTER_GONE_SIGNAL, Output, apply_node_options,
                        end_own_group, reset_signal_handlers,
                        set_parent_death_signal)
from ._title import set_title

log = logging.getLogger(__name__)

#: exit status of a node that stopped because it ran out of memory (past
#: its memory_limit, or outside its ops)
EXIT_MEMORY = 86
#: exit status of a node that ended itself: its master was gone
EXIT_ORPHANED = 87
#: seconds a node whose master is gone gives its run to stop by itself
MASTER_GONE_GRACE = 0.3
#: seconds an idle node sleeps on the run word before it looks again (a
#: wake-up is never missed: this only bounds the wait)
WORD_WAIT = 5.0


class NodeSpec:
    """What a node process needs to start (picklable for spawn)."""

    def __init__(self, name, prefix, kwargs, master_pid, pdeathsig,
                 control, close_inherited=None, faults=None, plan_ids=(),
                 board=None):
        self.name = name
        self.prefix = prefix            # segment prefix of this incarnation
        #: (segment, slot): the node's control slot (`_bell`: the run id
        #: to cancel, its requests counted, where its board requests are)
        self.control = control
        #: the segment of the master's run board (None: none; every
        #: request comes on the node's socket)
        self.board = board
        #: (reply pipe write end, the node's id in its batch), set by its
        #: zygote
        self.replies = None
        self.kwargs = kwargs            # cpus, memory_limit, env
        self.master_pid = master_pid
        self.pdeathsig = pdeathsig
        self.close_inherited = close_inherited  # fork only: other nodes' fds
        self.faults = faults    # (fault book segment, [(index, fault)])
        #: the parent whose death ends the node (its zygote, or the master)
        self.parent_pid = master_pid
        self.forked = close_inherited is not None
        self.plan_ids = tuple(plan_ids)   # plans its zygote was given
        self.plans = {}     # {plan id: packed plan} inherited, unloaded


def node_main(spec, conn, log_conn):
    """Entry point of a node process."""
    try:
        _node_main(spec, conn, log_conn)
    except MemoryError:
        # starting, or past what serve() answers: the exit status says it
        os._exit(EXIT_MEMORY)


def _node_main(spec, conn, log_conn):
    set_title(spec.name, spec.master_pid)   # ps shows the node from now on
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # already a group leader (the master set it first)
    reset_signal_handlers()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the master's
    if spec.pdeathsig:  # only when the master is our parent (not forkserver)
        signal.signal(MASTER_GONE_SIGNAL, _master_gone)
        set_parent_death_signal(MASTER_GONE_SIGNAL)
        if os.getppid() != spec.parent_pid:
            os._exit(1)  # the parent died before we armed the signal
    if spec.forked:
        # Forked: what the master's heap holds is not this process's to
        # collect -- a collection would write to (and so copy) every page
        # of it, and freeing the master's unreachable objects here could
        # unmap what this process mapped since at the same address.
        gc.freeze()
        if spec.close_inherited is not None:
            spec.close_inherited()
    output = Output(log_conn)
    problem = apply_node_options(spec.kwargs)
    server = _NodeServer(spec, conn, output)
    P.send(conn, (P.READY, os.getpid(), problem))
    if problem is not None:
        os._exit(2)
    code = server.serve()
    output.drain()
    os._exit(code)


def _master_gone(signum, frame):
    """The parent-death signal: the master is gone, and so is the node --
    with every process it started (its group), which a SIGKILL of the
    node alone would leave running, adopted by init."""
    end_own_group()


class _ShmChannels:
    """The channel factory of a node process: a queue the master made a
    shared-memory channel for is that channel (this node's end, kept
    across runs until the master says to `release` it); any other queue
    is in-process."""

    def __init__(self):
        self.kept = {}   # channel prefix -> ShmChannel

    def release(self, prefixes):
        """Drop the channels the master released (between runs: none of
        them is in use); unknown prefixes -- channels this incarnation
        never opened -- are ignored."""
        for prefix in prefixes:
            channel = self.kept.pop(prefix, None)
            if channel is not None:
                channel.release()

    def __call__(self, queue_id, capacity, descriptors):
        desc = descriptors.get(queue_id) if descriptors else None
        if desc is None:
            return LocalChannel(capacity, queue_id)
        channel = self.kept.get(desc["prefix"])
        if channel is None:
            channel = self.kept[desc["prefix"]] = ShmChannel(desc)
        channel.begin()
        return channel


class _NodeServer:
    def __init__(self, spec, conn, output):
        self.spec = spec
        self.output = output
        self.conn = conn
        self.requests = P.Reader(conn)  # the main thread alone reads them
        self.store = shm.ShmStore(spec.prefix)
        self.channels = _ShmChannels()
        self.inherited = dict(spec.plans)   # plan id -> packed, unloaded
        self.runtime = NodeRuntime(spec.name, store=self.store,
                                   channel_factory=self.channels,
                                   faults=self._faults(spec))
        segment, slot = spec.control
        self.control = shm.map_segment(segment)
        self.slot = np.ndarray(_bell.WORDS, np.int64, buffer=self.control,
                               offset=8 * _bell.WORDS * slot)
        self.control_word = self.slot[_bell.CANCEL:_bell.CANCEL + 1]
        self.board = self.word = None
        if spec.board is not None and spec.replies is not None:
            self.board = shm.map_segment(spec.board, writable=True)
            self.run_word = np.ndarray(1, np.int32, buffer=self.board)
            self.word = _bell.address_of(self.run_word)
            self.bit = _bell.bit_of(slot)
            self.sleeper = _bell.Sleeper(self.word, self.bit)
            self.hung_up = False   # the watcher saw the master hang up
            self.reply_fd, self.node_id = spec.replies
        self.posts = 0      # board requests read
        self.from_socket = 0   # socket requests read
        # the cancel signal's wake-up: its handler writes, the watcher reads
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.outbox = _Outbox(spec.prefix + "out")
        self.send_lock = threading.Lock()
        self.posted = False   # the request being served came on the board
        self.finished = threading.Event()   # the main loop ended
        signal.signal(signal.SIGUSR1, self._on_cancel_signal)
        threading.Thread(target=self._watch_master, daemon=True,
                         name="lc:watcher").start()

    @staticmethod
    def _faults(spec):
        """The node's `NodeFaults`: a `Kill` ends this process for real."""
        if not spec.faults or not spec.faults[1]:
            return None
        book, faults = spec.faults
        return NodeFaults(spec.name, faults, mapped_book(book),
                          die_in_process)

    def send(self, msg):
        with self.send_lock:
            P.send(self.conn, msg)

    # -- cancellation -------------------------------------------------------

    def _on_cancel_signal(self, signum, frame):
        try:
            os.write(self.wake_w, b"\0")   # safe in a handler
        except OSError:
            pass   # full: the watcher is woken already

    def _watch_master(self):
        """Cancel the run the control word names at each cancel signal;
        when the master hangs up, stop the run and end the node."""
        poller = select.poll()
        master = self.conn.fileno()
        poller.register(master, select.POLLRDHUP)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            try:
                ready = dict(poller.poll())
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except OSError:
                    pass   # drained
                self.runtime.cancel(int(self.control_word[0]))
            if master in ready:
                break
        # The master is gone: stop the run; the main loop then sees EOF
        # and ends (asleep on the run word, it is woken to read its socket).
        # An op that never looks at its cancellation would keep
        # the node alive (there is no parent-death signal under forkserver,
        # or when the master's launching thread lives on), so the node
        # ends itself -- and what it started -- if the loop has not.
        self.runtime.cancel()
        if self.word is not None:
            self.hung_up = True
            try:
                _bell.wake_all(self.word)
            except OSError:
                pass
        if not self.finished.wait(MASTER_GONE_GRACE):
            try:
                end_own_group()
            finally:
                os._exit(EXIT_ORPHANED)

    # -- requests -----------------------------------------------------------

    def serve(self):
        try:
            return self._serve()
        finally:
            self.finished.set()

    def _next(self):
        """The next request, and whether it came from the board.  With a
        board: asleep on the run word until the master asks -- a request
        posted on the board, or one sent through the zygote (read from
        the socket, which may wait for the zygote to relay it)."""
        if self.word is None:
            return self.requests.recv(), False
        slot, run_word, sleeper = self.slot, self.run_word, self.sleeper
        while True:
            # the word first, then the counts: the master counts, then
            # changes the word and wakes.  It counts a post before it
            # counts the request, so ``asked - posts`` may fall short of
            # the requests sent through the zygote -- even below what was
            # read, when this node served a post before the master counted
            # it as asked -- but never exceeds them: only more than were
            # read means one is waiting on the socket (else the master's
            # count, when it comes, changes the word and wakes us)
            seen = int(run_word[0])
            asked = int(slot[_bell.ASKED])
            posts = int(slot[_bell.POSTS])
            if posts != self.posts:
                self.posts = posts
                where = int(slot[_bell.WHERE])
                start = where >> 32
                return pickle.loads(
                    self.board[start:start + (where & 0xffffffff)]), True
            if asked - posts > self.from_socket or self.hung_up:
                msg = self.requests.recv()   # EOFError once hung up
                self.from_socket += 1
                return msg, False
            sleeper.sleep(seen, WORD_WAIT)

    def _serve(self):
        while True:
            try:
                msg, self.posted = self._next()
            except (EOFError, OSError):
                # The master is gone: so is this node, and what it started
                # (it would live on, adopted by init).
                self.close()
                end_own_group()
            except MemoryError:
                # no room for the request itself: there is no rid to
                # answer; the exit status tells the master
                return self._out_of_memory()
            kind, rid = msg[0], msg[1]
            if kind == P.SHUTDOWN:
                self.close()
                try:
                    self.send((P.BYE, rid))
                except (OSError, EOFError):
                    pass
                return 0
            try:
                reply = self.handle(kind, rid, msg[2:])
                self._reply(reply)
            except _OutOfMemory as exc:
                return self._out_of_memory(rid, exc)
            except MemoryError as exc:  # the reply itself had no room
                return self._out_of_memory(
                    rid, _OutOfMemory(exc, "sending its answer to the "
                                      "master"))

    def _out_of_memory(self, rid=None, exc=None):
        """Answer ``rid`` with the memory error ``exc`` (if there is room
        for that), release what the node holds; the exit status."""
        try:
            if rid is not None:
                info = P.error_info(exc.error, P.MEMORY)
                info["doing"] = exc.doing
                self._reply((P.ERROR, rid, info))
        except MemoryError:
            pass  # the exit status says it
        try:
            self.close()
        except MemoryError:
            pass  # the master sweeps the node's segments
        return EXIT_MEMORY

    def _reply(self, msg):
        # Output written before the reply reaches the master first: the
        # reply carries how many output bytes were sent up to it.
        mark = self.output.drain()
        try:
            self._send_reply(msg + (mark,))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            # A value that cannot travel (an object array, say) fails this
            # request, not the node.
            self._send_reply((P.ERROR, msg[1], P.error_info(exc), mark))

    def _send_reply(self, msg):
        try:
            if self.posted:
                # a request read from the board: answered straight to the
                # master, on the batch's reply pipe, if it fits in one
                # write that stays whole (`_handle.REPLY_MAX`)
                data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
                if len(data) <= _REPLY_MAX:
                    with self.send_lock:
                        os.write(self.reply_fd,
                                 _REPLY_HEAD.pack(self.node_id, len(data)) +
                                 data)
                    return
            self.send(msg)
        except (OSError, EOFError):
            pass  # the master is gone; the next recv sees EOF

    def close(self):
        self.runtime.close()
        self.store.close()
        self.outbox.close()

    def handle(self, kind, rid, args):
        try:
            if kind == P.RUN:
                return (P.OK, rid, self.run(rid, *args))
            if kind == P.FETCH:
                return (P.OK, rid, self.describe(args[0]))
            if kind == P.FEED:
                name, segment, shape, dtype = args
                self.store.adopt(name, segment, shape, dtype)
                return (P.OK, rid, None)
            if kind == P.BLOBS:
                return (P.OK, rid, self.runtime.blobs())
            if kind == P.HAS:
                return (P.OK, rid, self.runtime.has(args[0]))
            raise ValueError(f"unknown request {kind!r}")
        except _OutOfMemory:
            raise
        except _PlanLoadError as exc:
            if _is_memory(exc.error):
                raise _OutOfMemory(exc.error, "loading the plan it was "
                                   "sent") from exc
            return (P.ERROR, rid, P.error_info(exc.error, P.PLAN))
        except BaseException as exc:  # noqa: BLE001 - sent to the master
            if _is_memory(exc) and (self.spec.kwargs.get("memory_limit") or
                                    not isinstance(exc, TaskFailedError)):
                raise _OutOfMemory(exc, None if isinstance(
                    exc, TaskFailedError) else _doing(kind, args)) from exc
            return (P.ERROR, rid, P.error_info(exc))

    def run(self, rid, plan_id, plan_bytes, channels, options=None):
        """Run a plan (sent now, or kept from an earlier run: the master
        mirrors the runtime's plan cache -- same size, same eviction),
        after releasing the queue channels the master no longer uses."""
        options = options or {}
        if "release" in options:
            self.channels.release(options["release"])
        if plan_bytes is None:
            # a plan its zygote was given: loaded at its first run
            plan_bytes = self.inherited.pop(plan_id, None)
        if plan_bytes is not None:
            try:
                plan = unpack_plan(plan_bytes)
            except BaseException as exc:  # noqa: BLE001 - a plan error
                raise _PlanLoadError(exc) from exc
            self.runtime.load(plan_id, plan)
        # a cancel signalled before this run began counts for it
        self.runtime.cancel(int(self.control_word[0]))
        result = self.runtime.run(rid, plan_id, channels,
                                  bool(options.get("trace")),
                                  copy_outputs=False,
                                  epoch=options.get("epoch"),
                                  conditions=options.get("conditions"))
        return {"outputs": self.outbox.pack(result.outputs),
                "seconds": result.seconds, "trace": result.trace}

    def describe(self, name):
        value = self.runtime.fetch(name)
        if value is None:
            return None
        segment = self.store.segment_of(name)
        if segment is None:  # not in shared memory (object arrays)
            return {"inline": np.array(value, copy=True)}
        return {"segment": segment, "shape": value.shape,
                "dtype": value.dtype.str}


#: the reply pipe's framing (`_handle.REPLY_HEAD`, `_handle.REPLY_MAX`)
_REPLY_HEAD = struct.Struct("!II")
_REPLY_MAX = select.PIPE_BUF - _REPLY_HEAD.size


def _is_memory(exc):
    while exc is not None:
        if isinstance(exc, MemoryError):
            return True
        exc = exc.__cause__
    return False


def _doing(kind, args):
    """What a node handling request ``kind`` with ``args`` was doing."""
    if kind == P.RUN:
        return "running a plan, outside its ops"
    if kind == P.FEED:
        return f"taking blob {args[0]!r} fed to it"
    if kind == P.FETCH:
        return f"giving blob {args[0]!r} to the master"
    return f"answering the master's {kind!r}"


class _OutOfMemory(Exception):
    """A `MemoryError` that ends the node: ``error`` (what was raised) and
    what the node was ``doing``."""

    def __init__(self, error, doing=None):
        super().__init__(str(error))
        self.error, self.doing = error, doing


class _PlanLoadError(Exception):
    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


class _Outbox:
    """One reusable segment the node packs a run's outputs into."""

    ALIGN = 64

    def __init__(self, prefix):
        self.prefix = prefix
        self.seq = 0
        self.segment = None
        self.mm = None

    def pack(self, values):
        if not values:
            return {}
        arrays = {k: np.asarray(v, order="C") for k, v in values.items()}
        offsets, total = {}, 0
        for name, a in arrays.items():
            offsets[name] = total
            total += -(-max(a.nbytes, 1) // self.ALIGN) * self.ALIGN
        if self.mm is None or len(self.mm) < total:
            self.close()
            self.seq += 1
            self.segment, self.mm = shm.create_unique(
                f"{self.prefix}{self.seq}_", max(total, 4096),
                what="a run's outputs")
        out = {}
        for name, a in arrays.items():
            if a.dtype.hasobject:
                out[name] = {"inline": a.copy()}
                continue
            view = np.ndarray(a.shape, a.dtype, buffer=self.mm,
                              offset=offsets[name])
            np.copyto(view, a)
            out[name] = {"segment": self.segment, "offset": offsets[name],
                         "shape": a.shape, "dtype": a.dtype.str}
        return out

    def close(self):
        if self.segment is not None:
            shm.unlink(self.segment)
            self.segment = None
        self.mm = None
