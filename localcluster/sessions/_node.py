"""The node process: hosts one node's runtime for a LocalHostScheduler.

::

    master --(requests)------------------------------> [main thread]
       <--(replies, outputs as shm descriptors)------  runs one at a time
    cancel: rid -> control word (shm), then SIGUSR1 --> [canceller thread]
                                    sets the run's event if rid is current
    master hangs up (POLLRDHUP) ----------------------> [watcher thread]
    stdout/stderr fds --> [forwarder thread] --(stream, bytes)--> master

The main thread reads requests itself and runs them against the node's
global `Workspace`, whose arrays live in shared memory (`ShmStore`); no
thread hand-off sits on the path of a request.  A cancellation cannot come
through the pipe while the main thread is busy, so the master writes the
run id to cancel into a shared control word and sends SIGUSR1; the signal
handler only wakes the canceller thread (a reentrant queue put), which
cancels the run if that id is the current one -- a cancellation that
arrives before its run starts is seen when it starts.  The process is its
own process group, gets SIGKILL if the master's launching thread dies
(Linux parent-death signal), and the watcher cancels the run and the main
loop ends on pipe EOF when the master goes away; a clean exit is announced
with ``("bye", rid)``, so any other exit is a crash.
"""

import collections
import ctypes
import io
import logging
import os
import pickle
import queue
import resource
import select
import selectors
import signal
import sys
import threading
import time

import numpy as np
import psutil

from ..kernels import registry
from ..runtime import shm
from ..runtime.channels import ChannelHub, LocalChannel
from ..runtime.shm_channel import ShmChannel
from ..runtime.executor import RunContext
from ..runtime.node import run_node_plan
from ..runtime.workspace import Workspace
from . import _protocol as P

log = logging.getLogger(__name__)

#: exit status of a node that stopped because it exceeded memory_limit
EXIT_MEMORY = 86

_PR_SET_PDEATHSIG = 1


class NodeSpec:
    """What a node process needs to start (picklable for spawn)."""

    def __init__(self, name, prefix, kwargs, master_pid, pdeathsig,
                 control, close_inherited=None):
        self.name = name
        self.prefix = prefix            # segment prefix of this incarnation
        self.control = control          # segment: int64 rid to cancel
        self.kwargs = kwargs            # cpus, memory_limit, env
        self.master_pid = master_pid
        self.pdeathsig = pdeathsig
        self.close_inherited = close_inherited  # fork only: other nodes' fds


