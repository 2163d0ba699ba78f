"""``--cpus PATTERN=CPUS`` on the command line: pin nodes to CPUs.

``--cpus 'trainer_*=0,1' --cpus 'ps=2-3'`` sets ``Node(name, cpus=[...])``
on every node of the job the pattern matches (fnmatch; the last matching
``--cpus`` wins), as if the job had said so: the tasks already built carry
it to the session, and the cluster hands it to the groups built later
(the checkpoints').  CPU lists are ids and ranges (``0,2-3``); a CPU this
process may not use, or a pattern that matches no node, is a usage error
naming it.
"""

import os

from .jobspec import UsageError, job_nodes, nodes_matching
from ..task import Node

__all__ = ["parse_cpus", "apply_cpus"]

MAX_CPU = 1 << 16


def parse_cpus(text):
    """``(pattern, [cpu ids])`` of ``PATTERN=0,1,4-7``; ValueError naming
    what is wrong."""
    pattern, sep, listed = text.partition("=")
    if not sep or not pattern or not listed:
        raise ValueError(f"{text[:60]!r} is not NODE=CPUS; e.g. "
                         "'trainer_*=0,1' or 'ps=2-3'")
    cpus = []
    for part in listed.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(f"{part.strip()[:20]!r} in {text[:60]!r} is not "
                             "a CPU id or a range like 2-3") from None
        if not 0 <= first <= last < MAX_CPU:
            raise ValueError(f"{part.strip()!r} in {text[:60]!r} is not a "
                             "range of CPU ids from low to high")
        cpus.extend(c for c in range(first, last + 1) if c not in cpus)
    return pattern, cpus


def apply_cpus(job, specs):
    """Pin the job's nodes as ``specs`` (``[(pattern, cpus)]``) say;
    ``{node: cpus}`` of the nodes pinned."""
    if not specs:
        return {}
    nodes = job_nodes(job)
    available = sorted(os.sched_getaffinity(0))
    chosen = {}
    for pattern, cpus in specs:
        matched = nodes_matching("--cpus", pattern, nodes)
        missing = sorted(set(cpus) - set(available))
        if missing:
            raise UsageError(f"--cpus {pattern}=...: cpus {missing} are not "
                             f"usable here; this process may use cpus "
                             f"{_ranges(available)}")
        chosen.update(dict.fromkeys(matched, cpus))
    pinned = _by_task_node(job, chosen)
    for _, group in job.printable_groups():
        for task in group.tasks():
            if task.node in pinned:
                task.node_kwargs = dict(task.node_kwargs or {},
                                        cpus=pinned[task.node])
    instances = {f"{name}_{i}" for name, count in job.prototypes().items()
                 for i in range(count)}
    for node, cpus in chosen.items():
        if node not in instances:   # a prototype's tasks carry its own
            Node(node, cpus=list(cpus))
    return chosen


def _by_task_node(job, chosen):
    """``{task node: cpus option}`` of ``chosen`` (``{node: cpus}``): a
    prototype some of whose instances are pinned gets one CPU list per
    instance (its own, or every usable CPU for one not pinned), which
    `Node(cpus=[[...], ...])` spreads over them."""
    pinned = {node: list(cpus) for node, cpus in chosen.items()}
    available = sorted(os.sched_getaffinity(0))
    for name, count in job.prototypes().items():
        each = [chosen.get(f"{name}_{i}") for i in range(count)]
        if all(c is None for c in each):
            continue
        if all(c == each[0] for c in each):
            pinned[name] = list(each[0])
        else:
            pinned[name] = [list(c) if c is not None else available
                            for c in each]
    return pinned


def _ranges(cpus):
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    out, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            out.append(f"{start}" if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(out)
