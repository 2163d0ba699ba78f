"""The step executor: runs one node's ExecutionStep tree on a Workspace.

It is host-agnostic -- the same code runs in a LocalSession thread, in a
forked node process and (later) in an engine's worker -- and knows nothing
of sessions: a `RunContext` carries the node name, the node's lock, a
cancellation event and the node's runtime resources (queues), and errors
leave as exceptions.

Semantics (see `localcluster.plan.step`):

- nets run their ops in order; the step's stop blob is checked after every
  net and every substep (a missing stop blob counts as false);
- ``num_iter`` passes, or one pass, or -- with a stop blob -- repeat until
  it is true (``only_once``: one pass that may end early);
- concurrent substeps and ``num_concurrent_instances`` copies run on
  threads, instances each in a private child workspace;
- substeps with ``run_every_ms`` run on a timer thread beside their
  siblings and once more after them;
- the first op that raises sets the run's cancellation event, so every
  other thread of the node stops at its next op; the error leaves as
  `TaskFailedError` naming node, task, step, net, op type and index, with
  the original exception as its cause.  Waits here are bounded by the
  session, which cancels the run (and, for a process, kills it) when its
  timeout expires.

Threads, waits and time go through the run's clock (``rc.clock``, see
`localcluster.runtime.clock`): real threads and real time normally, a
deterministic schedule on a virtual clock when the host gives the run a
`Scheduler`.  Then the nets of a step run through `_run_net_switching`,
which offers the baton to the other branches before every op that can
interact with one of them (the schedule's `points_of`); the plain
`_run_net` loop, the one every run without a schedule takes, has no such
call in it.
"""

import functools
import logging
import threading
import time
import traceback

import numpy as np

from ..errors import (BlobNotFoundError, Cancelled, TaskFailedError,
                      first_error)
from ..kernels import registry
from ..kernels.registry import OpContext
from ..plan.races import missing_blob_hint
from .cancel import CancelEvent
from .clock import REAL_TIME
from .current import inherit
from .links import run_net_slowed
from .outputs import store, store_lent
from .straight import LENDS as _LENDS, STRAIGHT_AFTER, generate

__all__ = ["RunContext", "execute"]

#: seconds an interrupted run waits for its threads to stop
CANCEL_JOIN = 2.0
#: step spans a traced run keeps per node (the rest are not recorded)
MAX_TRACE = 20000

log = logging.getLogger(__name__)


