#!/usr/bin/env python
"""The same work on localcluster and on its peers, Ray and Dask.

Each work is done the way a user of that system would do it by hand, and
timed from the driver:

- ``startup_N`` (N = 4, 16): from nothing to N stateful workers that have
  each answered one call, engine start included -- what a user waits
  for.  ``localhost``: ``LocalHostScheduler(nodes=...)`` and a first run
  of one trivial task per node; ``local``: ``LocalSession()`` and that
  run; ``raysession``: ``RaySession()`` starting its own Ray, and that
  run; ``ray``: Ray started as a RaySession starts it (see bench_ray)
  and N actors, each pinged; ``dask``: a
  ``LocalCluster`` of N single-threaded worker processes, a ``Client``
  and an actor on each worker, each pinged.  A node is a stateful
  worker, so a peer's counterpart is an actor, not a stateless task.
  All is torn down and its processes waited for, untimed, between samples.
- ``noop_4``: one round of a no-op on 4 warm workers, all 4 replies
  awaited: a run of a 4-node group; 4 actor calls gathered.
- ``fetch_64mib``: 64 MiB of float64 a worker holds, brought to the
  driver as an array the driver owns (a copy, not a view of memory the
  worker may change): ``fetch_blob(copy=True)``; ``np.array(ray.get())``
  (``ray.get`` gives a read-only view of Ray's object store); a Dask
  actor call's result (unpickled into the driver's own buffer).
- ``queue_small`` / ``queue_1mib``: records of one float / of 1 MiB from
  one worker to another, from the start of producing to the consumer
  having them all: a run of a producer node and a consumer node joined
  by a ``Queue``; each peer's own queue (``ray.util.queue.Queue``, an
  actor; ``distributed.Queue``, held by Dask's scheduler) between two
  actors, one filling it, one draining it.

Each system is measured with only its own engine running (localcluster,
then Ray, then Dask): none pays for another's idle daemons.  The warm
works reuse the engine of a peer's last start-up sample (a Ray shared by
RaySession and the plain actors, which take their samples of each work
in turns: RaySession's rows are ratios to the plain actors'; a Dask
cluster of 4 workers).  A peer
not installed is skipped; a pair that fails is an error, its traceback
on the log, and the others still run.
"""

import contextlib
import gc
import os
import sys
import time
import traceback
from dataclasses import dataclass

if __name__ == "__main__":   # run as a script: the package beside scripts/
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

import numpy as np
import psutil

import bench_ray
from benchlib import (BENCH_EXTRA, MiB, leftovers, noop_group, one_line,
                      queue_group, reap, samples, timed)
from localcluster import (LocalHostScheduler, LocalSession, Node, Task,
                          TaskGroup, WorkspaceType, ops)

__all__ = ["SYSTEMS", "WORKS", "measure"]

SYSTEMS = ("localhost", "local", "raysession", "ray", "dask")
WORKS = ("startup_4", "startup_16", "noop_4", "fetch_64mib", "queue_small",
         "queue_1mib")
WARM_WORKS = WORKS[2:]
#: seconds any one start, run, call, get or result may take
WAIT = 60.0


@dataclass(frozen=True)
class Plan:
    """How many samples of each work, in a full or a quick run."""

    startup_samples: dict  # N of the startup_N measured -> its samples
    noop_rounds: dict     # system -> rounds, each system <= ~5 s
    fetch_bytes: int
    fetch_samples: int
    queue_small: int      # records of one float
    queue_big: int        # records of 1 MiB
    queue_samples: int


# a start of 16 Ray actors takes 10-17 s on 2 cores and 2000 records
# through a peer's queue ~6 s: two samples of those keep a full run in
# its budget
FULL = Plan({4: 3, 16: 2}, {"localhost": 1000, "local": 2000,
                            "raysession": 200, "ray": 200, "dask": 150},
            64 * MiB, 15, 2000, 200, 2)
QUICK = Plan({4: 1}, dict.fromkeys(SYSTEMS, 20), 8 * MiB, 1, 200, 20, 1)


