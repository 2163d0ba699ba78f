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
import shlex
import threading

from ..errors import PlanError

__all__ = ["Epoch", "Op", "Step", "Kill", "Hang", "Delay", "FailCheckpoint",
           "Partition", "FaultPlan", "Fired", "KILL_HOWS", "EXIT_STATUS"]

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


_FAULTS = (Kill, Hang, Delay, FailCheckpoint, Partition)


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
                    f"FaultPlan takes Kill, Hang, Delay, FailCheckpoint and "
                    f"Partition faults, got {fault!r}")
        self.faults = tuple(faults)
        self._fired = []
        self._lock = threading.Lock()

    def __repr__(self):
        return f"FaultPlan({', '.join(map(repr, self.faults))})"

    def __str__(self):
        """The plan in the text syntax `parse` reads (see `parse`)."""
        return "; ".join(map(_text, self.faults))

    @classmethod
    def parse(cls, text):
        """A FaultPlan from its text form -- what ``str(plan)`` prints, and
        what ``--faults`` takes: faults separated by ``;``, each one of ::

            kill NODE at TRIGGER [by sigkill|exit|raise]
            hang NODE at TRIGGER
            delay NODE SECONDSs at TRIGGER
            fail-checkpoint NODE at epoch K
            partition NODES from NODES at epoch K|SECONDSs
                [heal at epoch M|SECONDSs]

        where TRIGGER is ``epoch K``, ``op TYPE [nth N]`` or ``step NAME``,
        and a name with spaces or ``;`` is quoted as in a shell.  A
        PlanError names the part it cannot read and the syntax."""
        return cls(*(_parse_one(words) for words in _split(text)))

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
        """The node names the faults name (a partition's sides are
        patterns: see `partitions`)."""
        return sorted({f.node for f in self.faults
                       if not isinstance(f, Partition)})

    def partitions(self):
        """``[(index, Partition)]`` of the plan."""
        return [(i, f) for i, f in enumerate(self.faults)
                if isinstance(f, Partition)]

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


# -- the text form ------------------------------------------------------------

SYNTAX = ("kill NODE at TRIGGER [by sigkill|exit|raise]; hang NODE at "
          "TRIGGER; delay NODE SECONDSs at TRIGGER; fail-checkpoint NODE at "
          "epoch K; partition NODES from NODES at epoch K|SECONDSs [heal at "
          "epoch M|SECONDSs] -- TRIGGER: epoch K | op TYPE [nth N] | step "
          "NAME; NODES: names or patterns separated by commas")


def _word(name):
    return shlex.quote(name) if name != shlex.quote(name) or ";" in name \
        else name


def _at_text(at):
    if isinstance(at, Epoch):
        return f"epoch {at.k}"
    if isinstance(at, Op):
        return f"op {_word(at.op_type)}" + (f" nth {at.nth}" if at.nth != 1
                                            else "")
    return f"step {_word(at.name)}"


def _point_text(point):
    return f"epoch {point.k}" if isinstance(point, Epoch) else f"{point!r}s"


def _text(fault):
    if isinstance(fault, Partition):
        return (f"partition {_word(','.join(fault.nodes_a))} from "
                f"{_word(','.join(fault.nodes_b))} at {_point_text(fault.at)}"
                + ("" if fault.heal_at is None else
                   f" heal at {_point_text(fault.heal_at)}"))
    node = _word(fault.node)
    if isinstance(fault, Kill):
        return f"kill {node} at {_at_text(fault.at)}" + (
            f" by {fault.how}" if fault.how != "sigkill" else "")
    if isinstance(fault, Hang):
        return f"hang {node} at {_at_text(fault.at)}"
    if isinstance(fault, Delay):
        return f"delay {node} {fault.seconds!r}s at {_at_text(fault.at)}"
    return f"fail-checkpoint {node} at epoch {fault.epoch}"


def _split(text):
    """The faults of ``text``: a list of word lists.  Faults end at a
    ``;`` outside quotes -- a quoted ``';'`` is a node's name, however
    the words then read."""
    if not isinstance(text, str):
        raise PlanError(f"a fault plan's text must be a str, got {text!r}")
    pieces, start, quote, escaped = [], 0, None, False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == ";":
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    try:
        faults = [shlex.split(piece, comments=False) for piece in pieces]
    except ValueError as exc:   # an unclosed quote
        raise PlanError(f"cannot read the fault plan {text!r}: {exc}") \
            from None
    return [w for w in faults if w]


def _bad(words, why):
    return PlanError(f"cannot read the fault {' '.join(words)!r}: {why}; "
                     f"write {SYNTAX}")


def _number(words, text, kind):
    try:
        return kind(text)
    except ValueError:
        raise _bad(words, f"{text!r} is not a number") from None


def _trigger_of(words, rest):
    if len(rest) == 2 and rest[0] == "epoch":
        return Epoch(_number(words, rest[1], int))
    if len(rest) == 2 and rest[0] == "step":
        return Step(rest[1])
    if rest and rest[0] == "op" and len(rest) in (2, 4) and \
            (len(rest) == 2 or rest[2] == "nth"):
        return Op(rest[1], _number(words, rest[3], int)
                  if len(rest) == 4 else 1)
    raise _bad(words, f"{' '.join(rest) or 'nothing'!r} is no trigger point")


def _parse_one(words):
    kind = words[0]
    try:
        if kind == "kill":
            how = "sigkill"
            rest = words[3:]
            if len(rest) >= 2 and rest[-2] == "by":
                how, rest = rest[-1], rest[:-2]
            _expect(words, 2, "at")
            return Kill(words[1], _trigger_of(words, rest), how)
        if kind == "hang":
            _expect(words, 2, "at")
            return Hang(words[1], _trigger_of(words, words[3:]))
        if kind == "delay":
            _expect(words, 3, "at")
            seconds = words[2]
            if not seconds.endswith("s"):
                raise _bad(words, f"{seconds!r} needs its unit: 0.5s")
            return Delay(words[1], _trigger_of(words, words[4:]),
                         _number(words, seconds[:-1], float))
        if kind == "fail-checkpoint":
            _expect(words, 2, "at")
            if words[3] != "epoch" or len(words) != 5:
                raise _bad(words, "a checkpoint fails at an epoch")
            return FailCheckpoint(words[1], _number(words, words[4], int))
        if kind == "partition":
            return _partition_of(words)
    except IndexError:
        raise _bad(words, "it ends too soon") from None
    raise _bad(words, f"{kind!r} is no fault")


def _point_of(words, rest):
    if len(rest) == 2 and rest[0] == "epoch":
        return Epoch(_number(words, rest[1], int))
    if len(rest) == 1 and rest[0].endswith("s"):
        return _number(words, rest[0][:-1], float)
    raise _bad(words, f"{' '.join(rest) or 'nothing'!r} is not 'epoch K' "
                      "nor a number of seconds such as 0.5s")


def _partition_of(words):
    _expect(words, 2, "from")
    _expect(words, 4, "at")
    rest = words[5:]
    heal = None
    if "heal" in rest:
        cut = rest.index("heal")
        if rest[cut + 1:cut + 2] != ["at"]:
            raise _bad(words, "write 'heal at epoch M' or 'heal at 0.5s'")
        heal = _point_of(words, rest[cut + 2:])
        rest = rest[:cut]
    return Partition(words[1].split(","), words[3].split(","),
                     _point_of(words, rest), heal)


def _expect(words, index, word):
    if len(words) <= index or words[index] != word:
        raise _bad(words, f"expected {word!r} after "
                          f"{' '.join(words[:index])!r}")


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