def node_main(spec, conn, log_conn):
    """Entry point of a node process."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # already a group leader (the master set it first)
    if spec.pdeathsig:  # only when the master is our parent (not forkserver)
        _set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != spec.master_pid:
            os._exit(1)  # the master died before we armed the signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the master's
    if spec.close_inherited is not None:
        spec.close_inherited()
    output = _Output(log_conn)
    problem = _apply_kwargs(spec.kwargs)
    store = shm.ShmStore(spec.prefix)
    server = _NodeServer(spec, conn, Workspace(spec.name, store=store), store,
                         output)
    P.send(conn, (P.READY, os.getpid(), problem))
    if problem is not None:
        os._exit(2)
    code = server.serve()
    output.drain()
    os._exit(code)


def _set_parent_death_signal(sig):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: pipe EOF still ends the node


class _Output:
    """Sends everything written to fds 1 and 2 to the master, tagged.

    A thread forwards output as it comes; `drain` (called before a reply)
    forwards what is left and returns how many bytes were sent in all, so
    the master can wait until it has shown a run's output before the run
    returns.
    """

    def __init__(self, log_conn):
        self.conn = log_conn
        self.lock = threading.Lock()
        self.sent = 0
        self.pipes = {}
        for fd, tag in ((1, "out"), (2, "err")):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            os.set_blocking(r, False)
            self.pipes[r] = tag
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False),
                                      line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False),
                                      line_buffering=True)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and \
                    not isinstance(handler, logging.FileHandler):
                handler.setStream(sys.stderr)
        threading.Thread(target=self._pump, daemon=True,
                         name="lc:output").start()

    def _forward(self, fd):
        """Forward what fd has now; False at EOF."""
        with self.lock:
            while True:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    return True
                if not data:
                    return False
                try:
                    self.conn.send((self.pipes[fd], data))
                except (OSError, EOFError):
                    return False
                self.sent += len(data)

    def _pump(self):
        sel = selectors.DefaultSelector()
        for fd in self.pipes:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                if not self._forward(key.fd):
                    sel.unregister(key.fd)

    def drain(self):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        ready, _, _ = select.select(list(self.pipes), [], [], 0)
        for fd in ready:
            self._forward(fd)
        return self.sent


def _apply_kwargs(kwargs):
    """Apply env, cpus and memory_limit; returns a problem text or None."""
    env = kwargs.get("env")
    if env:
        os.environ.update(env)
    cpus = kwargs.get("cpus")
    if cpus:
        try:
            psutil.Process().cpu_affinity(list(cpus))
        except (OSError, ValueError, psutil.Error) as exc:
            return f"cannot pin to cpus {list(cpus)}: {exc}"
    limit = kwargs.get("memory_limit")
    if limit:
        # RLIMIT_DATA counts heap and private mappings (numpy's buffers),
        # not the shared-memory blobs; the limit is on top of what the
        # idle node process already uses.
        baseline = _data_size()
        try:
            resource.setrlimit(resource.RLIMIT_DATA,
                               (baseline + int(limit), baseline + int(limit)))
        except (ValueError, OSError) as exc:
            return f"cannot set memory_limit={limit}: {exc}"
    return None


def _data_size():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


class _NodeServer:
    def __init__(self, spec, conn, workspace, store, output):
        self.spec = spec
        self.output = output
        self.conn = conn
        self.ws = workspace
        self.store = store
        self.cancelled = threading.Event()
        self.control = shm.map_segment(spec.control)
        self.control_word = np.ndarray(1, np.int64, buffer=self.control)
        self.run_lock = threading.Lock()
        self.current_rid = None
        self.wakeups = queue.SimpleQueue()
        self.outbox = _Outbox(spec.prefix + "out")
        self.rc = RunContext(spec.name, workspace.lock, self.cancelled,
                             {"queues": ChannelHub(), "workspace": workspace})
        self.plans = collections.OrderedDict()   # plan id -> plan
        self.shm_channels = {}   # channel prefix -> ShmChannel (kept)
        self.send_lock = threading.Lock()
        signal.signal(signal.SIGUSR1, self._on_cancel_signal)
        threading.Thread(target=self._canceller, daemon=True,
                         name="lc:canceller").start()
        threading.Thread(target=self._watch_master, daemon=True,
                         name="lc:watcher").start()

    def send(self, msg):
        with self.send_lock:
            P.send(self.conn, msg)

    # -- cancellation -------------------------------------------------------

    def _on_cancel_signal(self, signum, frame):
        self.wakeups.put_nowait(None)  # reentrant: safe in a handler

    def _cancel_rid(self):
        return int(self.control_word[0])

    def _canceller(self):
        while True:
            self.wakeups.get()
            with self.run_lock:
                if self.current_rid is not None and \
                        self._cancel_rid() >= self.current_rid:
                    self._cancel()

    def _watch_master(self):
        poller = select.poll()
        poller.register(self.conn.fileno(), select.POLLRDHUP)
        poller.poll()
        with self.run_lock:  # the master is gone: stop; the loop ends
            self._cancel()

    def _cancel(self):
        self.cancelled.set()
        self.rc.op_context.resources["queues"].abort()

    def _start_run(self, rid, channels, trace=False):
        with self.run_lock:
            self.current_rid = rid
            self.rc.begin(trace)
            # Queues start empty and open at every run; a queue shared with
            # another node is the shared-memory channel the master made.
            self.rc.op_context.resources["queues"] = ChannelHub(
                lambda queue, capacity: (self._shm_channel(channels[queue])
                                         if queue in channels
                                         else LocalChannel(capacity)))
            if self._cancel_rid() >= rid:
                self._cancel()

    def _shm_channel(self, desc):
        """This node's end of a cross-node queue, kept across runs."""
        channel = self.shm_channels.get(desc["prefix"])
        if channel is None:
            channel = self.shm_channels[desc["prefix"]] = ShmChannel(desc)
        channel.begin()
        return channel

    def _end_run(self):
        with self.run_lock:
            self.current_rid = None

    # -- requests -----------------------------------------------------------

    def serve(self):
        while True:
            try:
                msg = P.recv(self.conn)
            except (EOFError, OSError):
                self.close()  # the master is gone
                return 0
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
            except _MemoryLimit as exc:
                self._reply((P.ERROR, rid, P.error_info(exc.error, P.MEMORY)))
                self.close()
                return EXIT_MEMORY
            self._reply(reply)

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
            self.send(msg)
        except (OSError, EOFError):
            pass  # the master is gone; the next recv sees EOF

    def close(self):
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
                return (P.OK, rid, sorted(self.ws.local_names()))
            if kind == P.HAS:
                return (P.OK, rid, self.ws.has(args[0]))
            raise ValueError(f"unknown request {kind!r}")
        except _MemoryLimit:
            raise
        except _PlanLoadError as exc:
            return (P.ERROR, rid, P.error_info(exc.error, P.PLAN))
        except BaseException as exc:  # noqa: BLE001 - sent to the master
            if self.spec.kwargs.get("memory_limit") and _is_memory(exc):
                raise _MemoryLimit(exc) from exc
            return (P.ERROR, rid, P.error_info(exc))

    def load(self, plan_id, plan_bytes):
        """The plan with ``plan_id``: sent now, or kept from an earlier run
        (the master mirrors this cache: same size, same eviction order)."""
        if plan_bytes is None:
            return self.plans[plan_id]
        try:
            plan, user_ops = pickle.loads(plan_bytes)
            for schema in user_ops.values():
                registry.ensure_registered(schema)
        except BaseException as exc:  # noqa: BLE001 - reported as a plan error
            raise _PlanLoadError(exc) from exc
        self.plans[plan_id] = plan
        if len(self.plans) > P.PLAN_CACHE:
            self.plans.popitem(last=False)
        return plan

    def run(self, rid, plan_id, plan_bytes, channels, options=None):
        plan = self.load(plan_id, plan_bytes)
        self._start_run(rid, channels, bool((options or {}).get("trace")))
        start = time.perf_counter()
        try:
            values = run_node_plan(plan, self.ws, self.rc, copy_outputs=False)
        finally:
            self._end_run()
        return {"outputs": self.outbox.pack(values),
                "seconds": time.perf_counter() - start,
                "trace": self.rc.trace}

    def describe(self, name):
        value = self.ws.get_or_none(name)
        if value is None:
            return None
        segment = self.store.segment_of(name)
        if segment is None:  # not in shared memory (object arrays)
            return {"inline": np.array(value, copy=True)}
        return {"segment": segment, "shape": value.shape,
                "dtype": value.dtype.str}


def _is_memory(exc):
    while exc is not None:
        if isinstance(exc, MemoryError):
            return True
        exc = exc.__cause__
    return False


class _MemoryLimit(Exception):
    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


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
            self.segment = f"{self.prefix}{self.seq}"
            self.mm = shm.create_segment(self.segment, max(total, 4096))
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
