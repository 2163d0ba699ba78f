#!/usr/bin/env python
"""Measure the project's performance: every figure, its baseline and ratio.

Every target is a *ratio* against a baseline measured in the same run (or
against the fixed bound the design states), so a noisy machine moves both
sides alike.  Each figure is the median of repeated measurements
(``time.perf_counter``) with its spread, after warm-up calls, with the
garbage collector off while timing; the candidates of one comparison are
measured in alternating blocks so that drift hits them alike.

    python scripts/bench.py            # full run, prints the tables
    python scripts/bench.py --quick    # smoke run, fewer repetitions
    python scripts/bench.py --json results.json --strict

Sections: this file (LocalHostScheduler and LocalSession against raw
pipes, numpy and multiprocessing), bench_ray.py (RaySession against raw
Ray), bench_scale.py (growth with the number of nodes), bench_peers.py
(the same work on Ray and Dask, where installed: ``pip install -e
'.[bench]'``).  The exit status is 0 even when a target FAILs (this is a
report) unless ``--strict`` is given; it is 2 if a measurement could not
be made.
"""

import argparse
import importlib.metadata
import json
import logging
import math
import os
import pickle
import platform
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localcluster import (JobRunner, LocalHostScheduler,  # noqa: E402
                          LocalSession, MultiNodeCheckpointManager,
                          NetBuilder, Node, NodeFailedError, Task,
                          TaskGroup, WorkspaceType, ops, to_execution_step)
from localcluster.cli.check import CommandLineJob  # noqa: E402
from localcluster.cli.jobspec import DEFAULT_JOB  # noqa: E402
from localcluster.testing import (ALL_CHECKS, Schedule,  # noqa: E402
                                  check_job, races, schedule_independent)
import bench_peers  # noqa: E402 - the same work on Ray and Dask
import bench_ray  # noqa: E402 - RaySession's rows; imports Ray only to run
import bench_scale  # noqa: E402 - growth with the number of nodes
from benchlib import (FORK, FULL, KILL_BOUND, KILL_DELAY,  # noqa: E402
                      KILL_RUN_TIMEOUT, MiB, QUICK, Row, Servers, Stat,
                      alternate, fmt_stat, kill_later, leftovers, markdown,
                      memcpy_time, mp_queue_time, noop_group, print_table,
                      queue_group, repeat, sleep_until_killed, timed,
                      unmeasured)


# -- the baselines' servers -------------------------------------------------------
def _echo_server(conn):
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(("ok", msg[1], {}))


def _pickle_server(conn, n):
    array = np.full(n, 1.5)
    while conn.recv() is not None:
        conn.send_bytes(pickle.dumps(array, pickle.HIGHEST_PROTOCOL))


def _say_ready(conn):
    conn.send(("ready", os.getpid(), None))


# -- 1. dispatch ------------------------------------------------------------------

def measure_dispatch(cfg):
    names = [f"dispatch_{i}" for i in range(4)]
    group = noop_group(names)
    message = ("run", 1, bytes(256))

    with Servers(4, _echo_server) as echo:
        def pipe_round_trip():
            for conn in echo.conns:
                conn.send(message)
            for conn in echo.conns:
                conn.recv()

        scheduler = LocalHostScheduler(nodes=names)
        local = LocalSession()
        try:
            m = alternate({"localhost": timed(lambda: scheduler.run(group)),
                           "local": timed(lambda: local.run(group)),
                           "pipe": timed(pipe_round_trip)},
                          cfg.dispatch_rounds, cfg.dispatch_block,
                          cfg.warmup * 10)
        finally:
            scheduler.close()
            local.close()
    return [
        Row("dispatch_localhost",
            "dispatch: run() on 4 nodes vs raw pipe round trip x4",
            m["localhost"], m["pipe"], 2.0),
        Row("dispatch_local",
            "dispatch: LocalSession run() vs raw pipe round trip x4",
            m["local"], m["pipe"]),
    ]


# -- 2. fetch ---------------------------------------------------------------------

