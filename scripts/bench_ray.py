"""RaySession's figures, for scripts/bench.py.

Under `RaySession` every Node is a Ray actor, so each row's baseline is
plain Ray doing the same work by hand in the same run -- raw actor calls,
actors started and pinged, ``ray.get`` of an actor's array,
``ray.util.queue`` -- or a fixed bound.  Ray is started once for the
section and shut down at its end; every RaySession connects to that Ray
and leaves it running, so no row pays Ray's own start-up (seconds) and
both sides of a row meet the same warm cluster.

A measurement that fails is an error row (its traceback on stderr) and
the others still run; without Ray every row is skipped.  Ray is imported
only when the section runs, so bench.py imports this module anywhere.
"""

import contextlib
import os
import sys
import threading
import time
import traceback

import numpy as np
import psutil

from localcluster import (Node, NodeFailedError, Task, TaskGroup,
                          WorkspaceType, ops)

__all__ = ["measurement", "measure", "KEYS"]

INSTALL = "pip install -e '.[ray]'"
MiB = 1 << 20
#: seconds any one run, call or get of the section may take
WAIT = 60.0
#: seconds a killed actor's process, or Ray's after shutdown, gets to exit
EXIT_WAIT = 10.0
#: the big queue's throughput bound, bytes per second
QUEUE_BIG_BOUND = 0.5e9


def measurement(bench):
    """bench.py's measurement of RaySession, ``measure_ray(cfg) -> rows``,
    made with ``bench``'s Row, medians and helpers: bench.py hands
    itself over, since it runs as __main__ and cannot be imported."""
    def measure_ray(cfg):
        return measure(cfg, bench)
    return measure_ray


def measure(cfg, bench):
    """Every row of the section: skipped without Ray, an error row for
    each measurement that failed (so one failure costs only its rows)."""
    try:
        import ray
    except ImportError:
        return [_unmeasured(bench, key, "skipped", INSTALL) for key in KEYS]
    # Ray reports each worker's death on stdout (the sigkill row kills
    # some): on stderr, with the tracebacks, stdout stays the report
    with contextlib.redirect_stdout(sys.stderr):
        return _measure_on_ray(cfg, bench, ray)


def _measure_on_ray(cfg, bench, ray):
    """The rows, on a Ray started for them and shut down after."""
    rows = []
    try:
        _start_ray(ray)
    except Exception as exc:  # noqa: BLE001 - every row an error row
        _stop_ray(ray)
        return _failed(bench, "starting Ray", KEYS, exc)
    try:
        for measure_one, keys in SECTION:
            try:
                rows.extend(measure_one(cfg, bench, ray))
            except Exception as exc:  # noqa: BLE001 - an error row instead
                rows.extend(_failed(bench, measure_one.__name__, keys, exc))
    finally:
        _stop_ray(ray)
    return rows


def _failed(bench, what, keys, exc):
    """Error rows for ``keys``, the traceback of ``exc`` on stderr."""
    print(f"{what} failed:\n{traceback.format_exc()}", file=sys.stderr)
    return [_unmeasured(bench, key, "error", _one_line(exc)) for key in keys]


def _unmeasured(bench, key, status, why):
    """A row without figures that still names its key: a report that
    lacks a row would hide a measurement that was never made."""
    return bench.Row(key, f"{key}: {status}: {why}", None, None,
                     unmeasured=status)


def _one_line(exc):
    """An exception in a table cell: its type and first line, short."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 100 else text[:97] + "..."


# -- Ray, started once for the section --------------------------------------------

def _start_ray(ray):
    """A local Ray sized to this machine, quiet: the actors' output would
    interleave with the table.  This module's actor class travels by
    value: a worker started from another directory cannot import it."""
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False,
             configure_logging=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _stop_ray(ray):
    """``ray.shutdown()``, then a bounded wait for every process Ray
    started here: a worker its raylet left behind is no longer this
    process's descendant, so bench's leftovers() would not see it."""
    procs = psutil.Process().children(recursive=True)
    ray.shutdown()
    _, alive = psutil.wait_procs(procs, timeout=EXIT_WAIT)
    for proc in alive:
        print(f"WARNING: Ray process {proc.pid} outlived ray.shutdown(); "
              "killed", file=sys.stderr)
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _wait_gone(pids):
    """Wait (bounded) until the processes of killed actors have exited, so
    that the next timed start does not share the machine with them."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    psutil.wait_procs(procs, timeout=EXIT_WAIT)


def _session():
    """A RaySession on the section's Ray (imported here: it needs Ray)."""
    from localcluster.sessions.ray import RaySession
    return RaySession()


