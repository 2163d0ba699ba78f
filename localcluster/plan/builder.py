"""NetBuilder and the ``ops`` DSL: write control flow as Python blocks.

::

    with NetBuilder() as nb:
        x = ops.Const(5)
        with ops.loop():
            ops.stop_if(ops.EQ([x, ops.Const(0)]))
            ops.Sub([x, ops.Const(1)], [x])
    step = to_execution_step(nb)

A builder collects *children*: nets (``ops.<OpType>`` appends to the
current net, starting a new one when needed) and nested builders (loops,
conditionals, guards), each becoming a substep.  Control flow is compiled
to plain steps with stop blobs, so the runtime only knows steps:

- ``ops.stop_if(b)`` ORs ``b`` into the builder's stop blob and starts a new
  net, so the stop is seen right away (the runtime checks the stop blob after
  every net).  A builder that has a stop blob *repeats until it stops*; one
  without runs once.  So ``ops.loop()`` without a count must call
  ``stop_if``; ``If``, ``stop_guard`` and setup blocks end with an implicit
  ``stop()`` and run at most once; and ``stop()`` ends only the innermost
  block.  Each block resets its stop blob when it starts.
- ``ops.loop(n)`` counts its iterations in a private blob (`Loop.iter`,
  0-based); ``n`` may be an int or a scalar blob, copied when the loop is
  entered.
- ``ops.If(c)``/``Elif``/``Else`` share an "already ran" blob, so exactly one
  branch runs.

Setup blocks (``task_init`` ...) and reporters attach themselves to the
current net as attributes (keys in `localcluster.plan.setup`);
`localcluster.plan.grouping` lifts them out when it builds a task's step
and a node's plan.  Nothing here knows the task model: a local reporter
reaches its node through the net it is attached to.
"""

from ..context import Managed
from ..errors import PlanError
from .net import BlobRef, Net
from .setup import (LOCAL_REPORT_STEP, LOCAL_SETUP, REPORT_STEP,
                    TASK_INSTANCE_SETUP, TASK_SETUP, SetupNets)
from .step import ExecutionStep, execution_step, to_execution_step

__all__ = ["NetBuilder", "ops", "Ops"]


class NetBuilder(Managed):
    """Collects nets and control blocks; `to_execution_step` makes a step."""

    def __init__(self, name=None, _fullname=None, _stop_blob_required=False):
        parent = NetBuilder.current(required=False)
        if _fullname:
            self.name = _fullname
        else:
            parts = [p for p in ((parent.name if parent else None), name) if p]
            self.name = "/".join(parts) or "nb"
        self._children = []
        self._current_net = None
        self._stop_blob = None
        self._stop_blob_required = _stop_blob_required
        self._frozen = False

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r})"

    # -- children ---------------------------------------------------------------

    def _assert_mutable(self):
        if self._frozen:
            raise PlanError(
                f"{self!r} has been built already; open a new builder to add "
                "more")

    def add(self, child):
        """Append a net, a step or a nested builder; returns it."""
        self._assert_mutable()
        if not isinstance(child, (Net, ExecutionStep, NetBuilder)):
            raise PlanError(
                f"cannot add {type(child).__name__} {child!r} to {self!r}; "
                "add a Net, an ExecutionStep or a NetBuilder")
        self._children.append(child)
        # A net handed in by the user is not extended by later ops: they go
        # to a fresh net, so adding a net twice runs exactly its ops twice.
        self._current_net = None
        return child

    def current_net(self, name=None):
        """The net ``ops.<OpType>`` appends to (a new one if needed)."""
        self._assert_mutable()
        if self._current_net is None or name is not None:
            net = Net(name or self.name)
            self._children.append(net)
            self._current_net = net
        return self._current_net

    @property
    def children(self):
        """The nets, steps and nested builders added so far, in order."""
        return tuple(self._children)

    # -- stopping -----------------------------------------------------------------

    @property
    def has_stop_blob(self):
        """Whether the builder has a stop blob (then it repeats until it
        stops), without making one as `stop_blob` does."""
        return self._stop_blob is not None

    def stop_blob(self):
        """This builder's stop blob, created (and reset on entry) on demand."""
        if self._stop_blob is None:
            net = self.current_net()
            self._stop_blob = net.next_blob("stop", ("stop",))
            net.Const(False, blob_out=self._stop_blob)
            if self._children[0] is not net:
                init = Net(f"{self.name}/stop_init")
                init.Const(False, blob_out=self._stop_blob)
                self._children.insert(0, init)
        return self._stop_blob

    def stop_if(self, blob):
        stop = self.stop_blob()
        self.current_net().Or([stop, blob], [stop])
        self._current_net = None

    # -- building ------------------------------------------------------------------

    def freeze(self):
        self._current_net = None
        self._frozen = True

    def to_step(self, default_name=None):
        """The step this builder describes (freezes it)."""
        self.freeze()
        children = [to_execution_step(c) if isinstance(c, NetBuilder) else c
                    for c in self._children]
        return execution_step(default_name or self.name, children,
                              should_stop_blob=self._stop_blob)

    def __exit__(self, etype, *args):
        super().__exit__(etype, *args)
        self.freeze()
        if etype is None and self._stop_blob_required and \
                self._stop_blob is None:
            raise PlanError(
                f"{self!r} needs a stop condition: call ops.stop_if(...) or "
                "ops.stop() in its body, or give the loop a count")


