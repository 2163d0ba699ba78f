"""The harness of scripts/bench.py: repetitions, figures, rows, the report.

Every figure is a `Stat`: the median of repeated measurements and their
spread (half the interquartile range, relative to the median), so a
reader sees how much a number moves between repeats.  A `Row` compares
our figure with a baseline measured in the same run (or a fixed bound)
as a ratio against a limit.  Candidates of one comparison are measured
in alternating blocks (`alternate`) so that drift hits them alike, with
the garbage collector off while timing.

The bench's sections (bench.py, bench_ray.py, bench_scale.py,
bench_peers.py) import this module; the work they share (the queue group,
the multiprocessing.Queue baseline, the killer thread) is here too.
"""

import contextlib
import gc
import math
import multiprocessing
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import psutil

from localcluster import Node, Queue, Task, TaskGroup, WorkspaceType, ops, pipe

FORK = multiprocessing.get_context("fork")
MiB = 1 << 20
SHM_DIR = "/dev/shm"
SHM_PREFIX = "lc_"
#: the install hint of a section whose peer is missing
BENCH_EXTRA = "pip install -e '.[bench]'"
#: seconds the processes of a system torn down get to exit
EXIT_WAIT = 10.0


# -- configuration ----------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """Repetitions: ``rounds`` blocks of ``block`` timed calls per candidate."""

    quick: bool
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
    sched_epochs: int      # epochs of the embedded job's trainings
    sched_rounds: int      # scheduled and real trainings, alternated
    check_examples: int    # check_job's max_examples and max_kills


FULL = Config(quick=False, dispatch_rounds=20, dispatch_block=100,
              zero_copy_rounds=10, zero_copy_block=20, copy_rounds=7,
              startup_rounds=7, kill_repeats=7, loop_iters=20_000,
              loop_rounds=9, warmup=3, queue_small=2000, queue_big=200,
              queue_rounds=5, ckpt_mib=64, ckpt_rounds=5, sched_epochs=3,
              sched_rounds=8, check_examples=20)
QUICK = Config(quick=True, dispatch_rounds=3, dispatch_block=20,
               zero_copy_rounds=3, zero_copy_block=5, copy_rounds=2,
               startup_rounds=2, kill_repeats=3, loop_iters=2_000,
               loop_rounds=3, warmup=1, queue_small=200, queue_big=20,
               queue_rounds=2, ckpt_mib=4, ckpt_rounds=2, sched_epochs=1,
               sched_rounds=2, check_examples=1)


# -- figures ----------------------------------------------------------------------

@dataclass(frozen=True)
class Stat:
    """The median of ``n`` samples and their quartiles (``lo``, ``hi``);
    a fixed bound is a Stat of one sample."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, samples):
        samples = sorted(samples)
        if not samples:
            raise ValueError("a figure needs at least one sample")
        if len(samples) == 1:
            return cls(samples[0], samples[0], samples[0], 1)
        lo, _, hi = statistics.quantiles(samples, n=4, method="inclusive")
        return cls(statistics.median(samples), lo, hi, len(samples))

    @classmethod
    def fixed(cls, value):
        return cls(value, value, value, 0)

    def scaled(self, factor):
        """The same figure per unit: ``factor`` times every value."""
        return Stat(self.median * factor, self.lo * factor,
                    self.hi * factor, self.n)

    @property
    def spread(self):
        """Half the interquartile range over the median: 0.05 is +-5%."""
        if self.n < 2 or self.median == 0:
            return 0.0
        return (self.hi - self.lo) / 2 / self.median

    def as_json(self, unit):
        return {"median": self.median, "q1": self.lo, "q3": self.hi,
                "samples": self.n, "spread": self.spread, "unit": unit}


def as_stat(value):
    """A Stat as it is; a bare number is a fixed bound."""
    return value if isinstance(value, Stat) else Stat.fixed(value)


def timed(fn):
    """``fn`` wrapped to return how long the call took, in seconds."""
    def call():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return call


def alternate(candidates, rounds, block, warmup):
    """``{name: Stat}`` of ``candidates`` (name -> a callable returning its
    own duration), measured in alternating blocks of ``block`` calls."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    got = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            got[name].extend(samples(fn, block))
    return {name: Stat.of(s) for name, s in got.items()}


def samples(fn, times):
    """The durations ``fn`` returns over ``times`` calls, the garbage
    collector off (it would land on whichever call it interrupted)."""
    gc.collect()
    gc.disable()
    try:
        return [fn() for _ in range(times)]
    finally:
        gc.enable()


def repeat(fn, times):
    """The Stat of ``times`` calls of ``fn`` (returning seconds)."""
    return Stat.of([fn() for _ in range(times)])


# -- results ----------------------------------------------------------------------

