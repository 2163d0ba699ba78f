"""RaySession's start-up and failure detection, for scripts/bench.py.

Under `RaySession` every Node is a Ray actor, so a row's baseline is
plain Ray doing the same work by hand in the same run -- actors started
and pinged -- or a fixed bound.  Ray is started once for the section and
shut down at its end; every RaySession connects to that Ray and leaves it
running, so no row pays Ray's own start-up (seconds) and both sides of a
row meet the same warm cluster.  (Dispatch, fetch and queues of
RaySession against raw Ray are rows bench.py derives from bench_peers'
figures: the same work measured once.)

Every Ray of the benchmarks -- this section's, and each one bench_peers
starts, for RaySession or for the plain actors -- is started the way a
RaySession without an address starts its own: by the session's
``connect`` (a local Ray sized to this machine, no dashboard, under the
watcher that kills its processes should this one die) with `QUIET`'s
options, and stopped by its ``shutdown``.  So a RaySession and the plain
actors it is measured against always meet the same kind of Ray, whichever
of them started it.  (``log_to_driver`` is off in all of them: with it on,
the default of a RaySession, the driver takes every line Ray's log monitor
forwards -- the actors' output, and the marks Ray prints when an actor
starts -- which the table should not show.)

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

import psutil

import benchlib
from benchlib import (EXIT_WAIT, KILL_BOUND, KILL_DELAY, KILL_RUN_TIMEOUT, Row,
                      alternate, kill_later, noop_group, one_line, reap,
                      sleep_until_killed, unmeasured)
from localcluster import (Node, NodeFailedError, Task, TaskGroup,
                          WorkspaceType, ops)

__all__ = ["measure", "KEYS"]

INSTALL = "pip install -e '.[ray]'"
#: seconds any one run, call or get of the section may take
WAIT = 60.0


def measure(cfg):
    """Every row of the section: skipped without Ray, an error row for
    each measurement that failed (so one failure costs only its rows)."""
    try:
        import ray
    except ImportError:
        return [unmeasured(key, "skipped", INSTALL) for key in KEYS]
    # Ray reports each worker's death on stdout (the sigkill row kills
    # some): on stderr, with the tracebacks, stdout stays the report
    with contextlib.redirect_stdout(sys.stderr):
        return _measure_on_ray(cfg, ray)


def _measure_on_ray(cfg, ray):
    """The rows, on a Ray started for them and shut down after."""
    rows = []
    try:
        _start_ray(ray)
    except Exception as exc:  # noqa: BLE001 - every row an error row
        _stop_ray(ray)
        return _failed("starting Ray", KEYS, exc)
    try:
        for measure_one, keys in SECTION:
            try:
                rows.extend(measure_one(cfg, ray))
            except Exception as exc:  # noqa: BLE001 - an error row instead
                rows.extend(_failed(measure_one.__name__, keys, exc))
    finally:
        _stop_ray(ray)
    return rows


def _failed(what, keys, exc):
    """Error rows for ``keys``, the traceback of ``exc`` on stderr."""
    print(f"{what} failed:\n{traceback.format_exc()}", file=sys.stderr)
    return [unmeasured(key, "error", one_line(exc)) for key in keys]


# -- Ray, started once for the section --------------------------------------------

#: ``ray.init`` options of every Ray the benchmarks start, on top of
#: what RaySession's ``connect`` gives a Ray it starts: quiet, as the
#: actors' output would interleave with the table
QUIET = {"log_to_driver": False}


def _start_ray(ray):
    """A local Ray started as a RaySession starts its own (see the module
    docstring), quiet.  This module's actor class travels by value: a
    worker started from another directory cannot import it."""
    from localcluster.sessions.ray import connect
    if not connect(**QUIET):
        raise RuntimeError("Ray was already initialised in this process")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(benchlib)


def stop_ray():
    """Stop the Ray `_start_ray` (or a RaySession) started, and its
    watcher."""
    from localcluster.sessions.ray import shutdown
    shutdown()


def _stop_ray(ray):
    """`stop_ray`, then a bounded wait for every process Ray started
    here: a worker its raylet left behind is no longer this process's
    descendant, so bench's leftovers() would not see it."""
    procs = psutil.Process().children(recursive=True)
    stop_ray()
    reap(procs, "ray.shutdown()")


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

    def pid(self):
        return os.getpid()


def _plain_class(ray):
    """`_Plain` as an actor holding no CPU, as a node actor holds none."""
    return ray.remote(num_cpus=0, max_restarts=0)(_Plain)


# -- the measurements -------------------------------------------------------------

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


def measure_startup(cfg, ray):
    """Start-up of 4 nodes: what a new session costs before it computes."""
    group = noop_group([f"ray_start_{i}" for i in range(4)])
    # no warm-up round: measure_dispatch, before, made Ray's workers and
    # this process ready, and every start here is a first start anyway
    m = alternate({"ours": lambda: _session_start(group),
                       "raw": lambda: _actors_start(ray, 4)},
                      cfg.startup_rounds, 1, 0)
    return [Row("ray_startup", "RaySession: 4 nodes started + first "
                      "run vs 4 raw actors started + pinged", m["ours"],
                      m["raw"], 1.5)]


def _kill_latency(session, group, nodes):
    """Seconds from SIGKILL of the victim's actor process, mid-run, to
    run() raising NodeFailedError; the victim is restarted, untimed."""
    killed_at = []
    killer = threading.Thread(
        target=kill_later, daemon=True,
        args=(session.node_pids()[nodes[0]], KILL_DELAY, killed_at))
    killer.start()
    try:
        session.run(group, timeout=KILL_RUN_TIMEOUT)
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


def measure_sigkill(cfg, ray):
    """A node actor SIGKILLed during a run that sleeps: how soon the
    run says so, against bench.py's fixed bound."""
    nodes = ["ray_victim", "ray_bystander"]
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node(nodes[0]), Task():
            ops.Python(sleep_until_killed)([], [])
        with Node(nodes[1]), Task():
            ops.ConstantFill([], ["x"], shape=[1], value=1.0)
    with _session() as session:
        session.start_nodes(nodes)
        latency = alternate(
            {"kill": lambda: _kill_latency(session, group, nodes)},
            cfg.kill_repeats, 1, 0)["kill"]   # start_nodes warmed it
    return [Row("ray_sigkill", f"RaySession: SIGKILLed node actor "
                      f"detected vs {KILL_BOUND} s", latency,
                      KILL_BOUND, 1.0, strict=True)]


#: (measurement, the keys of its rows): the keys also name the rows of a
#: measurement that was skipped or failed
SECTION = [(measure_startup, ["ray_startup"]),
           (measure_sigkill, ["ray_sigkill"])]
KEYS = [key for _, keys in SECTION for key in keys]
