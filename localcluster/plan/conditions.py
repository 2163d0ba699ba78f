"""Cluster conditions as plain data: slow nodes and thin links.

::

    with Cluster(links=[Link("reader", "trainer_*", latency=0.005,
                             bandwidth=100e6)]):
        with Node("trainer_1", slowdown=3): ...
    LocalHostScheduler(conditions=[Slowdown("trainer_*", 2),
                                   Link("*", "ps", bandwidth=125e6)])

- ``Node(name, slowdown=s)`` / `Slowdown(pattern, s)`: every op the node
  runs takes ``s`` times as long -- the node waits, after each op, for
  ``s - 1`` times the time the op took (its waits for records or timers
  not counted: a slow machine computes slowly, it does not wait longer).
- `Link(src, dst, latency, bandwidth, jitter, seed)`: a record written to
  a queue on a node matching ``src`` and read on one matching ``dst``
  becomes readable ``latency`` + a uniform draw from ``[0, jitter)`` +
  its bytes / ``bandwidth`` after it was written; records on one link
  queue behind each other (a link moves one record at a time, in order).
  A record in flight still counts against its queue's capacity.
- `Partition` (a fault: `localcluster.plan.faults`) holds the records
  between two sets of nodes for a while.

Patterns are `fnmatch` patterns of node names.  Where several conditions
name one node or one pair of nodes, the last one given wins, and a
session's ``conditions=`` come after the links of the job's `Cluster`
(so the command line overrides what the job says).  A link applies to
queues between two nodes only: a queue written and read on one node is
memory, not a network.

`resolve` turns the conditions a run is under into what each node's
runtime needs (`NodeConditions`, `InLink`): plain, picklable values that
travel with the run like its epoch does.  It is also where bad
conditions are refused, as `PlanError`s naming the value and the rule: a
pattern that matches no node of the job, a node that does not exist.
"""

import dataclasses
import fnmatch
import math
import re

from ..errors import PlanError
from .faults import Epoch

__all__ = ["Link", "Slowdown", "NodeConditions", "InLink", "resolve",
           "as_conditions", "parse_link", "parse_slowdown", "check_slowdown",
           "parse_seconds", "parse_bandwidth"]