class _Worker:
    """A peer's stateful worker, what a user would write by hand: a node's
    counterpart.  Both peers' queues take ``put(x, timeout=)`` and
    ``get(timeout=)``."""

    def __init__(self):
        self.array = None

    def pid(self):
        return os.getpid()

    def noop(self):
        return None

    def hold(self, size):
        self.array = np.full(size, 1.5)

    def get(self):
        return self.array

    def fill(self, queue, n, size):
        for _ in range(n):
            queue.put(np.ones(size), timeout=WAIT)

    def drain(self, queue, n):
        for _ in range(n):
            queue.get(timeout=WAIT)


# -- measuring --------------------------------------------------------------------

def measure(quick, log=sys.stderr):
    """One dict per (work, system) pair, in WORKS then SYSTEMS order:
    ``{"work", "system", "samples": [seconds, ...]}`` (and ``"note"``
    where the work was scaled down), ``{"work", "system", "skipped":
    why}`` or ``{"work", "system", "error": one line}`` (traceback on
    ``log``).  Leaves no process, Ray, Dask or segment behind."""
    plan = QUICK if quick else FULL
    out, reaper = _Results(log), _Reaper(log)
    if 16 not in plan.startup_samples:
        out.skip(["startup_16"], SYSTEMS, "quick run")
    # the peers report on stdout (Ray's warnings, its workers' output): on
    # the log, so that stdout stays the caller's report
    with contextlib.redirect_stdout(log):
        try:
            _measure_local(plan, out, reaper)
            for systems, module, measure_peer in (
                    (("raysession", "ray"), "ray", _measure_ray),
                    (("dask",), "distributed", _measure_dask)):
                try:
                    peer = __import__(module)
                except ImportError:
                    out.skip(WORKS, systems, BENCH_EXTRA)
                    continue
                measure_peer(plan, out, reaper, peer)
        finally:
            reaper.finish()
    return [out.pairs.get((w, s)) or dict(work=w, system=s,
                                          error="not measured")
            for w in WORKS for s in SYSTEMS]


class _Results:
    """The pairs so far.  A failing measurement is an error pair (its
    traceback on the log) and never stops the others; a pair recorded
    first stays."""

    def __init__(self, log):
        self.log, self.pairs = log, {}

    def record(self, work, system, measure_samples, note=None):
        began = time.perf_counter()
        try:
            pair = dict(work=work, system=system,
                        samples=list(measure_samples()))
        except Exception as exc:  # noqa: BLE001 - an error pair instead
            self.fail([work], system, exc)
            return
        self.pairs[work, system] = dict(pair, note=note) if note else pair
        print(f"{work}/{system}: {time.perf_counter() - began:.1f} s",
              file=self.log)

    def fail(self, works, system, exc):
        print(f"{'/'.join(works)} of {system} failed:\n"
              f"{traceback.format_exc()}", file=self.log)
        for work in works:
            self.pairs.setdefault((work, system), dict(
                work=work, system=system, error=one_line(exc)))

    def skip(self, works, systems, why):
        for work in works:
            for system in systems:
                self.pairs.setdefault((work, system), dict(
                    work=work, system=system, skipped=why))


def _startups(plan, out, system, start_once):
    """``startup_N`` of one system, the largest N first.  ``start_once(n)``
    returns ``(seconds, work, stop)``: one start's time, the works on its
    engine (see `_warm_works`) and its teardown, called (untimed) before
    the next sample -- but for the last sample, a start of 4, whose
    ``(work, stop)`` are returned for the warm works: its engine would
    only be started again.  ``(None, None)`` if that start failed."""
    sizes, kept = sorted(plan.startup_samples, reverse=True), []

    def samples(n):
        seconds = []
        for i in range(plan.startup_samples[n]):
            elapsed, work, stop = start_once(n)
            if n == sizes[-1] and i == plan.startup_samples[n] - 1:
                kept.append((work, stop))
            else:
                stop()
            seconds.append(elapsed)
        return seconds

    for n in sizes:
        out.record(f"startup_{n}", system, lambda: samples(n))
    return kept[0] if kept else (None, None)


