"""How often do deterministic schedules and the job checks expose the
corpus's races?  The numbers behind the kit's acceptance note.

For the starvation jobs (two workers share one reader; the one that gets
no record computes 0/0 = NaN) and the lost-update job (two task instances
count by a read-modify-write of one blob) of ``tests/testing/_corpus.py``.
``--tables`` picks what is measured and printed, one table each:

- ``exposure`` (the default): train each job under ``--seeds`` schedule
  seeds per strategy, one training under ``LocalSession(schedule=...)``
  each, and print the share of seeds whose final blobs are wrong:
  non-finite, or different from the job's correct result;
- ``checks``: ``--bases`` independent runs of the check's default
  schedule exploration, ``schedule_independent(build, seed=base)`` for
  bases 0, 20, 40, ...: the share that fail, how many of them failed on
  the run without preemptions (before exploring at all), and the share
  of the same explorations -- the seeds and the 20 distinct
  interleavings the check would run, trained in this process without
  that first run -- that hit a wrong result by themselves (``"mixed"``
  takes the kinds in turn: a base, a multiple of 4, is ``random``, the
  seed after it ``pct`` at depth 1, and so on);
- ``preemptions``: the preemptions of the counter-examples those failures
  give (``JobCheckFailed.counterexample["preemptions"]``, after
  shrinking);
- ``controls``: ``schedule_independent(control, seeds=range(N))`` for
  the corpus's controls: false verdicts (0 expected) and the distinct
  interleavings run;
- ``deadlock``: the wall time of ``check_job`` on the deadlock job
  (``--deadlock-runs`` times), which must fail within seconds, never at
  a run's timeout.

::

    python scripts/kit_exposure.py --seeds 200
    python scripts/kit_exposure.py --seeds 100 --records 4 8 \\
        --strategies random pct1 pct2 pct3 mixed
    python scripts/kit_exposure.py --tables checks preemptions --bases 50
    python scripts/kit_exposure.py --tables controls --control-seeds 500
    python scripts/kit_exposure.py --tables all

Strategies: ``random`` (a uniform pick among the branches that can go on
at every switch), ``pctD`` (``strategy="pct"`` with ``depth=D``) and
``mixed``.  Only the installed `localcluster.testing.Schedule` decides
what runs: when it takes no ``strategy`` argument (a seed alone: the
uniform random strategy), the other strategies are skipped, saying so.
"""

import argparse
import inspect
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "testing"))

import _corpus  # noqa: E402 - the corpus lives beside the tests
from localcluster import (JobRunner, LocalSession,  # noqa: E402
                          MultiNodeCheckpointManager)
from localcluster.testing import (JobCheckFailed, Schedule,  # noqa: E402
                                  check_job, schedule_independent)

STRATEGIES = ("random", "pct1", "pct2", "pct3", "mixed")

#: what ``--tables`` can print, in the order they are printed
TABLES = ("exposure", "checks", "preemptions", "controls", "deadlock")

#: the stride between the bases of independent check runs: the default
#: exploration runs 20 distinct interleavings from seed ``base`` on
BASE_STRIDE = 20

#: the exploration `schedule_independent` makes by default
EXPLORED = 20


def correct(name):
    """``{node: {blob: value}}`` the job must end with."""
    if name.startswith("starvation_"):
        return {"trainer": {"means_0": 1.5, "means_1": 1.5}}
    if name == "lost_update":
        return {"worker_0": {"seen": 6.0}}
    raise ValueError(f"no correct result known for {name!r}")


def takes_strategy():
    """Whether the installed Schedule takes ``strategy=``."""
    return "strategy" in inspect.signature(Schedule).parameters


def schedule(seed, strategy):
    """The Schedule of ``seed`` under ``strategy`` (a name of STRATEGIES)."""
    if not takes_strategy():
        if strategy != "random":
            raise ValueError(f"this Schedule has no strategy {strategy!r}")
        return Schedule(seed)
    if strategy.startswith("pct"):
        return Schedule(seed, strategy="pct", depth=int(strategy[3:]))
    return Schedule(seed, strategy=strategy)


