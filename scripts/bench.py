#!/usr/bin/env python
"""Measure the project's performance targets.

Every target is a *ratio* against a baseline measured in the same run (or
against the fixed bound the design states), so a noisy machine moves both
sides alike.  Each number is the median of repeated measurements
(``time.perf_counter``), after warm-up calls, with the garbage collector
off while timing; the candidates of one comparison are measured in
alternating blocks so that drift hits them alike.

    python scripts/bench.py            # full run, prints the table
    python scripts/bench.py --quick    # smoke run, fewer repetitions
    python scripts/bench.py --json results.json --strict

The exit status is 0 even when a target FAILs (this is a report) unless
``--strict`` is given; it is 2 if a measurement could not be made.
RaySession's rows (bench_ray.py) are skipped where Ray is not installed.
"""

import argparse
import gc
import json
import math
import multiprocessing
import os
import pickle
import platform
import signal
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localcluster import (LocalHostScheduler,  # noqa: E402
                          LocalSession, MultiNodeCheckpointManager,
                          NetBuilder, Node, NodeFailedError, Queue, Task,
                          TaskGroup, WorkspaceType, ops, pipe,
                          to_execution_step)
import bench_ray  # noqa: E402 - RaySession's rows; imports Ray only to run
import bench_scale  # noqa: E402 - growth with the number of nodes

FORK = multiprocessing.get_context("fork")
MiB = 1 << 20
SHM_DIR = "/dev/shm"
SHM_PREFIX = "lc_"


# -- configuration ----------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """Repetitions: ``rounds`` blocks of ``block`` timed calls per candidate."""

    dispatch_rounds: int
    dispatch_block: int
    zero_copy_rounds: int
    zero_copy_block: int
    copy_rounds: int
    startup_rounds: int
    kill_repeats: int
    loop_iters: int
    queue_small: int
    queue_big: int
    queue_rounds: int
    loop_rounds: int
    warmup: int
    ckpt_mib: int
    ckpt_rounds: int


FULL = Config(dispatch_rounds=20, dispatch_block=100, zero_copy_rounds=10,
              zero_copy_block=20, copy_rounds=7, startup_rounds=7,
              kill_repeats=7, loop_iters=20_000, loop_rounds=9, warmup=3,
              queue_small=2000, queue_big=200, queue_rounds=5,
              ckpt_mib=64, ckpt_rounds=5)
QUICK = Config(dispatch_rounds=3, dispatch_block=20, zero_copy_rounds=3,
               zero_copy_block=5, copy_rounds=2, startup_rounds=2,
               kill_repeats=3, loop_iters=2_000, loop_rounds=3, warmup=1,
               queue_small=200, queue_big=20, queue_rounds=2,
               ckpt_mib=4, ckpt_rounds=2)


# -- results ----------------------------------------------------------------------

@dataclass
class Row:
    """One line of the report: ``ours / baseline`` against a ratio limit.

    ``limit`` None makes an informational row (no PASS/FAIL).
    """

    key: str
    label: str
    ours: float          # seconds
    baseline: float      # seconds
    limit: float = None
    strict: bool = False  # ratio < limit rather than <=
    unmeasured: str = None  # "skipped"/"error": no figures, why in label
    unit: str = "s"       # or "B": ours and baseline are bytes

    @property
    def ratio(self):
        return None if self.unmeasured else self.ours / self.baseline

    @property
    def target(self):
        if self.limit is None:
            return "-"
        return f"{'<' if self.strict else '<='} {self.limit:g}"

    @property
    def status(self):
        if self.unmeasured or self.limit is None:
            return self.unmeasured or "info"
        ok = self.ratio < self.limit if self.strict else \
            self.ratio <= self.limit
        return "PASS" if ok else "FAIL"

    def as_json(self):
        return {"key": self.key, "label": self.label, "ours_s": self.ours,
                "baseline_s": self.baseline, "ratio": self.ratio,
                "target": None if self.limit is None else self.target,
                "status": self.status, "unit": self.unit}


# -- timing -----------------------------------------------------------------------

def timed(fn):
    """``fn`` wrapped to return how long the call took, in seconds."""
    def call():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return call