class _RunOnce(NetBuilder):
    """A block that runs at most once even if its body stops early."""

    def __exit__(self, etype, *args):
        if etype is None and self._stop_blob is not None:
            self.stop_if(ops.Const(True))
        super().__exit__(etype, *args)


class Loop(NetBuilder):
    """``with ops.loop(n) as loop:`` -- see the module docstring.

    A loop with an int count and no ``stop_if`` in its body compiles to a
    step with ``num_iter=n`` (one net per iteration, no stop test); one
    that can stop early, or whose count is a blob, tests its counter
    against the count at the start of every iteration.
    """

    def __init__(self, n=None, name=None):
        super().__init__(name or "loop", _stop_blob_required=n is None)
        self._iter = None
        self._n = None
        self._count = None
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, (int, str)):
                raise PlanError(
                    f"ops.loop(n): n must be an int or a scalar blob, got "
                    f"{type(n).__name__} {n!r}")
            if isinstance(n, int) and n < 0:
                raise PlanError(f"ops.loop(n): n must be >= 0, got {n}")
            # Created in the parent, so they are reset each time the loop is
            # entered (a blob count is read then, too).
            self._count = n if isinstance(n, int) else None
            self._n = ops.Const(n) if isinstance(n, int) else ops.Copy(n)
            self._iter = ops.Const(0)
            self._one = ops.Const(1)

    def iter(self):
        """The 0-based iteration counter blob."""
        if self._iter is None:
            raise PlanError(
                "loop.iter() needs a loop with a count: ops.loop(n)")
        return self._iter

    def stop_blob(self):
        if self._stop_blob is None and self._n is not None:
            # The count test, first in every iteration, writes the stop blob
            # itself; stop_if in the body ORs into it.
            test = Net(f"{self.name}/test")
            self._stop_blob = test.next_blob("stop", ("loop", self._n))
            test.GE([self._iter, self._n], [self._stop_blob])
            self._children.insert(0, test)
        return super().stop_blob()

    def __enter__(self):
        super().__enter__()
        if self._n is not None and self._count is None:
            self.stop_blob()
        return self

    def __exit__(self, etype, *args):
        if etype is None and self._n is not None:
            self.current_net().Add([self._iter, self._one], [self._iter])
        super().__exit__(etype, *args)

    def to_step(self, default_name=None):
        step = super().to_step(default_name)
        if self._count is not None and self._stop_blob is None:
            step = step.replace(num_iter=self._count)
        return step


class StopGuard(_RunOnce):
    """``with ops.stop_guard() as g:``; ``g.has_stopped()`` after the block."""

    def __init__(self, has_stopped_blob=None, name=None):
        super().__init__(name or "stop_guard")
        self._stopped = has_stopped_blob
        self._ran = False

    def __enter__(self):
        super().__enter__()
        self._stopped = ops.Const(True, blob_out=self._stopped)
        return self

    def __exit__(self, etype, *args):
        if etype is None:
            self._ran = True
            ops.Const(False, blob_out=self._stopped)
        super().__exit__(etype, *args)

    def has_stopped(self):
        """A bool blob: true only if the block was stopped early."""
        if not self._ran:
            raise PlanError("has_stopped() is known only after the block")
        return self._stopped


class If(_RunOnce):
    """``with ops.If(cond) as c:`` ... ``with c.Elif(cond2) as c:`` ...
    ``with c.Else():``."""

    def __init__(self, cond=None, name=None, _already_ran=None):
        super().__init__(name or "if")
        self._is_else = cond is None
        if _already_ran is None:
            if cond is None:
                raise PlanError("ops.If needs a condition blob")
            self._skip = ops.Not(cond)
            self._already_ran = ops.Const(False)
        else:
            self._already_ran = _already_ran
            self._skip = (_already_ran if cond is None else
                          ops.Or([_already_ran, ops.Not(cond)]))

    def __enter__(self):
        super().__enter__()
        ops.stop_if(self._skip)
        ops.Const(True, blob_out=self._already_ran)
        return self

    def Elif(self, cond, name=None):
        if self._is_else:
            raise PlanError("Elif cannot follow Else")
        return NetBuilder.current().add(
            If(cond, name=name, _already_ran=self._already_ran))

    def Else(self, name=None):
        if self._is_else:
            raise PlanError("Else cannot follow Else")
        return NetBuilder.current().add(
            If(None, name=name or "else", _already_ran=self._already_ran))