def final_blobs(build, session, directory):
    """Train a fresh job; ``{node: {blob: array}}`` of its checkpointed
    nodes."""
    job = build()
    JobRunner(job, MultiNodeCheckpointManager(directory),
              timeout=60).train(session)
    return {node: {name: session.fetch_blob(name, node)
                   for name in session.blobs(node)}
            for node in job.nodes_to_checkpoint()}


def wrong(blobs, want):
    """Why ``blobs`` are wrong, or None."""
    for node, named in blobs.items():
        for name, value in named.items():
            if value.dtype.kind in "fc" and not np.isfinite(value).all():
                return f"{name!r} on {node!r} is not finite"
    for node, named in want.items():
        for name, value in named.items():
            if not np.array_equal(blobs[node][name], np.asarray(value)):
                return (f"{name!r} on {node!r} is {blobs[node][name]}, not "
                        f"{value}")
    return None


def scheduled_run(name, sched, scratch):
    """``(final blobs, interleaving)`` of one training of ``name`` under
    ``sched``; the interleaving is every run's decisions, as a value."""
    build = getattr(_corpus, f"build_{name}")
    directory = tempfile.mkdtemp(dir=scratch)
    try:
        with LocalSession(schedule=sched) as session:
            blobs = final_blobs(build, session, directory)
            key = tuple(map(tuple, session.schedule_log))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return blobs, key


def exposure(name, strategy, seeds, scratch):
    """``(exposed, first seed or None, seconds)`` of ``name``."""
    want = correct(name)
    exposed, first = 0, None
    start = time.monotonic()
    for seed in range(seeds):
        blobs, _ = scheduled_run(name, schedule(seed, strategy), scratch)
        if wrong(blobs, want) is not None:
            exposed += 1
            first = seed if first is None else first
    return exposed, first, time.monotonic() - start


def explored(name, base, scratch, first_key):
    """The check's default exploration from ``base`` without its run
    without preemptions: seeds ``base``, ``base + 1``, ... under
    ``Schedule(seed, "mixed")`` until `EXPLORED` distinct interleavings
    (other than ``first_key``, that run's) ran, at most ``3 * EXPLORED``
    seeds -- as `schedule_independent` picks them.  The number of the
    distinct interleaving that first ended wrong (1-based), or None."""
    want = correct(name)
    seen, ran = {first_key}, 0
    for seed in range(base, base + 3 * EXPLORED):
        blobs, key = scheduled_run(name, Schedule(seed, "mixed"), scratch)
        if key in seen:
            continue
        seen.add(key)
        ran += 1
        if wrong(blobs, want) is not None:
            return ran
        if ran >= EXPLORED:
            break
    return None


def check_runs(name, bases, scratch):
    """``bases`` independent runs of ``schedule_independent(build,
    seed=base)``: a dict of what they found."""
    build = getattr(_corpus, f"build_{name}")
    _, first_key = scheduled_run(name, Schedule.switches([]), scratch)
    found = {"failed": 0, "by_first": 0, "explored": 0, "preemptions": [],
             "kinds": {}, "to_first": [], "seconds": 0.0}
    for i in range(bases):
        base = i * BASE_STRIDE
        start = time.monotonic()
        try:
            schedule_independent(build, seed=base)
        except JobCheckFailed as failed:
            found["failed"] += 1
            example = failed.counterexample
            found["preemptions"].append(example["preemptions"])
            if example["interleavings"] == 1:
                # only the run without preemptions ran: it failed (its
                # counter-example names the check's seed too)
                found["by_first"] += 1
            else:
                kind = Schedule(example["seed"], "mixed").kind()
                how = "random" if kind[0] == "random" else f"pct{kind[1]}"
                found["kinds"][how] = found["kinds"].get(how, 0) + 1
        found["seconds"] += time.monotonic() - start
        to_first = explored(name, base, scratch, first_key)
        if to_first is not None:
            found["explored"] += 1
            found["to_first"].append(to_first)
        print(f"  {name} base {base}: {found['failed']}/{i + 1} failed, "
              f"exploration alone {found['explored']}/{i + 1}",
              file=sys.stderr, flush=True)
    return found