def medians(candidates, rounds, block, warmup):
    """``{name: median seconds}`` of ``candidates`` (name -> a callable
    returning its own duration), measured in alternating blocks."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            gc.collect()
            gc.disable()
            try:
                samples[name].extend(fn() for _ in range(block))
            finally:
                gc.enable()
    return {name: statistics.median(s) for name, s in samples.items()}


# -- baseline helper processes ----------------------------------------------------

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


class Servers:
    """Forked processes, each serving ``target(conn, *args)`` on a pipe until
    it receives None."""

    def __init__(self, count, target, *args):
        self.conns, self.procs = [], []
        try:
            for _ in range(count):
                ours, theirs = FORK.Pipe()
                proc = FORK.Process(target=target, args=(theirs,) + args,
                                    daemon=True)
                proc.start()
                theirs.close()
                self.conns.append(ours)
                self.procs.append(proc)
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()


# -- 1. dispatch ------------------------------------------------------------------

def measure_dispatch(cfg):
    names = [f"dispatch_{i}" for i in range(4)]
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        for name in names:
            with Node(name), Task():
                ops.ConstantFill([], ["x"], shape=[1], value=1.0)
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
            m = medians({"localhost": timed(lambda: scheduler.run(group)),
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
            zero_copy = medians(
                {"big": timed(lambda: scheduler.fetch_blob(
                    "big", "fetch", copy=False)),
                 "small": timed(lambda: scheduler.fetch_blob(
                     "small", "fetch", copy=False))},
                cfg.zero_copy_rounds, cfg.zero_copy_block, cfg.warmup)
            copies = medians(
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

    m = medians({"ours": scheduler_start, "raw": raw_fork},
                cfg.startup_rounds, 1, 1)
    return [
        Row("startup_16", f"16 nodes started vs {STARTUP_BOUND} s",
            m["ours"], STARTUP_BOUND, 1.0, strict=True),
        Row("startup_16_vs_fork", "16 nodes started vs raw fork x16",
            m["ours"], m["raw"]),
    ]


# -- 4. SIGKILL detection ---------------------------------------------------------

KILL_BOUND = 0.1
KILL_DELAY = 0.15
KILL_RUN_TIMEOUT = 30.0


def _sleep_until_killed():
    time.sleep(2 * KILL_RUN_TIMEOUT)


def _kill_later(pid, delay, killed_at):
    time.sleep(delay)
    killed_at.append(time.perf_counter())
    os.kill(pid, signal.SIGKILL)


def measure_sigkill(cfg):
    nodes = ["victim", "bystander"]
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("victim"), Task():
            ops.Python(_sleep_until_killed)([], [])
        with Node("bystander"), Task():
            ops.ConstantFill([], ["x"], shape=[1], value=1.0)
    scheduler = LocalHostScheduler(nodes=nodes)

    def detection_latency():
        killed_at = []
        killer = threading.Thread(
            target=_kill_later, daemon=True,
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
        latency = medians({"kill": detection_latency}, cfg.kill_repeats, 1,
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
        m = medians({"ours": timed(lambda: session.run(step)),
                     "numpy": timed(lambda: _numpy_loop(n))},
                    cfg.loop_rounds, 1, 1)
        if session.fetch_blob(total) != n or _numpy_loop(n) != n:
            raise AssertionError("the loops did not count to n")
    finally:
        session.close()
    return [Row("op_loop", f"op loop per iteration ({n} iterations) vs "
                "numpy calls", m["ours"] / n, m["numpy"] / n, 3.0)]


# -- 6. a queue between two node processes -----------------------------------------

def _queue_group(n, shape):
    """``n`` records of ``shape`` float64 from node q_reader to q_trainer:
    the producer's loop only enqueues, the consumer's only dequeues, so the
    queue itself is what is measured."""
    queue = Queue(64, name="bench")
    with TaskGroup() as group:
        with Node("q_reader"), Task(name="producer"):
            record = {"x": ops.ConstantFill([], shape=list(shape), value=1.0)}
            writer = queue.writer()
            with ops.loop(n):
                writer.write_record(ops.net(), record)
            writer.commit(ops.net())
        with Node("q_trainer"):
            pipe(queue, processor=lambda record: None)
    return group


def _mp_producer(queue, go, n, size):
    go.wait()
    for _ in range(n):
        queue.put(np.ones(size))


def _mp_queue_time(n, size):
    """Seconds for ``n`` arrays of ``size`` float64 through a
    multiprocessing.Queue from a forked process to this one."""
    queue, go = FORK.Queue(64), FORK.Event()
    proc = FORK.Process(target=_mp_producer, args=(queue, go, n, size))
    proc.start()
    try:
        start = time.perf_counter()
        go.set()
        for _ in range(n):
            queue.get(timeout=60)
        return time.perf_counter() - start
    finally:
        proc.join(10)
        queue.close()
        queue.join_thread()


def _memcpy_time(n, size):
    src, dst = np.ones(size), np.empty(size)
    start = time.perf_counter()
    for _ in range(n):
        np.copyto(dst, src)
    return time.perf_counter() - start


def measure_queues(cfg):
    small, big, rounds = cfg.queue_small, cfg.queue_big, cfg.queue_rounds
    mib = MiB // 8
    session = LocalHostScheduler(nodes=["q_reader", "q_trainer"])
    try:
        small_group, big_group = _queue_group(small, [1]), \
            _queue_group(big, [1, mib])
        session.run(small_group)  # warm up: plans sent, nets compiled
        session.run(big_group)
        ours_small = statistics.median(
            timed(lambda: session.run(small_group))() for _ in range(rounds))
        ours_big = statistics.median(
            timed(lambda: session.run(big_group))() for _ in range(rounds))
    finally:
        session.close()
    mpq_small = statistics.median(_mp_queue_time(small, 1)
                                  for _ in range(rounds))
    mpq_big = statistics.median(_mp_queue_time(big, mib)
                                for _ in range(rounds))
    memcpy_big = statistics.median(_memcpy_time(big, mib)
                                   for _ in range(rounds))
    return [
        Row("queue_small", f"cross-node queue, {small} small records vs "
            "multiprocessing.Queue", ours_small, mpq_small, 0.2),
        Row("queue_big_memcpy", f"cross-node queue, {big} x 1 MiB vs "
            "memcpy of the same bytes", ours_big, memcpy_big, 2.0),
        Row("queue_big_mpq", f"cross-node queue, {big} x 1 MiB vs "
            "multiprocessing.Queue", ours_big, mpq_big),
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
        m = medians({"save": timed(lambda: session.run(save)),
                     "np_save": timed(lambda: _np_save_all(directory,
                                                           arrays))},
                    cfg.ckpt_rounds, 1, 1)
        loads = medians({"load": timed(lambda: session.run(load)),
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
            Row("ckpt_load", f"checkpoint load, {size} vs np.load",
                loads["load"], loads["np_load"], round(1 / 0.7, 3))]


MEASUREMENTS = [measure_dispatch, measure_fetch, measure_startup,
                measure_sigkill, measure_op_loop, measure_queues,
                measure_checkpoints,
                bench_ray.measurement(sys.modules[__name__]),
                bench_scale.measurement(sys.modules[__name__])]


# -- leaks ------------------------------------------------------------------------

def leftovers():
    """Our live child processes and shared-memory segments (those named for
    this process) still around."""
    procs = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                procs.append(f"{child.pid} {' '.join(child.cmdline())}")
        except psutil.NoSuchProcess:
            pass
    try:
        mine = f"{SHM_PREFIX}{os.getpid()}_"
        segments = sorted(n for n in os.listdir(SHM_DIR) if n.startswith(mine))
    except FileNotFoundError:
        segments = []
    return {"processes": procs, "segments": segments}


# -- report -----------------------------------------------------------------------

def fmt_seconds(s):
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= scale or unit == "ns":
            return f"{fmt_number(s / scale)} {unit}"


def fmt_number(x):
    """Three significant digits, without exponents down to 0.001."""
    if x >= 100 or x == 0:
        return f"{x:.0f}"
    decimals = min(6, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def print_table(rows, out=sys.stdout):
    header = ("measurement", "ours", "baseline", "ratio", "target", "result")
    fmt = {"s": fmt_seconds, "B": lambda b: f"{fmt_number(b / MiB)} MiB"}
    lines = [(r.label, "-", "-", "-", r.target, r.status) if r.unmeasured
             else (r.label, fmt[r.unit](r.ours), fmt[r.unit](r.baseline),
                   fmt_number(r.ratio), r.target, r.status) for r in rows]
    widths = [max(len(line[i]) for line in [header] + lines)
              for i in range(len(header))]

    def render(cells):
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first] + rest)

    print(render(header), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for line in lines:
        print(render(line), file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Measure localcluster's performance targets, each as a "
                    "ratio against a baseline measured in the same run.")
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions: a fast smoke run")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the results to FILE as JSON")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 if a target FAILs or something leaks")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    print(f"localcluster bench ({'quick' if args.quick else 'full'}): "
          f"Python {platform.python_version()}, {os.cpu_count()} cpu(s), "
          f"numpy {np.__version__}")
    rows, errors = [], []
    for measure in MEASUREMENTS:
        try:
            rows.extend(measure(cfg))
        except Exception:  # noqa: BLE001 - reported, the others still run
            errors.append(measure.__name__)
            print(f"{measure.__name__} failed:\n{traceback.format_exc()}",
                  file=sys.stderr)
    print_table(rows)
    errors += [r.key for r in rows if r.status == "error"]

    leaks = leftovers()
    for what, items in leaks.items():
        if items:
            print(f"WARNING: {what} left behind: {items}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": "quick" if args.quick else "full",
                       "python": platform.python_version(),
                       "cpus": os.cpu_count(),
                       "results": [r.as_json() for r in rows],
                       "errors": errors, "leaks": leaks}, f, indent=2)
    if errors or any(not math.isfinite(r.ratio or 0) for r in rows):
        return 2
    failed = any(r.status == "FAIL" for r in rows) or any(leaks.values())
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
