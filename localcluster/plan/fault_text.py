"""A fault plan as text: what ``str(plan)`` prints and ``--faults`` takes.

::

    kill trainer_0 at epoch 2; delay reader 0.5s at op EnqueueRecords nth 3

`FaultPlan.__str__` and `FaultPlan.parse` (`localcluster.plan.faults`) call
`fault_text` and `parse_faults`; the command line reads ``--faults`` with
``FaultPlan.parse``.  What crosses is a str one way and the fault values
of `localcluster.plan.fault_types` the other: this module knows the faults,
not the plan that holds them (nor what fired), so it does not import
`faults` and `faults` imports it.  ``parse_faults(str(plan))`` gives the
plan's faults back, equal -- names with spaces or ``;`` are quoted as in a
shell -- and a `PlanError` names the fault it cannot read and `SYNTAX`.
"""

import shlex

from ..errors import PlanError
from .fault_types import (Delay, Epoch, FailCheckpoint, Hang, Kill, Op,
                          Partition, Step)

__all__ = ["SYNTAX", "fault_text", "parse_faults"]

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


def fault_text(fault):
    """``fault`` in the text syntax (see `SYNTAX`)."""
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


def parse_faults(text):
    """The faults ``text`` writes, in order (see `SYNTAX`)."""
    return [_parse_one(words) for words in _split(text)]


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