def measure_fetch(cfg):
    n_big, n_small = 64 * MiB // 8, 1024 // 8
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("fetch"), Task():
            ops.ConstantFill([], ["big"], shape=[n_big], value=1.5)
            ops.ConstantFill([], ["small"], shape=[n_small], value=1.5)
    source = np.full(n_big, 1.5)

    def copyto():
        np.copyto(np.empty(n_big), source)

    with Servers(1, _pickle_server, n_big) as server:
        conn = server.conns[0]

        def pickle_over_pipe():
            conn.send(1)
            return pickle.loads(conn.recv_bytes())

        scheduler = LocalHostScheduler(nodes=["fetch"])
        try:
            scheduler.run(group)
            for copy in (False, True):
                got = scheduler.fetch_blob("big", "fetch", copy=copy)
                if got.shape != (n_big,) or got[-1] != 1.5:
                    raise AssertionError(f"fetched {got!r}, not the blob")
            zero_copy = alternate(
                {"big": timed(lambda: scheduler.fetch_blob(
                    "big", "fetch", copy=False)),
                 "small": timed(lambda: scheduler.fetch_blob(
                     "small", "fetch", copy=False))},
                cfg.zero_copy_rounds, cfg.zero_copy_block, cfg.warmup)
            copies = alternate(
                {"fetch": timed(lambda: scheduler.fetch_blob(
                    "big", "fetch", copy=True)),
                 "copyto": timed(copyto),
                 "pickle": timed(pickle_over_pipe)},
                cfg.copy_rounds, 1, 1)
        finally:
            scheduler.close()
    return [
        Row("fetch_zero_copy",
            "fetch 64 MiB zero-copy vs 1 KiB zero-copy",
            zero_copy["big"], zero_copy["small"], 5.0),
        Row("fetch_copy",
            "fetch 64 MiB copy vs in-process np.copyto",
            copies["fetch"], copies["copyto"], 1.25),
        Row("fetch_copy_vs_pickle",
            "fetch 64 MiB copy vs pickle over a pipe",
            copies["fetch"], copies["pickle"], 0.5),
        Row("fetch_zero_copy_vs_pickle",
            "fetch 64 MiB zero-copy vs pickle over a pipe",
            zero_copy["big"], copies["pickle"], 0.5),
    ]


# -- 3. start-up ------------------------------------------------------------------

STARTUP_BOUND = 0.5


def measure_startup(cfg):
    names = [f"start_{i}" for i in range(16)]

    def scheduler_start():
        start = time.perf_counter()
        scheduler = LocalHostScheduler(nodes=names)
        elapsed = time.perf_counter() - start
        scheduler.close()
        return elapsed

    def raw_fork():
        start = time.perf_counter()
        pipes, procs = [], []
        for _ in range(16):
            ours, theirs = FORK.Pipe()
            proc = FORK.Process(target=_say_ready, args=(theirs,))
            proc.start()
            theirs.close()
            pipes.append(ours)
            procs.append(proc)
        for conn in pipes:
            conn.recv()
        elapsed = time.perf_counter() - start
        for proc, conn in zip(procs, pipes):
            proc.join()
            conn.close()
        return elapsed

    m = alternate({"ours": scheduler_start, "raw": raw_fork},
                cfg.startup_rounds, 1, 1)
    return [
        Row("startup_16", f"16 nodes started vs {STARTUP_BOUND} s",
            m["ours"], STARTUP_BOUND, 1.0, strict=True),
        Row("startup_16_vs_fork", "16 nodes started vs raw fork x16",
            m["ours"], m["raw"]),
    ]


# -- 4. SIGKILL detection ---------------------------------------------------------

def measure_sigkill(cfg):
    nodes = ["victim", "bystander"]
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("victim"), Task():
            ops.Python(sleep_until_killed)([], [])
        with Node("bystander"), Task():
            ops.ConstantFill([], ["x"], shape=[1], value=1.0)
    scheduler = LocalHostScheduler(nodes=nodes)

    def detection_latency():
        killed_at = []
        killer = threading.Thread(
            target=kill_later, daemon=True,
            args=(scheduler.node_pids()["victim"], KILL_DELAY, killed_at))
        killer.start()
        try:
            scheduler.run(group, timeout=KILL_RUN_TIMEOUT)
        except NodeFailedError as exc:
            detected = time.perf_counter()
            if exc.node != "victim":
                raise
        else:
            raise AssertionError("run() returned although a node was killed")
        finally:
            killer.join()
        scheduler.start_nodes(nodes)  # restart the victim, untimed
        return detected - killed_at[0]

    try:
        latency = alternate({"kill": detection_latency}, cfg.kill_repeats, 1,
                          1)["kill"]
    finally:
        scheduler.close()
    return [Row("sigkill_detection", f"SIGKILLed node detected vs "
                f"{KILL_BOUND} s", latency, KILL_BOUND, 1.0, strict=True)]