def _warm(plan, out, system, kept, start_once):
    """The warm works of one system on the engine ``kept`` by its
    start-ups -- or, if that start failed, on a new start of 4 -- torn
    down after."""
    work, stop = kept
    try:
        if work is None:
            _, work, stop = start_once(4)
        _warm_works(plan, out, {system: work})
    except Exception as exc:  # noqa: BLE001 - no engine: every work an error
        out.fail(WARM_WORKS, system, exc)
    finally:
        if stop is not None:
            stop()


def _warm_works(plan, out, works):
    """noop/fetch/queue on warm engines: ``works`` maps each system to
    its work, whose methods set a work up (untimed) and return its timed
    call.  Systems on one engine (RaySession and the plain actors on one
    Ray) take their samples of a work in turns -- one of each, then the
    next -- so that what the engine and the machine do meanwhile falls
    on both alike."""
    def fetched(call):
        got = call()
        if got.shape != (plan.fetch_bytes // 8,) or got[-1] != 1.5:
            raise AssertionError(f"fetched {got!r}, not the array")
        return call

    def noop(work, system):
        call = work.noop()
        samples(timed(call), 10)   # warm-up: plans cached, connections made
        return call, plan.noop_rounds[system]

    setups = [
        ("noop_4", noop, None),
        ("fetch_64mib",
         lambda work, _: (fetched(work.fetch(plan.fetch_bytes)),
                          plan.fetch_samples),
         None if plan.fetch_bytes == 64 * MiB else
         f"{plan.fetch_bytes // MiB} MiB in a quick run")]
    for key, n, size in (("queue_small", plan.queue_small, 1),
                         ("queue_1mib", plan.queue_big, MiB // 8)):
        setups.append((key, lambda work, _, n=n, size=size: (
            work.queue(n, size), plan.queue_samples), None))
    for key, setup, note in setups:
        try:
            calls = {system: setup(work, system)
                     for system, work in works.items()}
            got = _in_turns(calls)
        except Exception as exc:  # noqa: BLE001 - an error pair each
            for system in works:
                out.fail([key], system, exc)
            continue
        for system in works:
            out.record(key, system, lambda s=system: got[s], note)


def _in_turns(calls):
    """``{system: [seconds, ...]}`` of ``calls`` (system -> ``(call,
    times)``), one sample of each system in turn, the garbage collector
    off (see `samples`)."""
    got = {system: [] for system in calls}
    timers = {system: timed(call) for system, (call, _) in calls.items()}
    gc.collect()
    gc.disable()
    try:
        for i in range(max(times for _, times in calls.values())):
            for system, (_, times) in calls.items():
                if i < times:
                    got[system].append(timers[system]())
    finally:
        gc.enable()
    return got


# -- processes --------------------------------------------------------------------

class _Reaper:
    """Waits (bounded) for the processes a system leaves at its teardown
    -- taken before it: a Ray worker whose raylet died first is no longer
    our descendant -- and kills any that outlive the wait.  Children alive
    before measure(), and multiprocessing's resource tracker, are not a
    system's."""

    def __init__(self, log):
        self.log = log
        self.before = {p.pid for p in psutil.Process().children(True)}

    def stopped(self, stop):
        """``stop()``, then what this module started reaped."""
        keep = self.before | {_tracker_pid()}
        procs = [p for p in psutil.Process().children(True)
                 if p.pid not in keep]
        try:
            stop()
        finally:
            reap(procs, "its system's teardown", self.log)

    def finish(self):
        """The resource tracker that Dask's spawned workers started
        stopped (it would outlive measure()), any other child reaped."""
        from multiprocessing import resource_tracker
        if _tracker_pid() not in self.before | {None}:
            with contextlib.suppress(Exception):
                resource_tracker._resource_tracker._stop()
        reap([p for p in psutil.Process().children(True)
              if p.pid not in self.before], "measure()", self.log)


def _tracker_pid():
    from multiprocessing import resource_tracker
    return getattr(resource_tracker._resource_tracker, "_pid", None)


# -- localcluster -----------------------------------------------------------------

class _SessionWork:
    """The warm works as a session does them: runs of groups (the first
    run sends and caches the plans), ``fetch_blob``."""

    def __init__(self, session):
        self.session = session

    def _warm_run(self, group):
        self.session.run(group, timeout=WAIT)
        return lambda: self.session.run(group, timeout=WAIT)

    def noop(self):
        return self._warm_run(noop_group([f"peer_noop_{i}"
                                          for i in range(4)]))

    def fetch(self, nbytes):
        with TaskGroup(WorkspaceType.GLOBAL) as group:
            with Node("peer_fetch"), Task():
                ops.ConstantFill([], ["big"], shape=[nbytes // 8], value=1.5)
        self.session.run(group, timeout=WAIT)
        return lambda: self.session.fetch_blob("big", "peer_fetch", copy=True)

    def queue(self, n, size):
        return self._warm_run(queue_group(n, [1] if size == 1 else [1, size]))


def _session_start(reaper, make, n):
    """``(seconds, work, stop)`` from nothing to ``make(names)``'s session
    having run one trivial task on each of ``n`` nodes."""
    names = [f"peer_start_{i}" for i in range(n)]
    group = noop_group(names)
    start = time.perf_counter()
    session = make(names)

    def stop():
        reaper.stopped(session.close)

    try:
        session.run(group, timeout=WAIT)
    except BaseException:
        stop()
        raise
    return time.perf_counter() - start, _SessionWork(session), stop


def _measure_local(plan, out, reaper):
    starters = {"localhost": lambda names: LocalHostScheduler(nodes=names),
                "local": lambda names: LocalSession()}
    for system, make in starters.items():
        def start_once(n, make=make):
            return _session_start(reaper, make, n)
        _warm(plan, out, system, _startups(plan, out, system, start_once),
              start_once)


# -- the peers: 4 actors ----------------------------------------------------------

class _ActorWork:
    """The warm works with a peer's 4 `_Worker` actors: the 4 no-op calls
    gathered; the array one actor holds got by the driver; a queue
    between two actors, one filling it, one draining it.  ``call(actor,
    method, *args)`` starts a call, ``gather(calls)`` waits for their
    results, ``owned(array)`` makes a got array the driver's,
    ``new_queue()`` makes the peer's queue."""

    def __init__(self, actors, call, gather, owned, new_queue):
        self.actors, self.call, self.gather = actors, call, gather
        self.owned, self.new_queue = owned, new_queue

    def noop(self):
        return lambda: self.gather([self.call(a, "noop")
                                    for a in self.actors])

    def fetch(self, nbytes):
        holder = self.actors[0]
        self.gather([self.call(holder, "hold", nbytes // 8)])
        return lambda: self.owned(self.gather([self.call(holder, "get")])[0])

    def queue(self, n, size):
        queue, (producer, consumer) = self.new_queue(), self.actors[:2]

        def transfer(n=n):
            self.gather([self.call(producer, "fill", queue, n, size),
                         self.call(consumer, "drain", queue, n)])
        transfer(10)   # warm-up: the queue made, its callers connected
        return transfer


def _ray_work(ray, actors):
    """Ray's way: ``actor.method.remote()``, one ``ray.get`` of all; a got
    array copied (``ray.get`` gives a read-only view of Ray's object
    store); a ``ray.util.queue.Queue``, itself an actor holding no CPU."""
    from ray.util.queue import Queue
    return _ActorWork(
        actors, lambda a, method, *args: getattr(a, method).remote(*args),
        lambda refs: ray.get(refs, timeout=WAIT), np.array,
        lambda: Queue(64, actor_options={"num_cpus": 0}))


def _dask_work(client, actors):
    """Dask's way: ``actor.method()``, each call's ``result()``; a got
    array is already the driver's; a ``distributed.Queue``."""
    import distributed
    return _ActorWork(
        actors, lambda a, method, *args: getattr(a, method)(*args),
        lambda futures: [f.result(timeout=WAIT) for f in futures],
        lambda array: array,
        lambda: distributed.Queue(client=client, maxsize=64))


# -- Ray --------------------------------------------------------------------------

def _ray_start(reaper, ray, n):
    """``(seconds, work, stop)`` from Ray's start (as bench_ray starts it:
    as a RaySession does) to ``n`` `_Worker` actors each having answered once.  An actor
    holds no CPU, as a node's actor holds none (so 16 fit on a small
    machine); the class travels by value (a worker started elsewhere
    cannot import this module)."""
    def stop():
        reaper.stopped(bench_ray.stop_ray)

    start = time.perf_counter()
    try:
        bench_ray._start_ray(ray)
        if __name__ != "__main__":
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        cls = ray.remote(num_cpus=0, max_restarts=0)(_Worker)
        actors = [cls.remote() for _ in range(n)]
        ray.get([a.pid.remote() for a in actors], timeout=WAIT)
        elapsed, work = time.perf_counter() - start, _ray_work(ray, actors)
    except BaseException:
        stop()
        raise
    return elapsed, work, stop


def _measure_ray(plan, out, reaper, ray):
    """RaySession's start-ups (each its own Ray), the plain actors', then
    both systems' warm works on the Ray of the plain actors' last start."""
    from localcluster.sessions.ray import RaySession

    def session_start(n):   # no address: its own Ray, shut down at close
        try:                  # -- with the options of the plain actors' Ray
            return _session_start(
                reaper, lambda names: RaySession(**bench_ray.QUIET), n)
        except BaseException:   # a session that failed to start left it up
            reaper.stopped(bench_ray.stop_ray)
            raise

    def ray_start(n):
        return _ray_start(reaper, ray, n)

    _, stop = _startups(plan, out, "raysession", session_start)
    if stop is not None:
        stop()
    work, stop = _startups(plan, out, "ray", ray_start)
    try:
        if work is None:   # the last start failed: a new Ray
            reaper.stopped(bench_ray.stop_ray)
            _, work, stop = ray_start(4)
        session = RaySession()   # on the Ray up, which it leaves up
        try:
            _warm_works(plan, out, {"raysession": _SessionWork(session),
                                    "ray": work})
        finally:
            session.close()
    except Exception as exc:  # noqa: BLE001 - no Ray: every work an error
        out.fail(WARM_WORKS, "raysession", exc)
        out.fail(WARM_WORKS, "ray", exc)
    finally:
        reaper.stopped(bench_ray.stop_ray)


# -- Dask -------------------------------------------------------------------------

def _dask_start(reaper, distributed, n):
    """``(seconds, work, stop)`` from nothing to a LocalCluster of ``n``
    single-threaded worker processes, its client and a `_Worker` actor on
    each worker, each having answered once."""
    import cloudpickle   # Dask pickles this module's class by value too
    if __name__ != "__main__":
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = client = None

    def close():
        if client is not None:
            client.close(timeout=WAIT)
        if cluster is not None:
            cluster.close(timeout=WAIT)

    def stop():
        reaper.stopped(close)

    start = time.perf_counter()
    try:
        cluster = distributed.LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True,
            dashboard_address=None)
        client = distributed.Client(cluster, timeout=WAIT)
        client.wait_for_workers(n, timeout=WAIT)
        actors = [f.result(timeout=WAIT) for f in [
            client.submit(_Worker, actor=True, workers=[worker])
            for worker in sorted(client.nthreads())]]
        work = _dask_work(client, actors)
        work.gather([work.call(a, "pid") for a in actors])
    except BaseException:
        stop()
        raise
    return time.perf_counter() - start, work, stop


def _measure_dask(plan, out, reaper, distributed):
    def start_once(n):
        return _dask_start(reaper, distributed, n)
    _warm(plan, out, "dask", _startups(plan, out, "dask", start_once),
          start_once)


# -- trying it --------------------------------------------------------------------

def main(argv=None):
    """``[--quick]``: one line per pair, then what was left behind."""
    import statistics
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)
    start = time.perf_counter()
    for p in measure(quick):
        line, s = f"{p['work']:<12} {p['system']:<10}", p.get("samples")
        if s:
            line += (f" median {statistics.median(s):.6f} s  min {min(s):.6f}"
                     f"  max {max(s):.6f}  n {len(s)}  {p.get('note', '')}")
        else:
            line += f" skipped: {p['skipped']}" if "skipped" in p else \
                f" error: {p['error']}"
        print(line.rstrip())
    print(f"measure(quick={quick}) took {time.perf_counter() - start:.1f} s")
    for what, items in leftovers().items():
        if items:
            print(f"WARNING: {what} left behind: {items}", file=sys.stderr)


if __name__ == "__main__":
    main()
