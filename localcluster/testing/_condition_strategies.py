"""The `conditions` strategy: lists of cluster conditions (`Link`,
`Slowdown`) for a job's nodes.

`localcluster.testing.strategies` re-exports `conditions`, where users
import it from; the job checks take what it draws, or the strategy itself,
as ``conditions=`` (`._check_conditions` draws from it with a fixed seed).
What it draws is plain `localcluster.plan.conditions` values, valid for
the nodes it was given: every link end and slowdown node is one of their
names, or a pattern matching some of them, so a draw never fails
`check_patterns` for those nodes.  Seconds are whole microseconds and
bandwidths three significant digits, so a drawn condition's repr -- what
hypothesis and a failed check's replay line show -- reads as written.
"""

import functools
import math

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ..plan.conditions import Link, Slowdown
from ._strategy_args import int_arg, node_names

__all__ = ["conditions"]


def _span(name, value, positive=False):
    """``value`` as a ``(low, high)`` pair of finite numbers, else
    InvalidArgument."""
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        not isinstance(v, bool) and isinstance(v, (int, float)) and
        v == v and abs(v) != float("inf") for v in value)
    if ok:
        low, high = value
        ok = (low > 0 if positive else low >= 0) and low <= high
    if not ok:
        rule = "0 < low <= high" if positive else "0 <= low <= high"
        raise InvalidArgument(f"{name}={value!r} must be a pair (low, high) "
                              f"of finite numbers, {rule}")
    return float(value[0]), float(value[1])