class _SetupBuilder(_RunOnce):
    """A setup block; attached to the current net as a `SetupNets`."""

    def __init__(self, key, is_init, name):
        super().__init__(name)
        self.setup = SetupNets()
        self._is_init = is_init
        _current_builder().current_net().add_attribute(key, self.setup)

    def __exit__(self, etype, *args):
        super().__exit__(etype, *args)
        if etype is None:
            step = self.to_step()
            if self._is_init:
                self.setup.init_nets = [step]
            else:
                self.setup.exit_nets = [step]


class _ReporterBuilder(NetBuilder):
    """A periodic block: a step with ``run_every_ms``, attached to ``net``
    under ``key`` (`REPORT_STEP` or `LOCAL_REPORT_STEP`)."""

    def __init__(self, interval_ms, net, key, name=None):
        super().__init__(name or "reporter")
        self._net = net
        self._key = key
        self.interval_ms = interval_ms

    def __exit__(self, etype, *args):
        super().__exit__(etype, *args)
        if etype is None:
            step = self.to_step().replace(run_every_ms=self.interval_ms)
            self._net.add_attribute(self._key, step)


def _current_builder():
    builder = NetBuilder.current(required=False)
    if builder is None:
        raise PlanError(
            "ops.* needs a current NetBuilder: use it inside 'with "
            "NetBuilder():' or 'with Task():'")
    return builder


class Ops:
    """The ``ops`` DSL: ``ops.<OpType>(...)`` appends to the current net."""

    def __getattr__(self, op_type):
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        return getattr(_current_builder().current_net(), op_type)

    def __dir__(self):
        from ..kernels import op_names
        return sorted(set(super().__dir__()) | set(op_names()))

    # -- values -------------------------------------------------------------------

    def Const(self, value, dtype=None, blob_out=None, name=None):
        return _current_builder().current_net().Const(
            value, dtype=dtype, blob_out=blob_out if blob_out else name)

    def Python(self, fn):
        return _current_builder().current_net().Python(fn)

    def net(self, net=None, name=None):
        """Add ``net`` (a Net or step) to the current builder, or start a new
        net named ``name``; returns the net."""
        builder = _current_builder()
        if net is None:
            return builder.current_net(name)
        return builder.add(net)

    # -- control ------------------------------------------------------------------

    def stop(self):
        """Stop the innermost block now."""
        self.stop_if(self.Const(True))

    def stop_if(self, blob):
        """Stop the innermost block once ``blob`` is true."""
        if not isinstance(blob, str):
            raise PlanError(f"stop_if needs a bool blob, got {blob!r}")
        _current_builder().stop_if(BlobRef(blob))

    def loop(self, n=None, name=None):
        return _current_builder().add(Loop(n, name=name))

    def stop_guard(self, has_stopped_blob=None, name=None):
        return _current_builder().add(StopGuard(has_stopped_blob, name=name))

    def If(self, cond, name=None):
        return _current_builder().add(If(cond, name=name))

    # -- setup and reporting -----------------------------------------------------------

    def task_init(self):
        """Runs once before the task (before its instances start)."""
        return _SetupBuilder(TASK_SETUP, True, "task_init")

    def task_exit(self):
        """Runs once after the task (after all its instances end)."""
        return _SetupBuilder(TASK_SETUP, False, "task_exit")

    def task_instance_init(self):
        """Runs before each instance, in its private workspace."""
        return _SetupBuilder(TASK_INSTANCE_SETUP, True, "task_instance_init")

    def task_instance_exit(self):
        """Runs after each instance, in its private workspace."""
        return _SetupBuilder(TASK_INSTANCE_SETUP, False, "task_instance_exit")

    def local_init(self):
        """Runs once per node per group run, before the node's tasks."""
        return _SetupBuilder(LOCAL_SETUP, True, "local_init")

    def local_exit(self):
        """Runs once per node per group run, after the node's tasks."""
        return _SetupBuilder(LOCAL_SETUP, False, "local_exit")

    def task_reporter(self, interval_ms=1000, name=None):
        """Runs every ``interval_ms`` while the task runs, and once after."""
        return _ReporterBuilder(interval_ms,
                                _current_builder().current_net(),
                                REPORT_STEP, name=name)

    def local_reporter(self, interval_ms=1000, name=None):
        """Like task_reporter, for everything the group runs on this node
        (the node of the task being built): every ``interval_ms`` while the
        group runs there, and once after its tasks end."""
        return _ReporterBuilder(interval_ms,
                                _current_builder().current_net(),
                                LOCAL_REPORT_STEP, name=name)


ops = Ops()