# -- 5. op dispatch in a tight loop -----------------------------------------------

def _numpy_loop(n):
    """What the executor computes per iteration of the loop below, called
    directly: the loop test, the body's Add and the loop counter's Add."""
    greater_equal, add, asarray = np.greater_equal, np.add, np.asarray
    total, one = np.asarray(0.0), np.asarray(1.0)
    i, count, step = np.asarray(0), np.asarray(n), np.asarray(1)
    while True:
        stop = asarray(greater_equal(i, count))
        if stop:
            return total
        total = asarray(add(total, one))
        i = asarray(add(i, step))


def measure_op_loop(cfg):
    n = cfg.loop_iters
    with NetBuilder() as nb:
        total, one = ops.Const(0.0), ops.Const(1.0)
        with ops.loop(n):
            ops.Add([total, one], [total])
    step = to_execution_step(nb)
    session = LocalSession()
    try:
        m = alternate({"ours": timed(lambda: session.run(step)),
                     "numpy": timed(lambda: _numpy_loop(n))},
                    cfg.loop_rounds, 1, 1)
        if session.fetch_blob(total) != n or _numpy_loop(n) != n:
            raise AssertionError("the loops did not count to n")
    finally:
        session.close()
    return [Row("op_loop", f"op loop per iteration ({n} iterations) vs "
                "numpy calls", m["ours"].scaled(1 / n), m["numpy"].scaled(1 / n),
                1.25)]


# -- 6. a queue between two node processes -----------------------------------------

def measure_queues(cfg):
    """Small and 1 MiB records from one node process to another against
    multiprocessing.Queue (>= 10x its throughput for small records: at
    most 1/10 of its time) and memcpy of the same bytes."""
    small, big, rounds = cfg.queue_small, cfg.queue_big, cfg.queue_rounds
    mib = MiB // 8
    session = LocalHostScheduler(nodes=["q_reader", "q_trainer"])
    try:
        small_group, big_group = queue_group(small, [1]), \
            queue_group(big, [1, mib])
        session.run(small_group)  # warm up: plans sent, nets compiled
        session.run(big_group)
        # ours against each baseline in its own alternation: a
        # multiprocessing.Queue run of 200 MiB churns the caches and the
        # allocator that the memcpy comparison is about
        m = alternate({"small": timed(lambda: session.run(small_group)),
                       "mpq_small": lambda: mp_queue_time(small, 1)},
                      rounds, 1, 0)
        # fan-in: the same records from two writer nodes into one queue
        # (one lock for all its ends) against one writer (no shared lock)
        fan_in = queue_group(small, [1], nodes=("q_writer", "q_trainer"),
                             writers=2)
        fan_session = LocalHostScheduler(
            nodes=["q_writer_0", "q_writer_1", "q_trainer"])
        try:
            fan_session.run(fan_in)
            m.update(alternate(
                {"fan_in": timed(lambda: fan_session.run(fan_in)),
                 "one_writer": timed(lambda: session.run(small_group))},
                rounds, 1, 0))
        finally:
            fan_session.close()
        # warm: the first runs of big records fault their slots' pages in
        m.update(alternate({"big": timed(lambda: session.run(big_group)),
                            "memcpy": lambda: memcpy_time(big, mib)},
                           rounds, 1, cfg.warmup))
    finally:
        session.close()
    m["mpq_big"] = repeat(lambda: mp_queue_time(big, mib), rounds)
    return [
        Row("queue_small", f"cross-node queue, {small} small records vs "
            "multiprocessing.Queue", m["small"], m["mpq_small"], 0.1),
        Row("queue_big_memcpy", f"cross-node queue, {big} x 1 MiB vs "
            "memcpy of the same bytes", m["big"], m["memcpy"], 1.5),
        Row("queue_big_mpq", f"cross-node queue, {big} x 1 MiB vs "
            "multiprocessing.Queue", m["big"], m["mpq_big"]),
        Row("queue_fan_in", f"cross-node queue, {small} small records from "
            "2 writer nodes vs from 1", m["fan_in"], m["one_writer"]),
    ]