def _number(value, what, rule, low=0.0, strict=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            math.isnan(value) or math.isinf(value) or value < low or \
            (strict and value == low):
        raise PlanError(f"{what}={value!r}: {rule}")
    return float(value)


def _pattern(value, what):
    if not isinstance(value, str) or not value or "/" in value:
        raise PlanError(f"{what}={value!r}: a node name or an fnmatch "
                        "pattern of node names, such as 'trainer_*', is "
                        "needed")
    return value


def check_slowdown(value, what):
    """``value`` as a slowdown factor (a number >= 1), else PlanError."""
    return _number(value, what, "a slowdown is a factor >= 1 (1: as fast "
                   "as this machine; 3: every op takes three times as long)",
                   low=1.0)


@dataclasses.dataclass(frozen=True)
class Link:
    """The network between nodes matching ``src`` and ``dst`` (see the
    module docstring): ``latency`` and ``jitter`` in seconds,
    ``bandwidth`` in bytes per second (None: unlimited), ``seed`` for the
    jitter's draws."""
    src: str
    dst: str
    latency: float = 0.0
    bandwidth: float = None
    jitter: float = 0.0
    seed: int = 0

    def __post_init__(self):
        _pattern(self.src, "Link(src)")
        _pattern(self.dst, "Link(dst)")
        _number(self.latency, f"Link({self.src!r}, {self.dst!r}, latency)",
                "latency is a number of seconds >= 0")
        _number(self.jitter, f"Link({self.src!r}, {self.dst!r}, jitter)",
                "jitter is a number of seconds >= 0")
        if self.bandwidth is not None:
            _number(self.bandwidth,
                    f"Link({self.src!r}, {self.dst!r}, bandwidth)",
                    "bandwidth is a number of bytes per second > 0 (or None:"
                    " unlimited)", strict=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise PlanError(f"Link(seed={self.seed!r}): the jitter's seed is "
                            "an int")

    def matches(self, src, dst):
        return fnmatch.fnmatchcase(src, self.src) and \
            fnmatch.fnmatchcase(dst, self.dst)

    def __str__(self):
        """The text `parse_link` reads: ``src->dst:latency=...``."""
        parts = []
        if self.latency:
            parts.append(f"latency={_seconds_text(self.latency)}")
        if self.bandwidth is not None:
            parts.append(f"bandwidth={self.bandwidth:g}B/s")
        if self.jitter:
            parts.append(f"jitter={_seconds_text(self.jitter)}")
        if self.seed:
            parts.append(f"seed={self.seed}")
        return f"{self.src}->{self.dst}:" + ",".join(parts)


@dataclasses.dataclass(frozen=True)
class Slowdown:
    """Every node matching ``node`` runs each op ``factor`` times as long:
    ``Node(name, slowdown=factor)`` given to a session (or on the command
    line, ``--slowdown node=factor``) rather than in the job."""
    node: str
    factor: float

    def __post_init__(self):
        _pattern(self.node, "Slowdown(node)")
        check_slowdown(self.factor, f"Slowdown({self.node!r}, factor)")

    def __str__(self):
        return f"{self.node}={self.factor:g}"


_CONDITIONS = (Link, Slowdown)


def as_conditions(value, who):
    """``value`` (None, a condition, or an iterable of them) as a tuple of
    conditions; a PlanError naming ``who`` for anything else."""
    if value is None:
        return ()
    if isinstance(value, _CONDITIONS):
        return (value,)
    try:
        items = tuple(value)
    except TypeError:
        items = (value,)
    for item in items:
        if not isinstance(item, _CONDITIONS):
            raise PlanError(
                f"{who}(conditions=...) takes Link and Slowdown values (a "
                f"Partition is a fault: give it in faults=FaultPlan(...)), "
                f"got {item!r}")
    return items


# -- what a node's runtime gets ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class InLink:
    """What the reading node of a cross-node queue applies to its records:
    the link from ``src`` (its parameters, or zeros) and the windows of
    the partitions that hold them -- ``(start, end, text)`` in seconds
    into the run (``end`` None: it does not heal in this run)."""
    src: str
    dst: str
    latency: float = 0.0
    bandwidth: float = None
    jitter: float = 0.0
    seed: str = ""
    windows: tuple = ()


@dataclasses.dataclass(frozen=True)
class NodeConditions:
    """One node's conditions in one run: its ``slowdown``, the queues it
    writes over a link (``outgoing``: ``((queue id, index), ...)``, its
    records carry the time they were sent and the index of their writing
    node) and those it reads over one (``incoming``: ``((queue id,
    inlinks), ...)``, ``inlinks`` the `InLink` from each writing node, by
    that index)."""
    slowdown: float = 1.0
    outgoing: tuple = ()   # ((queue id, writer index), ...)
    incoming: tuple = ()   # ((queue id, (InLink, ...)), ...)

    def __bool__(self):
        return self.slowdown != 1.0 or bool(self.outgoing or self.incoming)


def _matching(pattern, nodes):
    return [n for n in nodes if fnmatch.fnmatchcase(n, pattern)]


def check_patterns(conditions, partitions, known):
    """PlanError for a condition naming a node (or pattern) that no node
    of the job ``known`` matches."""
    known = sorted(known)
    shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")

    def check(pattern, owner, role):
        if not _matching(pattern, known):
            what = "pattern" if any(c in pattern for c in "*?[") else "node"
            # a Slowdown's node is "the node 'x'", not "the node node 'x'"
            named = what if role == what else f"{role} {what}"
            raise PlanError(
                f"{owner}: the {named} {pattern!r} matches no node of "
                f"the job (nodes: {shown}); name nodes the job has, or use a"
                " pattern that matches them")

    for c in conditions:
        if isinstance(c, Link):
            check(c.src, repr(c), "src")
            check(c.dst, repr(c), "dst")
        else:
            check(c.node, repr(c), "node")
    for p in partitions:
        for side in (p.nodes_a, p.nodes_b):
            for pattern in side:
                check(pattern, repr(p), "side")


def resolve(plans, conditions, partitions, epoch, queues):
    """``{node: NodeConditions}`` of a run (only nodes with any), or None
    when nothing applies.

    ``plans``: the run's NodePlans (their ``node_kwargs`` may carry a
    ``slowdown``); ``conditions``: Links and Slowdowns, later ones
    winning; ``partitions``: ``[(index, Partition)]`` of the session's
    fault plan; ``epoch``: the JobRunner epoch of the run or None;
    ``queues``: ``{queue id: (writer nodes, reader nodes)}`` of the run's
    cross-node queues."""
    slowdowns = {}
    for plan in plans:
        factor = plan.node_kwargs.get("slowdown")
        if factor is not None and factor != 1:
            slowdowns[plan.node] = float(factor)
    for c in conditions:
        if isinstance(c, Slowdown):
            for plan in plans:
                if fnmatch.fnmatchcase(plan.node, c.node):
                    slowdowns[plan.node] = c.factor
    links = [c for c in conditions if isinstance(c, Link)]
    outgoing, incoming = {}, {}
    for queue, (writers, readers) in sorted(queues.items()):
        # every pair of a writing and a reading node of the queue: if any
        # is over a link (or partitioned), every writer stamps its records
        # and every reader holds each record as its own link says
        inlinks, linked = {}, False
        for dst in readers:
            for index, src in enumerate(writers):
                link = None
                if src != dst:
                    for candidate in links:
                        if candidate.matches(src, dst):
                            link = candidate
                windows = () if src == dst else tuple(
                    w for _, p in partitions
                    for w in _windows(p, src, dst, epoch))
                linked = linked or link is not None or bool(windows)
                inlinks[dst, index] = InLink(
                    src, dst, link.latency if link else 0.0,
                    link.bandwidth if link else None,
                    link.jitter if link else 0.0,
                    f"{link.seed if link else 0}:{src}->{dst}:{epoch}",
                    windows)
        if not linked:
            continue
        for index, src in enumerate(writers):
            outgoing.setdefault(src, []).append((queue, index))
        for dst in readers:
            incoming.setdefault(dst, []).append((queue, tuple(
                inlinks[dst, index] for index in range(len(writers)))))
    found = {}
    for node in {p.node for p in plans}:
        nc = NodeConditions(slowdowns.get(node, 1.0),
                            tuple(outgoing.get(node, ())),
                            tuple(incoming.get(node, ())))
        if nc:
            found[node] = nc
    return found or None


def _sides(partition, src, dst):
    def on(side, node):
        return any(fnmatch.fnmatchcase(node, p) for p in side)
    a, b = partition.nodes_a, partition.nodes_b
    return (on(a, src) and on(b, dst)) or (on(b, src) and on(a, dst))


def _window(partition, epoch):
    """``(start, end)`` of ``partition`` in a run of ``epoch`` -- seconds
    into the run, ``end`` None if it does not heal in it -- or None when
    it is not in force then."""
    at, heal = partition.at, partition.heal_at
    if isinstance(at, (int, float)):        # seconds into every run
        return float(at), None if heal is None else float(heal)
    if epoch is None or epoch < at.k:       # from the start of epoch k
        return None
    if heal is None or (isinstance(heal, Epoch) and epoch < heal.k):
        return 0.0, None
    if not isinstance(heal, Epoch) and epoch == at.k:
        return 0.0, float(heal)
    return None


def _windows(partition, src, dst, epoch):
    """The windows ``partition`` holds records from ``src`` to ``dst`` in
    a run of ``epoch`` (see `InLink`)."""
    window = _window(partition, epoch)
    if window is None or not _sides(partition, src, dst):
        return ()
    return (window + (repr(partition),),)


def in_force(partitions, epoch):
    """The partitions of ``partitions`` (``[(index, Partition)]``) in force
    in a run of ``epoch``."""
    return [(i, p) for i, p in partitions if _window(p, epoch) is not None]


# -- the text form (the command line) ------------------------------------------

_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9,
            "": 1.0}
_BYTES = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024,
          "mib": 1024 ** 2, "gib": 1024 ** 3}
_BITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}
_AMOUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(.*?)\s*$")


def _seconds_text(value):
    if value >= 1:
        return f"{value:g}s"
    if value >= 1e-3:
        return f"{value * 1e3:g}ms"
    return f"{value * 1e6:g}us"


def parse_seconds(text, what):
    """``"5ms"``, ``"0.2s"``, ``"150us"`` or a bare number of seconds."""
    found = _AMOUNT.match(str(text))
    unit = found.group(2).lower() if found else None
    if unit not in _SECONDS:
        raise PlanError(f"{what}={text!r}: write a time such as 5ms, 0.2s "
                        "or 150us")
    return float(found.group(1)) * _SECONDS[unit]


def parse_bandwidth(text, what):
    """``"100MB/s"``, ``"1Gbit/s"``, ``"512KiB/s"`` or bytes per second."""
    found = _AMOUNT.match(str(text))
    unit = found.group(2).lower() if found else None
    if unit is not None:
        unit = unit[:-2] if unit.endswith("/s") else unit
        unit = unit or "b"
        scale = _BYTES.get(unit, _BITS.get(unit))
        if scale is not None:
            return float(found.group(1)) * scale
    raise PlanError(f"{what}={text!r}: write a bandwidth such as 100MB/s, "
                    "1Gbit/s or 512KiB/s")