class _Plain:
    """A plain Ray actor, what a user would write by hand: the baselines'
    counterpart of a node actor."""

    def __init__(self, size=0):
        self.array = np.full(size, 1.5)

    def pid(self):
        return os.getpid()

    def f(self):
        return None

    def get(self):
        return self.array

    def fill(self, queue, n, size):
        for _ in range(n):
            queue.put(np.ones(size), timeout=WAIT)


def _plain_class(ray):
    """`_Plain` as an actor holding no CPU, as a node actor holds none."""
    return ray.remote(num_cpus=0, max_restarts=0)(_Plain)


@contextlib.contextmanager
def _plain_actors(ray, n, *args):
    """``n`` plain actors, killed afterwards.  Not waited for here: they
    start while the caller's session starts its own, and a baseline's
    warm-up calls wait for them."""
    actors = [_plain_class(ray).remote(*args) for _ in range(n)]
    pids = [actor.pid.remote() for actor in actors]
    try:
        yield actors
    finally:
        try:
            pids = ray.get(pids, timeout=WAIT)
        except Exception:  # noqa: BLE001 - one never started: none to wait
            pids = []
        for actor in actors:
            ray.kill(actor, no_restart=True)
        _wait_gone(pids)


def _noop_group(names):
    """One trivial task per node: a run with nothing to do but be a run."""
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        for name in names:
            with Node(name), Task():
                ops.Const(1.0)
    return group


# -- the measurements -------------------------------------------------------------