def _literal(name):
    """An fnmatch pattern matching exactly ``name``."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


@functools.lru_cache(maxsize=None)
def _endpoints(names):
    """A node of ``names`` by name (first: shrinks there), or a pattern
    matching some of them: a name's prefix up to a ``_``, ``-`` or ``.``
    and ``*``, or ``*``."""
    prefixes = sorted({_literal(n[:i + 1]) + "*" for n in names
                       for i in range(1, len(n) - 1) if n[i] in "_-."})
    return st.one_of(st.sampled_from([_literal(n) for n in names]),
                     st.sampled_from(prefixes + ["*"]))


@functools.lru_cache(maxsize=None)
def _seconds(low, high):
    """Seconds in ``[low, high]`` in whole microseconds (readable in a
    repr), shrinking to ``low``."""
    first, last = math.ceil(low * 1e6), math.floor(high * 1e6)
    if first > last:
        return st.just(low)
    return st.integers(first, last).map(lambda us: us / 1e6)


@functools.lru_cache(maxsize=None)
def _bandwidths(span):
    """None (unlimited, first) or bytes per second in ``span``, log-uniform
    to three digits, shrinking towards the fastest."""
    if span is None:
        return st.none()
    low, high = span

    def value(k):
        rounded = float(f"{high * (low / high) ** (k / 1000):.3g}")
        return min(max(rounded, low), high)
    return st.one_of(st.none(), st.integers(0, 1000).map(value))


@st.composite
def _links(draw, names, latency, jitter, bandwidth):
    src = draw(_endpoints(names))
    # the other nodes first: a link shrinks to one between two nodes
    others = tuple(n for n in names if _literal(n) != src)
    dst = draw(_endpoints(others + tuple(n for n in names
                                         if n not in others)))
    spread = draw(_seconds(*jitter))
    return Link(src, dst, latency=draw(_seconds(*latency)),
                bandwidth=draw(_bandwidths(bandwidth)), jitter=spread,
                seed=draw(st.integers(0, 2 ** 16)) if spread else 0)


@st.composite
def _conditions(draw, names, max_links, max_slowdowns, latency, jitter,
                bandwidth, max_slowdown):
    links = draw(st.lists(_links(names, latency, jitter, bandwidth),
                          max_size=max_links))
    slow = st.builds(Slowdown, _endpoints(names),
                     st.integers(1, max_slowdown))
    return links + draw(st.lists(slow, max_size=max_slowdowns))


def conditions(nodes, max_links=2, slowdowns=True, *,
               latency=(0, 0.005), jitter=(0, 0.001),
               bandwidth=(1e6, 1e9), max_slowdowns=2, max_slowdown=4):
    """A list of cluster conditions for a job on ``nodes``: up to
    ``max_links`` `Link`\\ s, then (if ``slowdowns``) up to
    ``max_slowdowns`` `Slowdown`\\ s -- what every session and
    `localcluster.testing.check_job` take as ``conditions=``.

    ``nodes`` is an int N (``node_0`` ... ``node_{N-1}``, as the other
    strategies name them) or a list of node names.  A link's ends and a
    slowdown's node are each a node's name, or a pattern matching some of
    them (a name's prefix up to ``_``, ``-`` or ``.`` and ``*``, such as
    ``node_*``; or ``*``), so every drawn condition matches a node of
    ``nodes``: give the nodes the job has (a `DrawnJob`'s ``.nodes``) --
    a pattern matching no node of the job is a `PlanError` when it runs.

    A link's ``latency`` and ``jitter`` are drawn from those ranges of
    seconds (whole microseconds; by default a few ms at most, so real-time
    runs stay fast), its ``bandwidth`` is unlimited or bytes per second
    drawn from that range (None: always unlimited); a slowdown's factor is
    an int from 1 to ``max_slowdown``.

    Shrinks towards no conditions; a link towards one between two named
    nodes, with no latency, jitter or bandwidth limit; a slowdown towards
    factor 1.  Misuse raises ``InvalidArgument`` when the strategy is
    made.

    ::

        @given(drawn=jobs(), data=st.data())
        def test_links_change_nothing(drawn, data):
            conds = data.draw(conditions(list(drawn.nodes)))
            with LocalSession(schedule=0, conditions=conds) as session: ...
    """
    names = node_names(nodes)
    int_arg("max_links", max_links, 0)
    int_arg("max_slowdowns", max_slowdowns, 0)
    int_arg("max_slowdown", max_slowdown, 1)
    if not isinstance(slowdowns, bool):
        raise InvalidArgument(f"slowdowns={slowdowns!r} must be True or "
                              "False")
    latency = _span("latency", latency)
    jitter = _span("jitter", jitter)
    if bandwidth is not None:
        bandwidth = _span("bandwidth", bandwidth, positive=True)
    max_slowdowns = max_slowdowns if slowdowns else 0
    strategy = _conditions(names, max_links, max_slowdowns, latency, jitter,
                           bandwidth, max_slowdown)
    # the job checks draw from it with a generator of their own
    strategy.draw_conditions = functools.partial(
        _own_draw, names, max_links, max_slowdowns, latency, jitter,
        bandwidth, max_slowdown)
    return strategy


def _own_draw(names, max_links, max_slowdowns, latency, jitter, bandwidth,
              max_slowdown, rng, horizon=0.0):
    """One list of conditions as `conditions` draws it, from ``rng`` (a
    `random.Random`) alone; latencies reach up to twice ``horizon`` (the
    plan's longest time constant) when that is past the given range."""
    literal = [_literal(n) for n in names]
    prefixes = sorted({_literal(n[:i + 1]) + "*" for n in names
                       for i in range(1, len(n) - 1) if n[i] in "_-."})

    def end(pool):
        if rng.random() < 0.5 or not prefixes:
            return rng.choice(pool)
        return rng.choice(prefixes + ["*"])

    def seconds(low, high):
        first, last = math.ceil(low * 1e6), math.floor(high * 1e6)
        return low if first > last else rng.randint(first, last) / 1e6

    low, high = latency
    if horizon and 2 * horizon > high:
        high = 2 * horizon
    drawn = []
    for _ in range(rng.randint(0, max_links)):
        src = end(literal)
        dst = end([n for n in literal if n != src] or literal)
        spread = seconds(*jitter)
        speed = None
        if bandwidth is not None and rng.random() < 0.5:
            lo, hi = bandwidth
            speed = min(max(float(f"{hi * (lo / hi) ** rng.random():.3g}"),
                            lo), hi)
        drawn.append(Link(src, dst, latency=seconds(low, high),
                          bandwidth=speed, jitter=spread,
                          seed=rng.randint(0, 2 ** 16) if spread else 0))
    for _ in range(rng.randint(0, max_slowdowns)):
        drawn.append(Slowdown(end(literal), rng.randint(1, max_slowdown)))
    return drawn
