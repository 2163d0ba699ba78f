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


def resolve_session(session):
    """``session.kind`` (`SessionOptions`) given its default: ``local``
    under --simulate, else ``localhost``; a UsageError for options that
    do not fit."""
    if session.simulate:
        if session.kind not in (None, "local"):
            raise UsageError(
                f"--simulate runs every node in this process on a virtual "
                f"clock (--session local), not --session {session.kind}")
        session.kind = "local"
    elif session.op_seconds is not None:
        raise UsageError("--op-seconds goes with --simulate")
    session.kind = session.kind or "localhost"
    if session.ray_address and session.kind != "ray":
        raise UsageError("--ray-address goes with --session ray")


def _stragglers(k, nodes):
    trainers = sorted((n for n in nodes if fnmatch.fnmatchcase(
        n, "trainer_*")), key=lambda n: (len(n), n))
    if k > len(trainers):
        raise UsageError(f"--stragglers {k}: the job has {len(trainers)} "
                         "trainer(s) (nodes named trainer_*); give at most "
                         "that many, or --slowdown NODE=FACTOR")
    return [Slowdown(n, STRAGGLER_FACTOR) for n in trainers[len(trainers) - k:]]


def session_options(session, seed, job):
    """``{"conditions": [...], "schedule": Schedule}`` (what applies) for
    the session `SessionOptions` ``session`` describes (``seed``: the
    run's ``--seed``, which seeds a --simulate schedule)."""
    nodes = job_nodes(job)
    conditions = list(session.link) + list(session.slowdown)
    if session.stragglers:
        conditions += _stragglers(session.stragglers, nodes)
    try:
        check_patterns(conditions, [p for _, p in session.faults.partitions()]
                       if session.faults is not None else [], nodes)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    options = {}
    if conditions:
        options["conditions"] = conditions
    if session.simulate:
        op_seconds = SIM_OP_SECONDS if session.op_seconds is None \
            else session.op_seconds
        options["schedule"] = Schedule(seed or 0, op_seconds=op_seconds)
    return options