class RunContext:
    """What the executor needs of the node it runs on.

    One per node, kept across runs: it caches each net's compiled ops
    (kernels bound to their arguments) and, once the net runs again, its
    straight-line code (`localcluster.runtime.straight`), so a group run
    again does not compile again.  `begin` starts a run (clears the
    cancellation).
    """

    MAX_COMPILED = 4096

    def __init__(self, node, lock, cancelled=None, resources=None):
        self.node = node
        self.cancelled = cancelled if cancelled is not None \
            else CancelEvent()
        self.op_context = OpContext(node, lock, self.cancelled, self,
                                    resources if resources is not None else {})
        self._compiled = {}
        self._compile_lock = threading.Lock()
        self.trace = None   # a list: the run records its step spans there
        self.made = set()   # see begin
        #: the run's clock: `REAL_TIME`, or the run's `Scheduler`
        self.clock = REAL_TIME
        #: every op takes this many times as long (the run's conditions)
        self.slowdown = 1.0
        #: the node's `NodeFaults` (None: no fault names this node); set
        #: before the first run, since compiled ops bind it
        self.faults = None
        self.fault_steps = None   # step names a fault names, or None
        #: the node's whole step of the run in progress (set by
        #: `localcluster.runtime.node.run_node_plan`): what a missing
        #: blob's error looks its writers up in
        self.root_step = None
        #: net id -> how a schedule cuts its ops (`_segments`)
        self.segments = {}

    def begin(self, trace=False, clock=None):
        self.cancelled.clear()
        #: blobs made once per run (a reader's cursor: `CreateCursor`)
        self.made = set()
        self.trace = [] if trace else None
        self.clock = REAL_TIME if clock is None else clock

    def check(self):
        if self.cancelled.is_set():
            raise Cancelled(f"run on node {self.node!r} was cancelled")

    def compiled(self, net):
        """(kernel, inputs, single output, outputs, lenient, lock) per op
        of ``net``."""
        return self._entry(net)[2]

    def runner(self, net, repeats=1):
        """``(code, run_net)`` for ``net``: its compiled ops and the
        function that runs them (`_run_net`'s signature).  That is the
        interpreter, `_run_net`, for a net's first run, and its
        straight-line code from the second run on -- or from the first
        when the caller runs it ``repeats`` times (None: until a stop
        blob says so)."""
        entry = self._entry(net)
        if entry[4] is None:
            entry[3] += 1
            if entry[3] < STRAIGHT_AFTER and repeats == 1:
                return entry[2], _run_net
            entry[4] = generate(net, entry[2], _op_failed, store, store_lent)
        return entry[2], entry[4]

    def _entry(self, net):
        """[net, op count, compiled ops, runs seen, straight code]"""
        key = id(net)
        found = self._compiled.get(key)
        if found is not None and found[0] is net and found[1] == net.num_ops:
            return found
        with self._compile_lock:
            ops = net.ops
            code = [self._compile_op(op) for op in ops]
            if len(self._compiled) >= self.MAX_COMPILED:
                self._compiled.clear()
            entry = [net, len(ops), code, 0, None]
            self._compiled[key] = entry
        return entry

    def _compile_op(self, op):
        schema = registry.lookup(op.type)
        if schema is None:
            raise TaskFailedError(
                f"op type {op.type!r} is not registered on node {self.node!r};"
                " register it (register_op) in a module the node imports",
                node=self.node, op_type=op.type)
        kernel = schema.fast if (schema.fast is not None and not op.args) \
            else schema.kernel
        # one partial, not two: a call through a partial of a partial
        # merges its keywords twice
        if schema.bind is not None:
            kernel = schema.bind(self.op_context.for_op(op)
                                 if schema.context else None, **op.args)
        elif schema.context:
            kernel = functools.partial(kernel, self.op_context.for_op(op),
                                       **op.args)
        elif op.args:
            kernel = functools.partial(kernel, **op.args)
        fire = self.faults.trigger(op) if self.faults is not None else None
        # A Python op (or one registered may_skip) may return None to leave
        # its outputs unwritten.
        lenient = op.type == "Python" or schema.may_skip
        single = op.outputs[0] if len(op.outputs) == 1 and not lenient \
            else None
        # An atomic op reads, computes and writes under the node's lock; a
        # lending op's outputs are copied before its memory is handed back.
        lock = _LENDS if schema.lends else \
            self.op_context.lock if schema.atomic else None
        if fire is not None:
            # a fault fires before the op -- before an atomic op takes the
            # node's lock, so a Delay or Hang there holds no other branch
            if lock is None or lock is _LENDS:
                kernel = _fire_then(fire, kernel)
            else:
                lock = _FireThenLock(fire, lock)
        return (kernel, op.inputs, single, op.outputs, lenient, lock)


def _fire_then(fire, kernel):
    def fire_then_run(*args):
        fire()
        return kernel(*args)
    return fire_then_run


class _FireThenLock:
    """An atomic op's lock that fires the op's faults before taking it."""

    def __init__(self, fire, lock):
        self._fire = fire
        self._lock = lock

    def __enter__(self):
        self._fire()
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()


def _fail(rc, exc, task, step, net, index):
    op = net.ops[index]
    tb_text = "".join(traceback.format_exception(type(exc), exc,
                                                 exc.__traceback__))
    built_at = op.built_at()
    # where the user built the op: a built-in kernel's own frames are the
    # library's, not the line to fix
    built = f", built at {built_at}" if built_at else ""
    err = TaskFailedError(
        f"op {op.type} (#{index} of net {net.name!r}{built}) failed on node "
        f"{rc.node!r} in task {task!r}, step {step.name!r}: "
        f"{type(exc).__name__}: {exc}",
        node=rc.node, task=task, step=step.name, net=net.name,
        op_type=op.type, op_index=index, traceback_text=tb_text,
        cause_type=type(exc).__name__, cause_message=str(exc),
        built_at=built_at)
    return err


