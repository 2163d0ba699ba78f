"""The faults and trigger points of a fault plan: frozen, validated values.

`localcluster.plan.faults` gathers these into a `FaultPlan` (and re-exports
them: users import them from there, or from `localcluster.testing`);
`localcluster.plan.fault_text` writes and reads them as text;
`localcluster.runtime.faults` fires them inside a node's runtime.  Each is
a frozen dataclass that checks its fields when it is made, so a bad fault
is a `PlanError` where the plan is written, not when a node reaches it --
and, being plain data, a fault pickles to node processes and Ray actors
and compares equal to itself rebuilt from its text.

A fault names its node (`Partition`: two sides of node names or patterns)
and a trigger point: `Epoch` (the node's part of epoch k), `Op` (just
before the nth op of a type) or `Step` (just before a named step starts).
`FailCheckpoint` names an epoch instead, and `Partition` starts and heals
at an `Epoch` or at seconds into a run.
"""

import dataclasses

from ..errors import PlanError

__all__ = ["Epoch", "Op", "Step", "Kill", "Hang", "Delay", "FailCheckpoint",
           "Partition", "TRIGGERS", "FAULTS", "KILL_HOWS", "EXIT_STATUS"]

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


#: what a fault's ``at=`` may be
TRIGGERS = (Epoch, Op, Step)


def _trigger(at, fault):
    if not isinstance(at, TRIGGERS):
        raise PlanError(f"{fault}(at=...) must be Epoch(k), Op(op_type, nth) "
                        f"or Step(name), got {at!r}")


def _seconds(value, what, rule):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 <= value < float("inf"):
        raise PlanError(f"{what}={value!r}: {rule}")
    return float(value)


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
        _seconds(self.seconds, "Delay(seconds=)", "it must be a number >= 0")


@dataclasses.dataclass(frozen=True)
class FailCheckpoint:
    """``node``'s save of ``epoch`` fails (0 is the checkpoint a job makes
    after its init group)."""
    node: str
    epoch: int

    def __post_init__(self):
        _name(self.node, "FailCheckpoint(node)")
        _positive_int(self.epoch, "FailCheckpoint(epoch)", 0)


def _side(value, what):
    names = (value,) if isinstance(value, str) else value
    try:
        names = tuple(names)
    except TypeError:
        names = ()
    if not names or not all(isinstance(n, str) and n and "/" not in n and
                            "," not in n for n in names):
        raise PlanError(f"{what}={value!r}: one side of a partition is a "
                        "node name or pattern (without ',' -- the text form "
                        "separates them with commas), or a list of them")
    return names


def _point(value, what, rule):
    if isinstance(value, Epoch) or value is None:
        return value
    return _seconds(value, what, rule)


@dataclasses.dataclass(frozen=True)
class Partition:
    """From ``at`` on, records between the nodes of ``nodes_a`` and those
    of ``nodes_b`` (names or patterns) are held, not lost, until
    ``heal_at``; then they arrive, in order.

    ``at``: `Epoch` (k) -- from the start of the nodes' part of epoch k
    -- or a number of seconds into a run (then in every run);
    ``heal_at``: `Epoch` (m > k) -- the start of epoch m --, seconds into
    the run the partition started in, or None (it never heals: a reader
    waiting for held records ends with the run's timeout, which names the
    partition)."""
    nodes_a: tuple
    nodes_b: tuple
    at: object
    heal_at: object = None

    def __post_init__(self):
        a = _side(self.nodes_a, "Partition(nodes_a)")
        b = _side(self.nodes_b, "Partition(nodes_b)")
        object.__setattr__(self, "nodes_a", a)
        object.__setattr__(self, "nodes_b", b)
        if set(a) & set(b):
            raise PlanError(f"Partition({list(a)}, {list(b)}): "
                            f"{sorted(set(a) & set(b))} on both sides; a "
                            "node is on one side of a partition")
        rule = "a partition starts at Epoch(k) or seconds >= 0 into a run"
        at = _point(self.at, "Partition(at)", rule)
        if at is None:
            raise PlanError(f"Partition(at=None): {rule}")
        heal = _point(self.heal_at, "Partition(heal_at)",
                      "it heals at Epoch(m), at a number of seconds into the"
                      " run, or never (None)")
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "heal_at", heal)
        if isinstance(heal, Epoch) and not (isinstance(at, Epoch) and
                                            heal.k > at.k):
            raise PlanError(
                f"Partition(at={at!r}, heal_at={heal!r}): heal_at=Epoch(m) "
                "needs at=Epoch(k) with m > k")
        if isinstance(heal, float) and not isinstance(at, Epoch) and \
                heal <= at:
            raise PlanError(
                f"Partition(at={at!r}, heal_at={heal!r}): it must heal after"
                " it starts (both are seconds into the run)")

    @property
    def node(self):
        """Both sides, as `Fired` and printed plans name a fault's node."""
        return f"{','.join(self.nodes_a)}|{','.join(self.nodes_b)}"


#: what a `FaultPlan` holds
FAULTS = (Kill, Hang, Delay, FailCheckpoint, Partition)
