"""Scale figures of scripts/bench.py: how building a job and starting its
nodes grow with their number, and what an idle node costs.

Each figure is a ratio of the same work at two sizes, measured in the
same run, so the growth shows whatever the machine's speed:

- build + grouping of 1 reader + N trainer nodes (a Task each, then
  ``tasks_by_node``) at N = 10, 100, 1000 and 10000 (``--quick``: up to
  1000): linear growth means 10x the nodes within 12x the time, and
  10000 of them under 3 s;
- start-up of N nodes (``LocalHostScheduler(nodes=...)``) at 16 and 256
  (``--quick``: 16 and 64): 16x the nodes within 20x the time;
- the unique memory (USS) of an idle node process among 64, against 8 MiB.

bench.py hands itself over (``measurement(bench)``): it runs as __main__.
"""

import statistics
import time

import numpy as np
import psutil

from localcluster import (Cluster, LocalHostScheduler, Node, Task,
                          TaskGroup, ops)

__all__ = ["measurement"]

MiB = 1 << 20
#: 10000 trainers build and group within this many seconds
BUILD_BOUND = 3.0
#: an idle node process's own memory
USS_BOUND = 8 * MiB


def measurement(bench):
    """bench.py's scale section, ``measure_scale(cfg) -> rows``."""
    def measure_scale(cfg):
        quick = cfg.startup_rounds < 3
        return (_build_rows(bench, quick) + _startup_rows(bench, quick) +
                _uss_rows(bench))
    return measure_scale


def _build(n):
    """Seconds to build and group a job of 1 reader + ``n`` trainers."""
    start = time.perf_counter()
    with Cluster(), TaskGroup() as group:
        with Node("reader"), Task(name="read"):
            ops.Const(np.ones(1), name="x")
        for i in range(n):
            with Node(f"trainer_{i}"), Task(name="train"):
                ops.Const(np.ones(1), name="w")
        group.tasks_by_node()
    return time.perf_counter() - start


def _median(fn, n, rounds):
    return statistics.median(fn(n) for _ in range(rounds))


def _build_rows(bench, quick):
    sizes = [10, 100, 1000] if quick else [10, 100, 1000, 10000]
    rounds = 2 if quick else 3
    times = {n: _median(_build, n, rounds if n < 10000 else 1)
             for n in sizes}
    rows = [bench.Row(f"build_{small}_{big}", f"build + grouping of 1 + "
                      f"{big} nodes vs 1 + {small} (linear: 10x)",
                      times[big], times[small], 12.0 if big >= 1000 else None)
            for small, big in zip(sizes, sizes[1:])]
    if 10000 in times:
        rows.append(bench.Row("build_10000", f"build + grouping of 1 + "
                              f"10000 nodes vs {BUILD_BOUND} s",
                              times[10000], BUILD_BOUND, 1.0, strict=True))
    return rows


def _start(n):
    """Seconds for ``LocalHostScheduler(nodes=...)`` to start ``n``."""
    names = [f"scale_{i}" for i in range(n)]
    start = time.perf_counter()
    scheduler = LocalHostScheduler(nodes=names)
    elapsed = time.perf_counter() - start
    scheduler.close()
    return elapsed


def _startup_rows(bench, quick):
    small, big = 16, 64 if quick else 256
    rounds = 2 if quick else 3
    times = {n: _median(_start, n, rounds) for n in (small, big)}
    return [bench.Row(f"startup_{small}_{big}", f"start-up of {big} nodes "
                      f"vs {small} (linear: {big // small}x)", times[big],
                      times[small], 20.0 if big == 256 else None)]


def _uss_rows(bench):
    """The median USS of 64 idle node processes, against USS_BOUND."""
    scheduler = LocalHostScheduler(nodes=[f"idle_{i}" for i in range(64)])
    try:
        uss = [psutil.Process(pid).memory_full_info().uss
               for pid in scheduler.node_pids().values()]
    finally:
        scheduler.close()
    return [bench.Row("idle_uss_64", "idle node memory (USS, median of 64) "
                      "vs 8 MiB", statistics.median(uss), USS_BOUND, 1.0,
                      unit="B")]
