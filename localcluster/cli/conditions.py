"""Cluster conditions on the command line: ``--slowdown``, ``--link``,
``--stragglers`` and ``--simulate``.

`session_options` turns them into what the session is opened with
(``conditions=`` and, under ``--simulate``, ``schedule=``), after
checking them against the job: a condition naming no node of the job is
a usage error naming the condition (the session would refuse it at the
first run anyway; here it is one line before anything starts).
"""

import fnmatch

from ..errors import PlanError
from ..plan.conditions import Slowdown, check_patterns
from ..runtime.schedule import Schedule
from .jobspec import UsageError, job_nodes

__all__ = ["SIM_OP_SECONDS", "STRAGGLER_FACTOR", "resolve_session",
           "session_options"]

#: the virtual time of one op under --simulate (the default)
SIM_OP_SECONDS = 1e-5
#: how much slower a --stragglers trainer is
STRAGGLER_FACTOR = 4.0


def resolve_session(args):
    """``args.session`` given its default: ``local`` under --simulate,
    else ``localhost``; a UsageError for options that do not fit."""
    if args.simulate:
        if args.session not in (None, "local"):
            raise UsageError(
                f"--simulate runs every node in this process on a virtual "
                f"clock (--session local), not --session {args.session}")
        args.session = "local"
    elif args.op_seconds is not None:
        raise UsageError("--op-seconds goes with --simulate")
    args.session = args.session or "localhost"


def _stragglers(k, nodes):
    trainers = sorted((n for n in nodes if fnmatch.fnmatchcase(
        n, "trainer_*")), key=lambda n: (len(n), n))
    if k > len(trainers):
        raise UsageError(f"--stragglers {k}: the job has {len(trainers)} "
                         "trainer(s) (nodes named trainer_*); give at most "
                         "that many, or --slowdown NODE=FACTOR")
    return [Slowdown(n, STRAGGLER_FACTOR) for n in trainers[len(trainers) - k:]]


def session_options(args, job):
    """``{"conditions": [...], "schedule": Schedule}`` (what applies) for
    the session of ``args``."""
    nodes = job_nodes(job)
    conditions = list(args.link) + list(args.slowdown)
    if args.stragglers:
        conditions += _stragglers(args.stragglers, nodes)
    try:
        check_patterns(conditions, [p for _, p in args.faults.partitions()]
                       if args.faults is not None else [], nodes)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    options = {}
    if conditions:
        options["conditions"] = conditions
    if args.simulate:
        op_seconds = SIM_OP_SECONDS if args.op_seconds is None \
            else args.op_seconds
        options["schedule"] = Schedule(args.seed or 0, op_seconds=op_seconds)
    return options
