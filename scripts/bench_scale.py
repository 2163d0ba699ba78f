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

Run as a script it measures node prototypes instead and prints a table::

    python scripts/bench_scale.py [--quick] [--sizes 16,256,1000,4000]

at each size N (each in a fresh process, so memory and descriptors are
that size's alone): building the embedded job with N trainers (one
prototype of N instances, a reader and a ps); start-up (the first run of a no-op
group on the N instances); a no-op run on them; the master's RSS and
descriptors; the memory of an idle instance (USS, median of a sample) and
what the machine gave (available memory before and after); then a fresh
scheduler trains that job with a JobRunner and a
MultiNodeCheckpointManager for 2 epochs: the first epoch (start-up
included), the second, and the checkpoint bytes of an epoch.  Last, the
build ratio of 1 reader + a prototype of 100000 trainers against 10
(bound: 3x).
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
#: what a training instance may hold, in idle instances' USS (measured at
#: 1000 trainers: about 2x): the job is trained only where that fits
JOB_MEMORY_FACTOR = 2.5
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


# -- node prototypes (run as a script) ------------------------------------------------

#: sizes of a full run and of --quick
PROTO_SIZES = (16, 256, 1000, 4000)
QUICK_SIZES = (16, 64)
#: a prototype of 100000 trainers builds within this many times 10's
PROTO_BUILD_RATIO = 3.0


def _proto_build(count):
    """Seconds to build and group 1 reader + a prototype of ``count``."""
    start = time.perf_counter()
    with Cluster(), TaskGroup() as group:
        with Node("reader"), Task(name="read"):
            ops.Const(np.ones(1), name="x")
        with Node("trainer", num_instances=count), Task(name="train"):
            ops.Const(np.ones(1), name="w")
        group.tasks_by_node()
    return time.perf_counter() - start


def measure_one(count):
    """Every figure of one size, measured in this process."""
    from localcluster import JobRunner, MultiNodeCheckpointManager
    me = psutil.Process()
    out = {"n": count}
    start = time.perf_counter()
    from localcluster.examples.regression import build
    job, _ = build(nodes=count, epochs=2, threads=1)
    out["build_s"] = time.perf_counter() - start
    with Cluster(), TaskGroup() as noop:
        with Node("trainer", num_instances=count), Task():
            ops.Const(0)
    available = psutil.virtual_memory().available
    scheduler = LocalHostScheduler()
    try:
        start = time.perf_counter()
        scheduler.run(noop)
        out["startup_s"] = time.perf_counter() - start
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            scheduler.run(noop)
            runs.append(time.perf_counter() - start)
        out["noop_run_s"] = sorted(runs)[len(runs) // 2]
        time.sleep(0.5)   # what the instances freed settles
        out["machine_mb"] = (available -
                             psutil.virtual_memory().available) / MiB
        out["master_rss_mb"] = me.memory_info().rss / MiB
        out["master_fds"] = me.num_fds()
        pids = sorted(scheduler.node_pids().values())
        step = max(1, len(pids) // 32)
        uss = sorted(psutil.Process(pid).memory_full_info().uss
                     for pid in pids[::step])
        out["uss_mib"] = uss[len(uss) // 2] / MiB
    finally:
        scheduler.close()
    # a training instance holds more than an idle one (its shard, its
    # runs' threads and buffers): a job the machine cannot hold is not
    # started -- the kernel's OOM killer would take it, or other work
    need = JOB_MEMORY_FACTOR * out["uss_mib"] * MiB * count
    if need > psutil.virtual_memory().available:
        out["job_skipped"] = (f"{need / MiB:.0f} MB needed, "
                              f"{psutil.virtual_memory().available / MiB:.0f}"
                              " MB available")
        return out
    directory = tempfile.mkdtemp(prefix="lc_bench_proto_")
    marks = []
    try:
        scheduler = LocalHostScheduler()
        try:
            start = time.perf_counter()
            JobRunner(job, MultiNodeCheckpointManager(directory),
                      on_epoch=lambda report: marks.append(
                          time.perf_counter())).train(scheduler)
            out["train_s"] = time.perf_counter() - start
            out["master_fds_job"] = me.num_fds()
            out["master_rss_mb_job"] = me.memory_info().rss / MiB
        finally:
            scheduler.close()
        out["epoch1_s"] = marks[0] - start if marks else None
        out["epoch2_s"] = marks[1] - marks[0] if len(marks) > 1 else None
        out["ckpt_bytes"] = sum(
            os.path.getsize(os.path.join(directory, name))
            for name in os.listdir(directory) if name.endswith(".1"))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


def _measure_fresh(count, timeout):
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--one", str(count)],
        capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"size {count} exited {proc.returncode}: "
                           f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


COLUMNS = [("n", "N", "{}"), ("build_s", "build s", "{:.3f}"),
           ("startup_s", "start-up s", "{:.2f}"),
           ("noop_run_s", "no-op run s", "{:.3f}"),
           ("epoch1_s", "1st epoch s", "{:.2f}"),
           ("epoch2_s", "2nd epoch s", "{:.2f}"),
           ("train_s", "train s", "{:.2f}"),
           ("master_rss_mb", "master RSS MB", "{:.0f}"),
           ("master_fds", "master fds", "{}"),
           ("master_fds_job", "fds (job)", "{}"),
           ("uss_mib", "instance USS MiB", "{:.2f}"),
           ("machine_mb", "machine MB", "{:.0f}"),
           ("ckpt_bytes", "ckpt B/epoch", "{}")]


def _cell(fmt, value):
    return "-" if value is None else fmt.format(value)


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"sizes {QUICK_SIZES}, a smaller build ratio")
    parser.add_argument("--sizes", help="comma-separated sizes")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure_one(args.one)))
        return 0
    sizes = (tuple(int(n) for n in args.sizes.split(",")) if args.sizes
             else QUICK_SIZES if args.quick else PROTO_SIZES)
    rows = [_measure_fresh(n, 120 + n // 10) for n in sizes]
    print(" | ".join(title for _, title, _ in COLUMNS))
    for row in rows:
        print(" | ".join(_cell(fmt, row.get(key)) for key, _, fmt in COLUMNS))
    for row in rows:
        if row.get("job_skipped"):
            print(f"{row['n']}: the embedded job was not trained "
                  f"({row['job_skipped']})")
    big = 10000 if args.quick else 100000
    small = min(_proto_build(10) for _ in range(5))
    large = min(_proto_build(big) for _ in range(3))
    ratio = large / small
    print(f"build of 1 reader + a prototype of {big} trainers vs 10: "
          f"{large * 1000:.2f} ms vs {small * 1000:.2f} ms = {ratio:.2f}x "
          f"(bound {PROTO_BUILD_RATIO}x)")
    if len(sizes) > 1 and rows[0].get("startup_s"):
        for a, b in zip(rows, rows[1:]):
            print(f"start-up {b['n']} vs {a['n']}: "
                  f"{b['startup_s'] / a['startup_s']:.2f}x "
                  f"(linear {b['n'] / a['n']:.1f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sizes": rows, "build_ratio": ratio}, f, indent=1)
    return 0 if ratio <= PROTO_BUILD_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