# -- 7. checkpoints of 4 nodes ------------------------------------------------------

CKPT_NODES = [f"ckpt_{i}" for i in range(4)]


def _np_save_all(directory, arrays):
    """The baseline: np.save + fsync of every array, one after another."""
    for i, array in enumerate(arrays):
        with open(os.path.join(directory, f"plain_{i}.npy"), "wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())


def _np_load_all(directory, n):
    return [np.load(os.path.join(directory, f"plain_{i}.npy"))
            for i in range(n)]


def measure_checkpoints(cfg):
    """Save and load of 4 nodes x ``ckpt_mib`` MiB (each node writes its own
    file, in parallel) vs np.save + fsync / np.load of the same bytes."""
    import shutil
    import tempfile
    n = cfg.ckpt_mib * MiB // 8
    directory = tempfile.mkdtemp(prefix="lc_bench_ckpt_")
    session = LocalHostScheduler(nodes=CKPT_NODES)
    try:
        init = TaskGroup(WorkspaceType.GLOBAL)
        for node in CKPT_NODES:
            with init, Node(node), Task():
                ops.UniformFill([], ["weights"], shape=[n], seed=7)
        session.run(init)
        manager = MultiNodeCheckpointManager(os.path.join(directory, "ck"))
        session.run(manager.init(CKPT_NODES))
        arrays = [session.fetch_blob("weights", node) for node in CKPT_NODES]
        save, load = manager.save(1), manager.load(1)
        session.run(save)   # warm up: plans sent, directory made
        session.run(load)
        m = alternate({"save": timed(lambda: session.run(save)),
                     "np_save": timed(lambda: _np_save_all(directory,
                                                           arrays))},
                    cfg.ckpt_rounds, 1, 1)
        loads = alternate({"load": timed(lambda: session.run(load)),
                         "np_load": timed(lambda: _np_load_all(
                             directory, len(arrays)))},
                        cfg.ckpt_rounds, 1, 1)
        if not np.array_equal(session.fetch_blob("weights", CKPT_NODES[0]),
                              arrays[0]):
            raise AssertionError("the checkpoint did not load what it saved")
    finally:
        session.close()
        shutil.rmtree(directory, ignore_errors=True)
    size = f"4 x {cfg.ckpt_mib} MiB"
    # >= 70% of the baseline's speed: at most 1/0.7 of its time
    return [Row("ckpt_save", f"checkpoint save, {size} vs np.save + fsync",
                m["save"], m["np_save"], round(1 / 0.7, 3)),
            # no target: a load reads every blob twice, its CRC-32s all
            # checked before a byte reaches the live workspace
            Row("ckpt_load", f"checkpoint load, {size} (CRC-checked) vs "
                "np.load", loads["load"], loads["np_load"])]


# -- 8. deterministic schedules and the job checks ------------------------------------

def _embedded(epochs):
    """``build()`` of the embedded job as ``--check`` trains it (4 nodes,
    ``threads=1``)."""
    return CommandLineJob(DEFAULT_JOB, epochs=epochs, threads=1)


def _train(build, schedule):
    """Train ``build``'s job once on LocalSession (under ``schedule``)."""
    job, _ = build()
    with tempfile.TemporaryDirectory() as directory, \
            LocalSession(schedule=schedule) as session:
        JobRunner(job, MultiNodeCheckpointManager(directory),
                  timeout=60).train(session)


def measure_schedules(cfg):
    """The embedded job trained under deterministic schedules against the
    same training on real threads (<= 1.5x), and `check_job` of it
    against that real training.

    The schedules are the checks' own, ``Schedule(seed, "mixed")`` over
    consecutive seeds: random and PCT at depths 1-3 in turn, since their
    decisions and hand-overs differ.  `check_job` runs every check with
    the command line's defaults (``--check --epochs 3``: 20 interleavings,
    20 kills) once; its baseline is one
    real training of the same job, so the row says how many trainings'
    worth the check costs -- a figure that moves with what the checks
    explore (informational), where the training moves only with the
    machine.  A quick run checks races and schedules only (1 epoch, 1
    interleaving), to stay a smoke test."""
    build = _embedded(cfg.sched_epochs)
    seeds = iter(range(1 << 30))
    m = alternate({"scheduled": timed(lambda: _train(
                       build, Schedule(next(seeds), "mixed"))),
                   "real": timed(lambda: _train(build, None))},
                  cfg.sched_rounds, 1, 1)
    logging.getLogger("localcluster.job").setLevel(logging.ERROR)
    # a quick run checks only races and schedules: the smoke test's bound
    checks = (races, schedule_independent) if cfg.quick else ALL_CHECKS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check = timed(lambda: check_job(
            build, checks=checks, max_examples=cfg.check_examples,
            max_kills=cfg.check_examples))()
    which = "races and schedules" if cfg.quick else "every check"
    return [
        Row("scheduled_run", f"embedded job, {cfg.sched_epochs} epoch(s) "
            "under a schedule vs on real threads", m["scheduled"],
            m["real"], 1.5),
        Row("check_job", f"check_job of the embedded job ({which}, "
            f"{cfg.sched_epochs} epoch(s), {cfg.check_examples} "
            "interleavings and kills) vs its real training",
            Stat.of([check]), m["real"]),
    ]


MEASUREMENTS = [measure_dispatch, measure_fetch, measure_startup,
                measure_sigkill, measure_op_loop, measure_queues,
                measure_checkpoints, measure_schedules, bench_ray.measure,
                bench_scale.measure]


# -- the peers ----------------------------------------------------------------------

#: rows derived from the peers' figures: (key, label, work, ours, theirs,
#: limit) -- ours / theirs of one work, measured in the same run; two
#: baselines come from this file's rows (`baselines`)
PEER_ROWS = [
    ("dispatch_vs_ray", "dispatch: run() on 4 nodes vs 4 Ray actor calls "
     "(>= 8x faster)", "noop_4", "localhost", "ray", 1 / 8),
    ("dispatch_vs_dask", "dispatch: run() on 4 nodes vs 4 Dask actor calls",
     "noop_4", "localhost", "dask", None),
    ("startup_16_vs_ray", "16 nodes started + first run vs Ray started, 16 "
     "actors started + pinged", "startup_16", "localhost", "ray", None),
    ("startup_16_vs_dask", "16 nodes started + first run vs Dask started, "
     "16 workers + actors", "startup_16", "localhost", "dask", None),
    ("ray_dispatch", "RaySession run() on 4 nodes vs 4 raw Ray actor calls",
     "noop_4", "raysession", "ray", 1.25),
    ("ray_fetch", "RaySession fetch_blob 64 MiB vs raw ray.get + np.array "
     "copy", "fetch_64mib", "raysession", "ray", 1.2),
    ("ray_queue_small", "RaySession queue, small records vs ray.util.queue "
     "(>= 20x its throughput)", "queue_small", "raysession", "ray", 0.05),
    ("ray_queue_small_mpq", "RaySession queue, small records vs "
     "multiprocessing.Queue", "queue_small", "raysession", "mp.Queue", 2.0),
    ("ray_queue_big", "RaySession queue, 1 MiB records vs 0.5 GB/s",
     "queue_1mib", "raysession", "0.5 GB/s", 1.0),
]


def baselines(rows, cfg):
    """The peers' rows' baselines that are not a peer: multiprocessing.Queue
    as measured by `measure_queues`, and a fixed throughput."""
    got = {("queue_1mib", "0.5 GB/s"): Stat.fixed(cfg.queue_big * MiB /
                                                 0.5e9)}
    for row in rows:
        if row.key == "queue_small" and not row.unmeasured:
            got[("queue_small", "mp.Queue")] = row.baseline
    return got


def peer_stats(figures):
    """``{(work, system): Stat, or ("skipped" | "error", why)}``."""
    out = {}
    for f in figures:
        key = (f["work"], f["system"])
        if "samples" in f:
            out[key] = Stat.of(f["samples"])
        elif "skipped" in f:
            out[key] = ("skipped", f["skipped"])
        else:
            out[key] = ("error", f.get("error", "no figure"))
    return out


def peer_rows(stats):
    rows = []
    for key, label, work, ours, theirs, limit in PEER_ROWS:
        a = stats.get((work, ours), ("error", f"{work}/{ours} not measured"))
        b = stats.get((work, theirs),
                      ("error", f"{work}/{theirs} not measured"))
        if isinstance(a, Stat) and isinstance(b, Stat):
            rows.append(Row(key, label, a, b, limit))
        else:
            status, why = next(x for x in (a, b) if not isinstance(x, Stat))
            rows.append(unmeasured(key, status, why))
    return rows


def print_peers(stats, out=sys.stdout):
    """The same work on every system: one line a work, one column a
    system, each cell a median with its spread."""
    systems = bench_peers.SYSTEMS
    lines = []
    for work in bench_peers.WORKS:
        cells = [work]
        for system in systems:
            got = stats.get((work, system))
            cells.append(fmt_stat(got) if isinstance(got, Stat) else "-")
        lines.append(cells)
    markdown(("work",) + tuple(systems), lines, out)


def measure_peers(cfg):
    """The peers' figures (a list of dicts, see bench_peers.measure)."""
    try:
        return bench_peers.measure(cfg.quick)
    except Exception:  # noqa: BLE001 - reported, the rest of the bench ran
        print(f"bench_peers failed:\n{traceback.format_exc()}",
              file=sys.stderr)
        return []


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Measure localcluster's performance targets, each as a "
                    "ratio against a baseline measured in the same run, "
                    "and the same work on Ray and Dask where installed.")
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions: a fast smoke run")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the results to FILE as JSON")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 if a target FAILs or something leaks")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    started = time.perf_counter()
    machine = machine_line()
    print(f"localcluster bench ({'quick' if args.quick else 'full'}): "
          f"{machine}")
    rows, errors = [], []
    for measure in MEASUREMENTS:
        began = time.perf_counter()
        try:
            rows.extend(measure(cfg))
        except Exception:  # noqa: BLE001 - reported, the others still run
            errors.append(f"{measure.__module__}.{measure.__name__}")
            print(f"{measure.__name__} failed:\n{traceback.format_exc()}",
                  file=sys.stderr)
        print(f"{measure.__module__}.{measure.__name__}: "
              f"{time.perf_counter() - began:.1f} s", file=sys.stderr)
    began = time.perf_counter()
    figures = measure_peers(cfg)
    print(f"bench_peers.measure: {time.perf_counter() - began:.1f} s",
          file=sys.stderr)
    stats = peer_stats(figures)
    rows.extend(peer_rows({**stats, **baselines(rows, cfg)}))
    print()
    print_table(rows)
    print()
    print_peers(stats)
    errors += [r.key for r in rows if r.status == "error"]
    errors += [f"{f['work']}/{f['system']}" for f in figures if "error" in f]
    elapsed = time.perf_counter() - started
    print(f"\n{sum(r.status == 'PASS' for r in rows)} PASS, "
          f"{sum(r.status == 'FAIL' for r in rows)} FAIL in {elapsed:.0f} s")

    leaks = leftovers()
    for what, items in leaks.items():
        if items:
            print(f"WARNING: {what} left behind: {items}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": "quick" if args.quick else "full",
                       "machine": machine,
                       "python": platform.python_version(),
                       "cpus": os.cpu_count(), "seconds": elapsed,
                       "results": [r.as_json() for r in rows],
                       "peers": [dict(f, **({"stat": stats[(
                           f["work"], f["system"])].as_json("s")}
                           if "samples" in f else {})) for f in figures],
                       "errors": errors, "leaks": leaks}, f, indent=2)
    if errors or any(not math.isfinite(r.ratio or 0) for r in rows):
        return 2
    failed = any(r.status == "FAIL" for r in rows) or any(leaks.values())
    return 1 if args.strict and failed else 0


def machine_line():
    """What the figures were measured on: CPU model, cores, memory,
    Python, numpy and the peers' versions."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    versions = [f"Python {platform.python_version()}",
                f"numpy {np.__version__}"]
    for name in ("ray", "distributed"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    memory = psutil.virtual_memory().total / (1 << 30)
    return (f"{model}, {os.cpu_count()} cpu(s), {memory:.0f} GiB, "
            f"{platform.system()} {platform.release()}; "
            + ", ".join(versions))


if __name__ == "__main__":
    sys.exit(main())