def measure_dispatch(cfg, bench, ray):
    """A warm run on 4 nodes against the 4 actor calls it cannot avoid."""
    group = _noop_group([f"ray_dispatch_{i}" for i in range(4)])
    with _session() as session, _plain_actors(ray, 4) as actors:
        session.run(group, timeout=WAIT)   # actors started, plans sent

        def ours():
            session.run(group, timeout=WAIT)

        def raw():
            ray.get([a.f.remote() for a in actors], timeout=WAIT)

        m = bench.medians({"ours": bench.timed(ours),
                           "raw": bench.timed(raw)},
                          cfg.dispatch_rounds, max(1, cfg.dispatch_block // 4),
                          cfg.warmup * 10)
    return [bench.Row("ray_dispatch", "RaySession run() on 4 nodes vs 4 raw "
                      "Ray actor calls", m["ours"], m["raw"], 1.25)]


def _session_start(group):
    """Seconds from a new RaySession to the end of its first run (node
    actors started, plans sent); its actors are gone when this returns."""
    start = time.perf_counter()
    with _session() as session:
        session.run(group, timeout=WAIT)
        elapsed = time.perf_counter() - start
        pids = list(session.node_pids().values())
    _wait_gone(pids)
    return elapsed


def _actors_start(ray, n):
    """Seconds to start ``n`` plain actors and ping each once."""
    cls = _plain_class(ray)
    start = time.perf_counter()
    actors = [cls.remote() for _ in range(n)]
    try:
        pids = ray.get([a.pid.remote() for a in actors], timeout=WAIT)
        elapsed = time.perf_counter() - start
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
    _wait_gone(pids)
    return elapsed


def measure_startup(cfg, bench, ray):
    """Start-up of 4 nodes: what a new session costs before it computes."""
    group = _noop_group([f"ray_start_{i}" for i in range(4)])
    # no warm-up round: measure_dispatch, before, made Ray's workers and
    # this process ready, and every start here is a first start anyway
    m = bench.medians({"ours": lambda: _session_start(group),
                       "raw": lambda: _actors_start(ray, 4)},
                      cfg.startup_rounds, 1, 0)
    return [bench.Row("ray_startup", "RaySession: 4 nodes started + first "
                      "run vs 4 raw actors started + pinged", m["ours"],
                      m["raw"], 1.5)]


def _kill_latency(bench, session, group, nodes):
    """Seconds from SIGKILL of the victim's actor process, mid-run, to
    run() raising NodeFailedError; the victim is restarted, untimed."""
    killed_at = []
    killer = threading.Thread(
        target=bench._kill_later, daemon=True,
        args=(session.node_pids()[nodes[0]], bench.KILL_DELAY, killed_at))
    killer.start()
    try:
        session.run(group, timeout=bench.KILL_RUN_TIMEOUT)
    except NodeFailedError as exc:
        detected = time.perf_counter()
        if exc.node != nodes[0]:
            raise
    else:
        raise AssertionError("run() returned although a node was killed")
    finally:
        killer.join()
    session.start_nodes(nodes)
    return detected - killed_at[0]


def measure_sigkill(cfg, bench, ray):
    """A node actor SIGKILLed during a run that sleeps: how soon the
    run says so, against bench.py's fixed bound."""
    nodes = ["ray_victim", "ray_bystander"]
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node(nodes[0]), Task():
            ops.Python(bench._sleep_until_killed)([], [])
        with Node(nodes[1]), Task():
            ops.ConstantFill([], ["x"], shape=[1], value=1.0)
    with _session() as session:
        session.start_nodes(nodes)
        latency = bench.medians(
            {"kill": lambda: _kill_latency(bench, session, group, nodes)},
            cfg.kill_repeats, 1, 0)["kill"]   # start_nodes warmed it
    return [bench.Row("ray_sigkill", f"RaySession: SIGKILLed node actor "
                      f"detected vs {bench.KILL_BOUND} s", latency,
                      bench.KILL_BOUND, 1.0, strict=True)]


def measure_fetch(cfg, bench, ray):
    """fetch_blob of 64 MiB against the ray.get + copy it is made of."""
    n = 64 * MiB // 8
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("ray_fetch"), Task():
            ops.ConstantFill([], ["big"], shape=[n], value=1.5)
    with _session() as session, _plain_actors(ray, 1, n) as (actor,):
        session.run(group, timeout=WAIT)

        def ours():
            return session.fetch_blob("big", "ray_fetch")

        def raw():
            return np.array(ray.get(actor.get.remote(), timeout=WAIT),
                            copy=True)

        for got in (ours(), raw()):
            if got.shape != (n,) or got[-1] != 1.5:
                raise AssertionError(f"fetched {got!r}, not the blob")
        m = bench.medians({"ours": bench.timed(ours),
                           "raw": bench.timed(raw)}, cfg.copy_rounds, 1, 1)
    return [bench.Row("ray_fetch", "RaySession fetch_blob 64 MiB vs raw "
                      "ray.get + np.array copy", m["ours"], m["raw"], 1.2)]


def _ray_queue_time(ray, queue, producer, n):
    """Seconds for ``n`` one-float records through a ray.util.queue from
    a plain actor to this process."""
    start = time.perf_counter()
    done = producer.fill.remote(queue, n, 1)
    for _ in range(n):
        queue.get(timeout=WAIT)
    ray.get(done, timeout=WAIT)
    return time.perf_counter() - start


def measure_queue_small(cfg, bench, ray):
    """Small records between two node actors against ray.util.queue
    (at least 20x its throughput: at most 1/20 of its time) and
    multiprocessing.Queue, which move the same records."""
    from ray.util.queue import Queue as RayQueue
    n, group = cfg.queue_small, bench._queue_group(cfg.queue_small, [1])
    with _session() as session, _plain_actors(ray, 1) as (producer,):
        queue = RayQueue(64, actor_options={"num_cpus": 0})
        try:
            m = bench.medians(
                {"ours": bench.timed(lambda: session.run(group,
                                                         timeout=WAIT)),
                 "rayq": lambda: _ray_queue_time(ray, queue, producer, n),
                 "mpq": lambda: bench._mp_queue_time(n, 1)},
                cfg.queue_rounds, 1, 1)
        finally:
            queue.shutdown(force=True)
    return [bench.Row("ray_queue_small", f"RaySession queue, {n} small "
                      "records vs ray.util.queue (>= 20x its throughput)",
                      m["ours"], m["rayq"], 0.05),
            bench.Row("ray_queue_small_mpq", f"RaySession queue, {n} small "
                      "records vs multiprocessing.Queue", m["ours"],
                      m["mpq"], 2.0)]


def measure_queue_big(cfg, bench, ray):
    """1 MiB records between two node actors against a fixed throughput."""
    n = cfg.queue_big
    group = bench._queue_group(n, [1, MiB // 8])
    with _session() as session:
        ours = bench.medians(
            {"ours": bench.timed(lambda: session.run(group, timeout=WAIT))},
            cfg.queue_rounds, 1, 1)["ours"]
    size = n * MiB
    return [bench.Row("ray_queue_big", f"RaySession queue, {n} x 1 MiB "
                      f"({size / ours / 1e9:.2f} GB/s) vs "
                      f"{QUEUE_BIG_BOUND / 1e9:g} GB/s", ours,
                      size / QUEUE_BIG_BOUND, 1.0)]


#: (measurement, the keys of its rows): the keys also name the rows of a
#: measurement that was skipped or failed
SECTION = [(measure_dispatch, ["ray_dispatch"]),
           (measure_startup, ["ray_startup"]),
           (measure_sigkill, ["ray_sigkill"]),
           (measure_fetch, ["ray_fetch"]),
           (measure_queue_small, ["ray_queue_small", "ray_queue_small_mpq"]),
           (measure_queue_big, ["ray_queue_big"])]
KEYS = [key for _, keys in SECTION for key in keys]