def _accessors(ws):
    """(get, put) for ``ws``: the store's own methods for a global
    workspace (no parent to walk), the workspace's for a child."""
    if ws.parent is None:
        own = ws.own
        return own.__getitem__, own.put
    return ws.get, ws.set


def _run_net(net, code, get, put, ws, rc, task, step, first=0):
    # Cancellation is checked per net: one op cannot loop, and blocking ops
    # watch the cancellation event themselves.  ``code`` may be a slice of
    # the net's ops that starts at op ``first``.
    if rc.cancelled.is_set():
        raise Cancelled(f"run on node {rc.node!r} was cancelled")
    ndarray, asarray = np.ndarray, np.asarray
    for index, (kernel, inputs, single, outputs, lenient, lock) in \
            enumerate(code):
        try:
            if lock is _LENDS:
                store_lent(outputs, kernel(*map(get, inputs)), lenient, put,
                            ws)
                continue
            if lock is not None:
                with lock:
                    store(outputs, kernel(*map(get, inputs)), lenient, put)
                continue
            result = kernel(*map(get, inputs))
            if single is not None:  # the common case: exactly one output
                if result is None:
                    raise ValueError("returned None for 1 output")
                put(single, result if type(result) is ndarray
                    else asarray(result))
            elif outputs:
                store(outputs, result, lenient, put)
        except Cancelled:
            raise
        except Exception as exc:
            _op_failed(exc, index, net, code, ws, rc, task, step, first)


def _op_failed(exc, index, net, code, ws, rc, task, step, first=0):
    """Raise what ``exc``, raised by op ``index`` of ``code`` (a slice of
    ``net``'s compiled ops that starts at op ``first``), means: a missing
    blob's error, or the op's `TaskFailedError`, naming op ``first +
    index`` of the net.  The interpreter and the straight-line code both
    end here, so they fail alike."""
    cause = _missing_blob(exc, ws, code[index][1], rc, net, first + index)
    if cause is not exc:
        cause.__cause__ = exc
    raise _fail(rc, cause, task, step, net, first + index) from cause


def _run_net_switching(net, code, get, put, ws, rc, task, step):
    """`_run_net` under a schedule: a switch point before each op that can
    interact with another branch (`switch_points`), never inside one (an
    op may hold the node's lock).  The ops between two points run as one
    slice -- on the interpreter the net's first time, then as the slice's
    straight-line code (`localcluster.runtime.straight`) -- and the clock
    is told how many ran (`Scheduler.ran`), so each is charged its
    virtual time as if it had had a point of its own."""
    clock = rc.clock
    # (a net none of whose ops needs a point is one slice without one: it
    # runs as a real run would, its straight-line code from its second run)
    for start, pointed, part, run, rest in _segments(rc, net, code):
        if pointed:
            clock.point()
        try:
            run(net, part, get, put, ws, rc, task, step)
        except TaskFailedError as exc:
            # ops up to the failing one started: their time is spent
            clock.ran(_failed_at(exc) - start + 1 - pointed, pointed)
            raise
        except Cancelled:
            clock.ran(1 - pointed, pointed)   # found before its first op
            raise
        except BaseException:
            clock.ran(1 - pointed, pointed)
            raise
        clock.ran(rest, pointed)


def _failed_at(exc):
    """The index of the op whose failure ``exc`` is (0 if it names none)."""
    return exc.op_index if exc.op_index is not None else 0


def _segments(rc, net, code):
    """``[(first op, pointed, compiled ops, run, rest)]``: ``net``'s ops
    cut before each op that gets a switch point (``pointed``), what runs
    a slice (`_run_net`'s signature) -- the interpreter the first time,
    from the second the slice's straight-line code, as `RunContext.runner`
    does for a whole net -- and the ops it runs past its point (``rest``,
    `Scheduler.ran`); made once per net and run's points
    (`Scheduler.points_of`), cached on ``rc``."""
    points = rc.clock.points_of(rc.node)
    cache = rc.segments
    key = id(net)
    found = cache.get(key)
    if found is not None and found[0] is code and found[1] is points:
        if found[3] is None:
            found[3] = _straight_segments(net, found[2])
        return found[3]
    at = None if points is None else points.get(key, frozenset())
    faults = rc.faults
    cuts = []
    for index, op in enumerate(net.ops):
        pointed = at is None or index in at or (
            faults is not None and faults.names(op))
        if pointed or not cuts:
            cuts.append((index, pointed))
    ends = [c[0] for c in cuts[1:]] + [len(code)]
    segments = [(first, pointed, code[first:end],
                 functools.partial(_run_net, first=first),
                 end - first - pointed)
                for (first, pointed), end in zip(cuts, ends)]
    if len(cache) >= RunContext.MAX_COMPILED:
        cache.clear()
    cache[key] = [code, points, segments, None]
    return segments


