"""Scale figures of scripts/bench.py: how building a job, starting its
nodes, running them and training grow with their number.

Each figure is a ratio of the same work at two sizes, measured in the
same run, so the growth shows whatever the machine's speed:

- build + grouping of 1 reader + N trainer nodes (a Task each, then
  ``tasks_by_node``) at N = 10, 100, 1000 and 10000 (``--quick``: up to
  1000): linear growth means 10x the nodes within 12x the time, and
  10000 of them under 3 s;
- start-up of N nodes (``LocalHostScheduler(nodes=...)``) and a no-op run
  on them, at N = 1, 4, 16, 64 and 256 (``--quick``: up to 64): 16x the
  nodes from 16 to 256 within 20x the start-up time;
- the unique memory (USS) of an idle node process among 64, against 8 MiB;
- an epoch of the embedded job (``python -m localcluster.run``, its
  checkpoint included) at 2, 8 and 32 trainers (``--quick``: 2 and 8),
  shown as epochs per second.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

from benchlib import MiB, Row, Stat, alternate, noop_group, repeat, timed
from localcluster import Cluster, LocalHostScheduler, Node, Task, TaskGroup, ops

__all__ = ["measure"]

#: 10000 trainers build and group within this many seconds
BUILD_BOUND = 3.0
#: an idle node process's own memory
USS_BOUND = 8 * MiB
#: seconds the embedded job may take at one size
JOB_TIMEOUT = 120


def measure(cfg):
    """bench.py's scale section: every row of it."""
    return (_build_rows(cfg.quick) + _node_rows(cfg.quick) + _uss_rows() +
            _epoch_rows(cfg.quick))


def _growth_rows(prefix, what, stats, sizes, limits=None, unit="s"):
    """One row per step between consecutive ``sizes``: the figure at the
    bigger size against the smaller, labelled with the linear ratio."""
    limits = limits or {}
    return [Row(f"{prefix}_{small}_{big}", f"{what(big)} vs {small} "
                f"(linear: {big // small}x)", stats[big], stats[small],
                limits.get((small, big)), unit=unit)
            for small, big in zip(sizes, sizes[1:])]


# -- build + grouping ---------------------------------------------------------------

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


def _build_rows(quick):
    sizes = [10, 100, 1000] if quick else [10, 100, 1000, 10000]
    rounds = 2 if quick else 3
    stats = {n: repeat(lambda: _build(n), rounds if n < 10000 else 2)
             for n in sizes}
    rows = _growth_rows("build", lambda n: f"build + grouping of 1 + {n} "
                        "nodes", stats, sizes, {(1000, 10000): 12.0})
    if 10000 in stats:
        rows.append(Row("build_10000", f"build + grouping of 1 + 10000 "
                        f"nodes vs {BUILD_BOUND} s", stats[10000],
                        BUILD_BOUND, 1.0, strict=True))
    return rows


# -- start-up and a no-op run ---------------------------------------------------------

def _start_and_run(n, runs):
    """(seconds to start ``n`` nodes, the Stat of ``runs`` warm no-op runs
    on them)."""
    names = [f"scale_{i}" for i in range(n)]
    group = noop_group(names)
    start = time.perf_counter()
    scheduler = LocalHostScheduler(nodes=names)
    started = time.perf_counter() - start
    try:
        scheduler.run(group)   # plans sent
        run = alternate({"run": timed(lambda: scheduler.run(group))},
                        runs, 1, 1)["run"]
    finally:
        scheduler.close()
    return started, run


def _node_rows(quick):
    sizes = [1, 4, 16, 64] if quick else [1, 4, 16, 64, 256]
    rounds = 2 if quick else 3
    starts, runs = {}, {}
    for n in sizes:
        results = [_start_and_run(n, 5 if quick else 20)
                   for _ in range(rounds)]
        starts[n] = Stat.of([started for started, _ in results])
        runs[n] = Stat.of([run.median for _, run in results])
    rows = _growth_rows("startup", lambda n: f"start-up of {n} nodes",
                        starts, sizes)
    if 256 in starts:
        rows.append(Row("startup_16_256", "start-up of 256 nodes vs 16 "
                        "(linear: 16x)", starts[256], starts[16], 20.0))
    return rows + _growth_rows("noop_run", lambda n: f"no-op run on {n} "
                               "nodes", runs, sizes)


# -- idle memory --------------------------------------------------------------------

def _uss_rows():
    """The median USS of 64 idle node processes, against USS_BOUND."""
    scheduler = LocalHostScheduler(nodes=[f"idle_{i}" for i in range(64)])
    try:
        uss = [psutil.Process(pid).memory_full_info().uss
               for pid in scheduler.node_pids().values()]
    finally:
        scheduler.close()
    return [Row("idle_uss_64", "idle node memory (USS, median of 64) "
                "vs 8 MiB", Stat.of(uss), USS_BOUND, 1.0, unit="B")]


# -- the embedded job ---------------------------------------------------------------

def _epoch_seconds(trainers, epochs):
    """The Stat of the embedded job's epochs (training and checkpoint)
    at ``trainers`` trainer nodes, its first epoch left out (it starts
    the nodes' work: plans sent, nets compiled)."""
    directory = tempfile.mkdtemp(prefix="lc_bench_job_")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "localcluster.run", "--nodes",
             str(trainers), "--epochs", str(epochs), "--threads", "1",
             "--json", "--checkpoint-dir", os.path.join(directory, "ck")],
            capture_output=True, text=True, timeout=JOB_TIMEOUT)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the embedded job at {trainers} trainers exited "
                           f"{proc.returncode}: {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout)
    return Stat.of([e["seconds"] + e["checkpoint_seconds"]
                    for e in summary["epochs"][1:]])


def _epoch_rows(quick):
    sizes = [2, 8] if quick else [2, 8, 32]
    stats = {n: _epoch_seconds(n, 3 if quick else 6) for n in sizes}
    return [Row(f"epoch_{small}_{big}", f"embedded job epoch at {big} "
                f"trainers ({1 / stats[big].median:.1f} epochs/s) vs "
                f"{small} ({1 / stats[small].median:.1f} epochs/s)",
                stats[big], stats[small])
            for small, big in zip(sizes, sizes[1:])]