def control_runs(name, seeds):
    """``(false verdicts, runs, distinct interleavings, seconds, what
    failed)`` of ``schedule_independent(control, seeds=range(seeds))``."""
    build = getattr(_corpus, f"build_{name}")
    start = time.monotonic()
    try:
        result = schedule_independent(build, seeds=range(seeds))
    except JobCheckFailed as failed:
        return 1, "-", failed.counterexample.get("interleavings", "-"), \
            time.monotonic() - start, failed.message
    return 0, result.runs, result.interleavings, \
        time.monotonic() - start, ""


def deadlock_runs(runs):
    """``[(check that failed or "passed", wall seconds)]`` of
    ``check_job`` on the deadlock job, ``runs`` times."""
    out = []
    for _ in range(runs):
        start = time.monotonic()
        try:
            check_job(_corpus.build_deadlock)
            verdict = "passed"
        except JobCheckFailed as failed:
            verdict = failed.check
        out.append((verdict, time.monotonic() - start))
    return out


def print_table(title, header, rows, left=2):
    """``rows`` under ``header``, the first ``left`` columns left-aligned."""
    print(f"\n{title}" if title else "", end="\n" if title else "")
    widths = [max(len(r[i]) for r in rows + [header])
              for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths)] + rows:
        print("  ".join(c.ljust(w) if i < left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
    sys.stdout.flush()


def share(part, whole):
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Share of schedule seeds and of job-check runs that "
                    "expose the corpus's starvation and lost-update bugs; "
                    "the controls' false verdicts; the deadlock's wall "
                    "time.")
    parser.add_argument("--tables", nargs="+", choices=TABLES + ("all",),
                        default=["exposure"],
                        help="what to measure (default: exposure)")
    parser.add_argument("--seeds", type=int, default=100,
                        help="exposure: seeds per job and strategy "
                             "(default 100)")
    parser.add_argument("--records", type=int, nargs="+",
                        choices=_corpus.STARVATION_RECORDS,
                        default=list(_corpus.STARVATION_RECORDS),
                        help="sizes of the starvation job (default: all)")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES,
                        default=list(STRATEGIES),
                        help="exposure: schedule strategies (default: all "
                             "the installed Schedule takes)")
    parser.add_argument("--bases", type=int, default=50,
                        help="checks, preemptions: independent check runs "
                             f"per job, bases 0, {BASE_STRIDE}, "
                             f"{2 * BASE_STRIDE}, ... (default 50)")
    parser.add_argument("--control-seeds", type=int, default=500,
                        help="controls: schedule seeds per control "
                             "(default 500)")
    parser.add_argument("--deadlock-runs", type=int, default=5,
                        help="deadlock: check_job calls (default 5)")
    args = parser.parse_args(argv)
    for what in ("seeds", "bases", "control_seeds", "deadlock_runs"):
        if getattr(args, what) < 1:
            parser.error(f"--{what.replace('_', '-')} must be at least 1")
    tables = TABLES if "all" in args.tables else \
        [t for t in TABLES if t in args.tables]
    strategies = args.strategies
    if not takes_strategy():
        skipped = [s for s in strategies if s != "random"]
        strategies = ["random"]
        if skipped:
            print(f"this Schedule takes only a seed (the uniform random "
                  f"strategy); skipped: {', '.join(skipped)}")
    jobs = [f"starvation_{r}" for r in args.records] + ["lost_update"]
    warnings.simplefilter("ignore", RuntimeWarning)    # the 0/0 is the bug
    titled = len(tables) > 1 or tables != ["exposure"]
    scratch = tempfile.mkdtemp(prefix="kit-exposure-")
    try:
        if "exposure" in tables:
            rows = []
            for name in jobs:
                for strategy in strategies:
                    exposed, first, seconds = exposure(name, strategy,
                                                       args.seeds, scratch)
                    rows.append((name, strategy, f"{exposed}/{args.seeds}",
                                 share(exposed, args.seeds),
                                 "-" if first is None else str(first),
                                 f"{seconds:.1f}"))
                    print(f"  {name} {strategy}: {exposed}/{args.seeds}",
                          file=sys.stderr, flush=True)
            print_table(
                f"exposure: seeds 0..{args.seeds - 1} whose training ends "
                "wrong (non-finite or not the correct blobs)" if titled
                else None,
                ("job", "strategy", "exposed", "share", "first seed",
                 "seconds"), rows)
        if "checks" in tables or "preemptions" in tables:
            found = {name: check_runs(name, args.bases, scratch)
                     for name in jobs}
            bases = args.bases
            last = (bases - 1) * BASE_STRIDE
            if "checks" in tables:
                rows = []
                for name in jobs:
                    f = found[name]
                    rows.append((
                        name, f"{f['failed']}/{bases}",
                        share(f["failed"], bases), str(f["by_first"]),
                        f"{f['explored']}/{bases}",
                        share(f["explored"], bases),
                        "-" if not f["to_first"] else
                        f"{min(f['to_first'])}/"
                        f"{statistics.median(f['to_first']):g}/"
                        f"{max(f['to_first'])}",
                        f"{f['seconds'] / bases:.2f}"))
                print_table(
                    "checks: schedule_independent(build, seed=base) for "
                    + (f"bases 0, {BASE_STRIDE}, ..., {last}" if bases > 1
                       else "base 0"),
                    ("job", "failed", "share", "on the run w/o preemptions",
                     "exploration alone", "share",
                     "interleavings to 1st (min/median/max)",
                     "s per check"), rows, left=1)
            if "preemptions" in tables:
                rows = []
                for name in jobs:
                    f = found[name]
                    counts = f["preemptions"]
                    spread = " ".join(f"{p}:{counts.count(p)}"
                                      for p in sorted(set(counts)))
                    kinds = " ".join(f"{k}:{v}" for k, v in
                                     sorted(f["kinds"].items())) or "-"
                    rows.append((name, str(len(counts)),
                                 str(min(counts)) if counts else "-",
                                 str(max(counts)) if counts else "-",
                                 spread or "-", kinds))
                print_table(
                    "preemptions: of the shrunk counter-examples of those "
                    "failures (JobCheckFailed.counterexample"
                    "['preemptions'])",
                    ("job", "failures", "min", "max",
                     "preemptions:failures", "found by (seed's kind)"),
                    rows, left=1)
        if "controls" in tables:
            rows = []
            for name in _corpus.CONTROLS:
                false, runs, distinct, seconds, said = control_runs(
                    name, args.control_seeds)
                rows.append((name, f"{false}", str(runs), str(distinct),
                             f"{seconds:.1f}", said[:60] or "-"))
                print(f"  {name}: {false} false, {distinct} interleavings",
                      file=sys.stderr, flush=True)
            print_table(
                f"controls: schedule_independent(control, seeds=range("
                f"{args.control_seeds}))",
                ("control", "false verdicts", "runs",
                 "distinct interleavings", "seconds", "failure"), rows,
                left=1)
        if "deadlock" in tables:
            done = deadlock_runs(args.deadlock_runs)
            walls = [w for _, w in done]
            verdicts = sorted({v for v, _ in done})
            print_table(
                f"deadlock: check_job(build_deadlock) with its defaults, "
                f"{args.deadlock_runs} time(s)",
                ("job", "verdict", "min s", "median s", "max s"),
                [("deadlock", ",".join(verdicts), f"{min(walls):.2f}",
                  f"{statistics.median(walls):.2f}", f"{max(walls):.2f}")],
                left=2)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