def _straight_segments(net, segments):
    """``segments`` (`_segments`) each run by its straight-line code.  A
    slice's code fails as the interpreter does on it: `_op_failed` naming
    op ``first + index``."""
    return [(first, pointed, part,
             generate(net, part, functools.partial(_op_failed, first=first),
                      store, store_lent), rest)
            for first, pointed, part, _, rest in segments]


#: what a missing blob's error suggests when no concurrent branch is to blame
NOT_WRITTEN = ("nothing wrote it before it was read: check the order of "
               "your ops, or feed it with session.feed_blob")


def _missing_blob(exc, ws, inputs, rc, net, index):
    """A bare KeyError of the store's lookup, or a child workspace's
    `BlobNotFoundError`, as the error it means: a blob op ``index`` of
    ``net`` reads and nothing wrote -- naming the op that writes it when
    that op runs concurrently with this one (`missing_blob_hint`, worked
    out once per plan, only when a blob is missing)."""
    if type(exc) is KeyError and exc.args:
        name = exc.args[0]
    elif type(exc) is BlobNotFoundError:
        name = exc.blob
    else:
        return exc
    if name not in inputs or ws.has(name):
        return exc
    hint = None
    if rc.root_step is not None:
        try:
            hint = missing_blob_hint(rc.root_step, rc.node, net, index, name)
        except Exception:   # noqa: BLE001 - a hint never hides the error
            log.debug("no hint for missing blob %r", name, exc_info=True)
    return BlobNotFoundError(name, ws.node, hint or NOT_WRITTEN)


def _stopped(name, ws):
    if name is None:
        return False
    value = ws.own.get(name)
    if value is None:
        value = ws.get_or_none(name)
    if value is None:
        return False
    return bool(value) if value.size == 1 else bool(value.any())


def execute(step, ws, rc, task=None):
    """Run ``step`` on workspace ``ws``; raises on failure or cancellation.

    With ``rc.trace`` a list, each step run appends a span to it:
    ``(step name, task, thread name, start, end)`` in `time.time` seconds,
    or in the virtual seconds of the run's schedule (at most `MAX_TRACE`
    per run)."""
    trace = rc.trace
    if trace is None:
        _execute(step, ws, rc, task)
        return
    now = rc.clock.now if rc.clock.switches else time.time
    start = now()
    try:
        _execute(step, ws, rc, task)
    finally:
        if len(trace) < MAX_TRACE:
            trace.append((step.name, step.task or task,
                          threading.current_thread().name, start, now()))


def _execute(step, ws, rc, task):
    task = step.task or task
    if rc.fault_steps is not None and step.name in rc.fault_steps:
        rc.faults.before_step(step.name, task)
    if step.create_workspace:
        ws = ws.child()
    n = step.num_concurrent_instances
    if n is None:
        _iterate(step, ws, rc, task)
    elif n == 1:
        _iterate(step, ws.child(), rc, task)
    else:
        run_concurrently(
            [functools.partial(_iterate, step, ws.child(), rc, task)
             for _ in range(n)],
            rc, f"{step.name}:instance")


def _iterate(step, ws, rc, task):
    if not step.substeps:
        _passes(step, (), ws, rc, task)
        return
    periodic = [s for s in step.substeps if s.run_every_ms]
    regular = [s for s in step.substeps if not s.run_every_ms] \
        if periodic else step.substeps
    if not periodic:
        _passes(step, regular, ws, rc, task)
        return
    reporters = _Reporters(periodic, ws, rc, task)
    try:
        _passes(step, regular, ws, rc, task)
    except BaseException:
        reporters.finish(run_once_more=False)
        reporters.raise_errors(real_only=True)  # then it is the real cause
        raise
    reporters.finish(run_once_more=True)
    reporters.raise_errors()