@dataclass
class Row:
    """One line of the report: ``ours / baseline`` against a ratio limit.

    ``ours`` and ``baseline`` are Stats (a bare number: a fixed bound);
    ``limit`` None makes an informational row (no PASS/FAIL).
    """

    key: str
    label: str
    ours: Stat
    baseline: Stat
    limit: float = None
    strict: bool = False  # ratio < limit rather than <=
    unmeasured: str = None  # "skipped"/"error": no figures, why in label
    unit: str = "s"       # or "B": ours and baseline are bytes

    def __post_init__(self):
        if not self.unmeasured:
            self.ours, self.baseline = as_stat(self.ours), \
                as_stat(self.baseline)

    @property
    def ratio(self):
        if self.unmeasured:
            return None
        return self.ours.median / self.baseline.median

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
        measured = not self.unmeasured
        return {"key": self.key, "label": self.label,
                "ours_s": self.ours.median if measured else None,
                "baseline_s": self.baseline.median if measured else None,
                "ours": self.ours.as_json(self.unit) if measured else None,
                "baseline": (self.baseline.as_json(self.unit)
                             if measured else None),
                "ratio": self.ratio,
                "target": None if self.limit is None else self.target,
                "status": self.status, "unit": self.unit}


def unmeasured(key, status, why):
    """A row without figures that still names its key: a report that
    lacks a row would hide a measurement that was never made."""
    return Row(key, f"{key}: {status}: {why}", None, None, unmeasured=status)


def one_line(exc):
    """An exception in a table cell: its type and first line, short."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 100 else text[:97] + "..."


# -- the report -------------------------------------------------------------------

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


FORMATS = {"s": fmt_seconds, "B": lambda b: f"{fmt_number(b / MiB)} MiB"}


def fmt_stat(stat, unit="s"):
    """``383 us ±4%``: the median and, for repeats, their spread."""
    text = FORMATS[unit](stat.median)
    if stat.n >= 2:
        text += f" ±{stat.spread * 100:.0f}%"
    return text


def markdown(header, lines, out=sys.stdout):
    """A markdown table, its columns padded so it also reads as text:
    the first column left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in [header] + lines)
              for i in range(len(header))]

    def render(cells):
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "| " + " | ".join([first] + rest) + " |"

    print(render(header), file=out)
    print("|" + "|".join([":" + "-" * (widths[0] + 1)] +
                         ["-" * (w + 1) + ":" for w in widths[1:]]) + "|",
          file=out)
    for line in lines:
        print(render(line), file=out)


def print_table(rows, out=sys.stdout):
    header = ("measurement", "ours", "baseline", "ratio", "target", "result")
    lines = [(r.label, "-", "-", "-", r.target, r.status) if r.unmeasured
             else (r.label, fmt_stat(r.ours, r.unit),
                   fmt_stat(r.baseline, r.unit), fmt_number(r.ratio),
                   r.target, r.status) for r in rows]
    markdown(header, lines, out)


# -- baseline helper processes ----------------------------------------------------

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
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()


# -- work the sections share ------------------------------------------------------

def noop_group(names):
    """One trivial task per node: a run with nothing to do but be a run."""
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        for name in names:
            with Node(name), Task():
                ops.ConstantFill([], ["x"], shape=[1], value=1.0)
    return group


def queue_group(n, shape, nodes=("q_reader", "q_trainer"), writers=1):
    """``n`` records of ``shape`` float64 from one node to another: the
    producer's loop only enqueues, the consumer's only dequeues, so the
    queue itself is what is measured.  ``writers`` > 1: as many producer
    nodes (``<nodes[0]>_<i>``) share the ``n`` records, into one queue."""
    queue = Queue(64, name="bench")
    producers = [nodes[0]] if writers == 1 else \
        [f"{nodes[0]}_{i}" for i in range(writers)]
    with TaskGroup() as group:
        for i, node in enumerate(producers):
            with Node(node), Task(name="producer"):
                record = {"x": ops.ConstantFill([], shape=list(shape),
                                                value=1.0)}
                writer = queue.writer()
                with ops.loop(n // writers + (i < n % writers)):
                    writer.write_record(ops.net(), record)
                writer.commit(ops.net())
        with Node(nodes[1]):
            pipe(queue, processor=lambda record: None)
    return group


def _mp_producer(queue, go, n, size):
    go.wait()
    for _ in range(n):
        queue.put(np.ones(size))


def mp_queue_time(n, size):
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


def memcpy_time(n, size):
    """Seconds for ``n`` np.copyto of ``size`` float64."""
    src, dst = np.ones(size), np.empty(size)
    start = time.perf_counter()
    for _ in range(n):
        np.copyto(dst, src)
    return time.perf_counter() - start


KILL_BOUND = 0.1
KILL_DELAY = 0.15
KILL_RUN_TIMEOUT = 30.0


def sleep_until_killed():
    time.sleep(2 * KILL_RUN_TIMEOUT)


def kill_later(pid, delay, killed_at):
    time.sleep(delay)
    killed_at.append(time.perf_counter())
    os.kill(pid, signal.SIGKILL)


# -- leaks ------------------------------------------------------------------------

def reap(procs, what, log=sys.stderr):
    """Wait (bounded) for ``procs`` to exit after their system's teardown;
    kill, and say so on ``log``, any that outlive the wait."""
    _, alive = psutil.wait_procs(procs, timeout=EXIT_WAIT)
    for proc in alive:
        print(f"WARNING: process {proc.pid} outlived {what}; killed",
              file=log)
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=EXIT_WAIT)


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
