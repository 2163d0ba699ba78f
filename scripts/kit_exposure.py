"""How often do deterministic schedules expose the corpus's races?

For the starvation jobs (two workers share one reader; the one that gets
no record computes 0/0 = NaN) and the lost-update job (two task instances
count by a read-modify-write of one blob) of ``tests/testing/_corpus.py``,
train each job under ``--seeds`` schedule seeds per strategy and print the
share of seeds whose final blobs are wrong: non-finite, or different from
the job's correct result.

::

    python scripts/kit_exposure.py --seeds 200
    python scripts/kit_exposure.py --seeds 100 --records 4 8 \\
        --strategies random pct1 pct2 pct3 mixed

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
from localcluster.testing import Schedule  # noqa: E402

STRATEGIES = ("random", "pct1", "pct2", "pct3", "mixed")


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


def exposure(name, strategy, seeds, scratch):
    """``(exposed, first seed or None, seconds)`` of ``name``."""
    build = getattr(_corpus, f"build_{name}")
    want = correct(name)
    exposed, first = 0, None
    start = time.monotonic()
    for seed in range(seeds):
        directory = os.path.join(scratch, f"{name}-{strategy}-{seed}")
        with LocalSession(schedule=schedule(seed, strategy)) as session:
            blobs = final_blobs(build, session, directory)
        shutil.rmtree(directory, ignore_errors=True)
        if wrong(blobs, want) is not None:
            exposed += 1
            first = seed if first is None else first
    return exposed, first, time.monotonic() - start


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Share of schedule seeds that expose the corpus's "
                    "starvation and lost-update bugs, per strategy.")
    parser.add_argument("--seeds", type=int, default=100,
                        help="seeds per job and strategy (default 100)")
    parser.add_argument("--records", type=int, nargs="+",
                        choices=_corpus.STARVATION_RECORDS,
                        default=list(_corpus.STARVATION_RECORDS),
                        help="sizes of the starvation job (default: all)")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES,
                        default=list(STRATEGIES),
                        help="schedule strategies (default: all the "
                             "installed Schedule takes)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    strategies = args.strategies
    if not takes_strategy():
        skipped = [s for s in strategies if s != "random"]
        strategies = ["random"]
        if skipped:
            print(f"this Schedule takes only a seed (the uniform random "
                  f"strategy); skipped: {', '.join(skipped)}")
    jobs = [f"starvation_{r}" for r in args.records] + ["lost_update"]
    warnings.simplefilter("ignore", RuntimeWarning)    # the 0/0 is the bug
    rows = []
    scratch = tempfile.mkdtemp(prefix="kit-exposure-")
    try:
        for name in jobs:
            for strategy in strategies:
                exposed, first, seconds = exposure(name, strategy,
                                                   args.seeds, scratch)
                rows.append((name, strategy, f"{exposed}/{args.seeds}",
                             f"{100.0 * exposed / args.seeds:.1f}%",
                             "-" if first is None else str(first),
                             f"{seconds:.1f}"))
                print(f"  {name} {strategy}: {exposed}/{args.seeds}",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    header = ("job", "strategy", "exposed", "share", "first seed", "seconds")
    widths = [max(len(r[i]) for r in rows + [header])
              for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths)] + rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
