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


# -- the text form ------------------------------------------------------------

SYNTAX = ("kill NODE at TRIGGER [by sigkill|exit|raise]; hang NODE at "
          "TRIGGER; delay NODE SECONDSs at TRIGGER; fail-checkpoint NODE at "
          "epoch K -- TRIGGER: epoch K | op TYPE [nth N] | step NAME")


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


def _text(fault):
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
    """The faults of ``text``: a list of word lists."""
    if not isinstance(text, str):
        raise PlanError(f"a fault plan's text must be a str, got {text!r}")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    lexer.commenters = ""
    faults, words = [], []
    try:
        for token in lexer:
            if token and set(token) == {";"}:
                faults.append(words)
                words = []
            else:
                words.append(token)
    except ValueError as exc:   # an unclosed quote
        raise PlanError(f"cannot read the fault plan {text!r}: {exc}") \
            from None
    faults.append(words)
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
    except IndexError:
        raise _bad(words, "it ends too soon") from None
    raise _bad(words, f"{kind!r} is no fault")


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