def _passes(step, regular, ws, rc, task):
    if step.num_iter is not None:
        limit = step.num_iter
    elif step.should_stop_blob is None or step.only_once:
        limit = 1
    else:
        limit = None
    if step.nets:
        get, put = _accessors(ws)
        if rc.clock.switches:
            nets = [(net, rc.compiled(net), _run_net_switching)
                    for net in step.nets]
        else:
            nets = [(net, *rc.runner(net, limit)) for net in step.nets]
            if rc.slowdown != 1.0:
                nets = [(net, code, functools.partial(run_net_slowed, run))
                        for net, code, run in nets]
        if step.should_stop_blob is None:  # plain repetition: no stop test
            if len(nets) == 1 and getattr(nets[0][2], "repeats", False):
                (net, code, run_net), = nets   # the loop is in the code
                run_net(net, code, get, put, ws, rc, task, step, limit)
                return
            for _ in range(limit):
                for net, code, run_net in nets:
                    run_net(net, code, get, put, ws, rc, task, step)
            return
        stop = step.should_stop_blob
        i = 0
        while limit is None or i < limit:
            for net, code, run_net in nets:
                run_net(net, code, get, put, ws, rc, task, step)
                if _stopped(stop, ws):
                    return
            i += 1
        return
    i = 0
    while limit is None or i < limit:
        rc.check()
        if step.concurrent_substeps and len(regular) > 1:
            run_concurrently(
                [functools.partial(execute, s, ws, rc, task) for s in regular],
                rc, step.name)
            if _stopped(step.should_stop_blob, ws):
                return
        else:
            for sub in regular:
                execute(sub, ws, rc, task)
                if _stopped(step.should_stop_blob, ws):
                    return
        i += 1


def run_concurrently(fns, rc, name):
    """Run ``fns`` as concurrent branches (threads) named ``<name>:<i>``;
    the first failure cancels the others."""
    errors = []

    def target(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            rc.cancelled.set()

    branches = rc.clock.branches(
        [f"{name}:{i}" for i in range(len(fns))],
        [inherit(functools.partial(target, fn)) for fn in fns],
        f"lc:{rc.node}:{name}")
    try:
        branches.start()
        branches.join()  # bounded by cancellation: see the module docstring
    except BaseException:
        # Interrupted (Ctrl-C in the caller's thread): stop the branches
        # before leaving, so none goes on writing to the workspace.
        rc.cancelled.set()
        branches.stop(CANCEL_JOIN)
        raise
    _raise_first(errors)


def _raise_first(errors):
    error = first_error(errors)
    if error is not None:
        raise error


class _Reporters:
    """Timer branches (threads) for the ``run_every_ms`` substeps of one
    step, named ``<substep>:every:<i>``."""

    def __init__(self, steps, ws, rc, task):
        self._done = threading.Event()
        self._final = False
        self._errors = []
        self._branches = rc.clock.branches(
            [f"{s.name}:every:{i}" for i, s in enumerate(steps)],
            [inherit(functools.partial(self._loop, s, ws, rc, task))
             for s in steps],
            f"lc:{rc.node}:every")
        self._branches.start()

    def _loop(self, step, ws, rc, task):
        interval = step.run_every_ms / 1000.0
        what = f"the {step.run_every_ms} ms timer of step {step.name!r}"
        try:
            while True:
                done = rc.clock.wait(self._done, interval, what=what)
                if done and not self._final:
                    return
                execute(step, ws, rc, task)
                if done:
                    return
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
            self._errors.append(exc)
            rc.cancelled.set()

    def finish(self, run_once_more):
        self._final = run_once_more and not self._errors
        self._done.set()
        self._branches.join()  # bounded by cancellation, as above

    def raise_errors(self, real_only=False):
        errors = self._errors
        if real_only:
            errors = [e for e in errors if not isinstance(e, Cancelled)]
        _raise_first(errors)
