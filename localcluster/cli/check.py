"""``python -m localcluster.run --check``: the job checks on a job.

Runs `localcluster.testing.check_job`'s checks -- all, or those named
(``--check sessions_agree,restart_recovers``) -- on the job the command
line would train, prints a verdict per check and, for a failure, the
counter-example and one line of Python that replays it.  Exit status 0
when every check passed, 1 when one failed.

The verdicts are whole lines on stdout, written as each check ends; what
the job itself prints while it is checked (its nodes' output, over many
runs) goes to stderr, so it never breaks a verdict line and stdout holds
the verdicts alone.

The checks share one `Runs`: their uninterrupted runs are made once, and
every run goes to a forked child of one clean helper process
(`localcluster.testing._check_fresh`).  A passed check's line says how
many distinct interleavings and kills it ran.

The embedded job runs its trainers with ``--threads 1`` under ``--check``
unless ``--threads`` is given: hogwild threads make its results depend on
timing by design, which every check would rightly report.
"""

import contextlib
import logging
import os
import sys
import time

from .conditions import session_options

from .jobspec import DEFAULT_JOB, UsageError, build_job, load_builder
from .options import JobOptions
from ..testing import checks as C
from ..testing._check_runs import Runs

__all__ = ["CommandLineJob", "run_checks", "CHECKS"]

#: the checks by name, in the order they run
CHECKS = {check.__name__: check for check in C.ALL_CHECKS}


class CommandLineJob:
    """``build()`` of the job ``python -m localcluster.run --job SPEC
    --OPTION VALUE ...`` trains: a value, so a check's replay line names
    it (``CommandLineJob("pkg.mod:func", nodes=2)``)."""

    replay_import = "localcluster.cli.check"

    def __init__(self, spec=DEFAULT_JOB, **options):
        self.spec = spec
        self.options = options
        self._builder = load_builder(spec)

    def __getstate__(self):
        # the builder is loaded again where it lands: a job given by a
        # file's path is no module pickle could name
        return self.spec, self.options

    def __setstate__(self, state):
        self.spec, self.options = state
        self._builder = load_builder(self.spec)

    @property
    def fresh_imports(self):
        """The job's module, when ``spec`` names one: the checks' helper
        imports it before it forks, as it does a build function's module
        (`localcluster.testing._check_fresh`).  A job given by a file's
        path is loaded afresh in each run, as ever."""
        where = self.spec.rpartition(":")[0]
        if not where or where.endswith(".py") or os.sep in where:
            return ()
        return (where,)

    def __repr__(self):
        args = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"localcluster.cli.check.CommandLineJob({self.spec!r}{args})"

    def __call__(self):
        chosen = JobOptions(
            job=None if self.spec == DEFAULT_JOB else self.spec,
            **self.options)
        job, options, _ = build_job(self._builder, chosen)
        return job, options


def selected(names):
    """The checks ``--check`` names ("all" or a comma list)."""
    if names == "all":
        return list(CHECKS.values())
    chosen = []
    for name in (n.strip() for n in names.split(",")):
        if name not in CHECKS:
            raise UsageError(f"--check: {name!r} is no check; give 'all' or "
                             f"some of {', '.join(CHECKS)}")
        chosen.append(CHECKS[name])
    return chosen


def run_checks(opts, out):
    """``--check``: each check's verdict on ``out`` (``opts``: the
    `RunOptions`); the exit status."""
    chosen = selected(opts.check)
    options = opts.job.given()
    if opts.job.embedded and "threads" not in options:
        options["threads"] = 1
    build = CommandLineJob(opts.job.spec, **options)
    built = build()  # a job that cannot be built is one usage error, at once
    if opts.log_level == "WARNING":
        # the restarts restart_recovers causes are what it checks, not news
        logging.getLogger("localcluster.job").setLevel(logging.ERROR)
    given = {"sessions": ("local", "localhost"),
             "max_examples": opts.max_examples,
             "max_kills": opts.max_examples,
             "timeout": opts.session.timeout or 60}
    conditions = session_options(
        opts.session, opts.job.seed,
        built[0] if isinstance(built, tuple) else built).get("conditions")
    if conditions:   # the job's result must not depend on them
        given["conditions"] = conditions
    out.write(f"checking {build.spec} ({', '.join(c.__name__ for c in chosen)})"
              "\n")
    failed = 0
    out.flush()
    runs = Runs(build, max_epochs=None, timeout=given["timeout"])
    given["_runs"] = runs     # the checks share their uninterrupted runs
    try:
        failed = _each(chosen, build, given, out)
    finally:
        runs.close()
    out.write(f"{len(chosen) - failed} of {len(chosen)} checks passed\n")
    return 1 if failed else 0


def _each(chosen, build, given, out):
    failed = 0
    for check in chosen:
        name = check.__name__
        start = time.monotonic()
        try:
            with contextlib.redirect_stdout(sys.stderr):  # the job's prints
                result = C.run_one(check, build, given)
        except C.JobCheckFailed as exc:
            failed += 1
            out.write(f"  {name} ... FAILED ({time.monotonic() - start:.1f} "
                      f"s)\n"
                      f"    {exc.message}\n"
                      f"    counter-example: {exc.counterexample}\n"
                      f"    replay: {exc.replay}\n")
        else:
            said = _said(result)
            out.write(f"  {name} ... ok ({time.monotonic() - start:.1f} s"
                      f"{said})\n")
        out.flush()
    return failed


def _said(result):
    """What a passed check ran, for its verdict line."""
    parts = []
    if getattr(result, "interleavings", 0):
        parts.append(f"{result.interleavings} distinct interleavings")
    if getattr(result, "kills", None):
        parts.append(f"{result.kills[0]} of {result.kills[1]} kills")
    return "".join(f", {p}" for p in parts)
