"""Fault plans: faults to inject into a run, as plain, picklable data.

::

    plan = FaultPlan(Kill("trainer_0", at=Epoch(2)),
                     Delay("reader", at=Op("EnqueueRecords", nth=3),
                           seconds=0.5),
                     FailCheckpoint("ps", epoch=1))
    session = LocalHostScheduler(faults=plan)   # or LocalSession(faults=)

A fault names a node and a trigger point (``at=``): `Epoch` (the node's
part of epoch k -- the run a `JobRunner` makes of the epoch group, counted
by the runner), `Op` (just before the nth op of that type the node runs,
counted since the node started) or `Step` (just before a step of that
name starts, as `printer.to_string` names it).  It fires once per session, in the first run that reaches
it -- a node restarted after a `Kill` does not die again at the same
point, which is what lets ``JobRunner(max_restarts=...)`` recover -- and
``plan.fired()`` lists what fired, with node and time.

What a fault does is carried out inside the node's runtime (never by
patching code), so every session shows the real consequence: `Kill`
SIGKILLs (``how="sigkill"``) or ends (``how="exit"``, exit status 3) a
node process -- under `LocalSession` the same `NodeFailedError`, the
node's workspace dropped as a dead process's is -- or raises an op error
(``how="raise"``); `Hang` stops the node until its run is cancelled (the
run's timeout); `Delay` holds the node for ``seconds``; `FailCheckpoint`
fails the node's save of one epoch.

This module holds the data only; `localcluster.runtime.faults` fires them.
"""

import dataclasses
import threading

from ..errors import PlanError

__all__ = ["Epoch", "Op", "Step", "Kill", "Hang", "Delay", "FailCheckpoint",
           "FaultPlan", "Fired", "KILL_HOWS", "EXIT_STATUS"]

#: how a `Kill` ends a node
KILL_HOWS = ("sigkill", "exit", "raise")
#: the exit status of a node a ``Kill(how="exit")`` ends
EXIT_STATUS = 3


def _positive_int(value, what, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PlanError(f"{what} must be an int >= {low}, got {value!r}")


def _name(value, what):
    if not isinstance(value, str) or not value:
        raise PlanError(f"{what} must be a non-empty string, got {value!r}")


# -- trigger points -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Epoch:
    """The node's part of epoch ``k`` (k >= 1), as a JobRunner counts."""
    k: int

    def __post_init__(self):
        _positive_int(self.k, "Epoch(k)", 1)


@dataclasses.dataclass(frozen=True)
class Op:
    """Just before the ``nth`` op of type ``op_type`` the node runs."""
    op_type: str
    nth: int = 1

    def __post_init__(self):
        _name(self.op_type, "Op(op_type)")
        _positive_int(self.nth, "Op(nth)", 1)


@dataclasses.dataclass(frozen=True)
class Step:
    """Just before a step named ``name`` starts on the node -- the name
    `printer.to_string` shows (a task's step is ``node/task``)."""
    name: str

    def __post_init__(self):
        _name(self.name, "Step(name)")


_TRIGGERS = (Epoch, Op, Step)


def _trigger(at, fault):
    if not isinstance(at, _TRIGGERS):
        raise PlanError(f"{fault}(at=...) must be Epoch(k), Op(op_type, nth) "
                        f"or Step(name), got {at!r}")


# -- faults -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Kill:
    """End ``node`` at ``at``: ``how`` is "sigkill", "exit" or "raise"."""
    node: str
    at: object
    how: str = "sigkill"

    def __post_init__(self):
        _name(self.node, "Kill(node)")
        _trigger(self.at, "Kill")
        if self.how not in KILL_HOWS:
            raise PlanError(f"Kill(how=) must be one of {KILL_HOWS}, got "
                            f"{self.how!r}")


@dataclasses.dataclass(frozen=True)
class Hang:
    """``node`` stops making progress at ``at`` until its run is
    cancelled (the run's timeout, or a failure elsewhere)."""
    node: str
    at: object

    def __post_init__(self):
        _name(self.node, "Hang(node)")
        _trigger(self.at, "Hang")


@dataclasses.dataclass(frozen=True)
class Delay:
    """``node`` waits ``seconds`` at ``at``, then goes on."""
    node: str
    at: object
    seconds: float

    def __post_init__(self):
        _name(self.node, "Delay(node)")
        _trigger(self.at, "Delay")
        if isinstance(self.seconds, bool) or \
                not isinstance(self.seconds, (int, float)) or \
                not 0 <= self.seconds < float("inf"):
            raise PlanError(f"Delay(seconds=) must be a number >= 0, got "
                            f"{self.seconds!r}")


@dataclasses.dataclass(frozen=True)
class FailCheckpoint:
    """``node``'s save of ``epoch`` fails (0 is the checkpoint a job makes
    after its init group)."""
    node: str
    epoch: int

    def __post_init__(self):
        _name(self.node, "FailCheckpoint(node)")
        _positive_int(self.epoch, "FailCheckpoint(epoch)", 0)


_FAULTS = (Kill, Hang, Delay, FailCheckpoint)


@dataclasses.dataclass(frozen=True)
class Fired:
    """A fault that fired: which, on which node, when (`time.time`)."""
    fault: object
    node: str
    time: float


class FaultPlan:
    """``FaultPlan(*faults)``: a value sessions take as ``faults=``.

    Equal plans have equal faults; ``repr`` is the Python that makes the
    plan.  `fired` lists the faults that fired in the sessions given this
    plan, in the order they fired.
    """

    def __init__(self, *faults):
        for fault in faults:
            if not isinstance(fault, _FAULTS):
                raise PlanError(
                    f"FaultPlan takes Kill, Hang, Delay and FailCheckpoint "
                    f"faults, got {fault!r}")
        self.faults = tuple(faults)
        self._fired = []
        self._lock = threading.Lock()

    def __repr__(self):
        return f"FaultPlan({', '.join(map(repr, self.faults))})"

    def __eq__(self, other):
        return isinstance(other, FaultPlan) and self.faults == other.faults

    def __hash__(self):
        return hash(self.faults)

    def __len__(self):
        return len(self.faults)

    def __iter__(self):
        return iter(self.faults)

    def __getstate__(self):
        return {"faults": self.faults, "fired": list(self._fired)}

    def __setstate__(self, state):
        self.faults = state["faults"]
        self._fired = list(state["fired"])
        self._lock = threading.Lock()

    def nodes(self):
        """The node names the faults name."""
        return sorted({f.node for f in self.faults})

    def fired(self):
        """``[Fired(fault, node, time), ...]``, in the order they fired."""
        with self._lock:
            return sorted(self._fired, key=lambda f: f.time)

    def record(self, index, when):
        """Note that fault ``index`` fired at ``when`` (sessions call it);
        the `Fired` record."""
        fault = self.faults[index]
        fired = Fired(fault, fault.node, when)
        with self._lock:
            self._fired.append(fired)
        return fired


def as_fault_plan(faults, who):
    """``faults`` (None, a FaultPlan, or an iterable of faults) as a
    FaultPlan or None; a PlanError naming ``who`` for anything else."""
    if faults is None or isinstance(faults, FaultPlan):
        return faults
    if isinstance(faults, _FAULTS):
        return FaultPlan(faults)
    try:
        return FaultPlan(*faults)
    except TypeError:
        raise PlanError(f"{who}(faults=) takes a FaultPlan, got "
                        f"{faults!r}") from None