_LINK_TEXT = ("SRC->DST:latency=5ms,bandwidth=100MB/s,jitter=1ms,seed=0 "
              "(SRC and DST node names or patterns; every key optional)")


def parse_link(text):
    """A `Link` from ``'reader->trainer_*:latency=5ms,bandwidth=100MB/s'``
    (what ``--link`` takes)."""
    if not isinstance(text, str) or "->" not in text:
        raise PlanError(f"--link {text!r}: write {_LINK_TEXT}")
    ends, _, params = text.partition(":")
    src, _, dst = ends.partition("->")
    kwargs = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in ("latency", "bandwidth", "jitter", "seed"):
            raise PlanError(f"--link {text!r}: {item!r} is not one of "
                            f"latency=, bandwidth=, jitter=, seed=; write "
                            f"{_LINK_TEXT}")
        if key == "bandwidth":
            kwargs[key] = parse_bandwidth(value, "bandwidth")
        elif key == "seed":
            try:
                kwargs[key] = int(value)
            except ValueError:
                raise PlanError(f"--link {text!r}: seed={value!r} is not an "
                                "int") from None
        else:
            kwargs[key] = parse_seconds(value, key)
    return Link(src.strip(), dst.strip(), **kwargs)


def parse_slowdown(text):
    """A `Slowdown` from ``'trainer_1=3'`` (what ``--slowdown`` takes)."""
    node, eq, factor = str(text).partition("=")
    try:
        value = float(factor)
    except ValueError:
        value = None
    if not eq or value is None:
        raise PlanError(f"--slowdown {text!r}: write NODE=FACTOR, such as "
                        "trainer_1=3 or 'trainer_*=2' (a factor >= 1)")
    # named as written (trainer_1=0.5), not as the value's fields are
    check_slowdown(value, node.strip())
    return Slowdown(node.strip(), value)
