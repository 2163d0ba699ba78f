"""What ``python -m localcluster.run`` trains, and with which options.

`load_builder` finds the job function ``--job`` names (a module or a
file); `build_job` calls it with the options it takes, checks what it
returns and says which value of each job option the job was built with
(given on the command line, else the function's default) -- what a
checkpoint directory records and ``--resume`` compares.  `limiter_counters`
finds the job's `epoch_limiter` counters, so that a resumed run can train
to another number of epochs.

Problems are one line: `UsageError` (a bad command line, exit 2) or
`RunFailure` (exit 1; `JobBuildError`: the job function failed).
"""

import fnmatch
import importlib
import importlib.util
import inspect
import logging
import os
import sys

from ..job import Job
from .options import DEFAULT_JOB, JOB_OPTIONS
from ..plan.net import Net
from ..plan.step import ExecutionStep

__all__ = ["DEFAULT_JOB", "JOB_OPTIONS", "UsageError", "RunFailure",
           "JobBuildError", "load_builder", "build_job", "job_nodes",
           "first_line", "limiter_counters", "nodes_matching"]



log = logging.getLogger("localcluster.run")


class UsageError(Exception):
    """A bad command line: exit 2 with one line."""


class RunFailure(Exception):
    """The run cannot go on: exit 1 with one line."""


class JobBuildError(RunFailure):
    """The job function failed: exit 1 with one line."""


# -- loading the job -------------------------------------------------------------------

def load_builder(spec):
    """The job function named by ``spec`` (MODULE:FUNC or FILE.py:FUNC)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise UsageError(f"--job {spec!r}: expected MODULE:FUNC or "
                         "path/to/file.py:FUNC")
    if where.endswith(".py") or os.sep in where:
        if not os.path.isfile(where):
            raise UsageError(f"--job {spec!r}: no file {where!r}")
        module_name = "_localcluster_job_" + \
            os.path.splitext(os.path.basename(where))[0]
        module_spec = importlib.util.spec_from_file_location(module_name,
                                                             where)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module  # so its functions pickle
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise UsageError(f"--job {spec!r}: {where} failed to load: "
                             f"{type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise UsageError(f"--job {spec!r}: cannot import module "
                             f"{where!r} ({exc})") from exc
        except Exception as exc:
            raise UsageError(f"--job {spec!r}: module {where!r} failed to "
                             f"load: {type(exc).__name__}: {exc}") from exc
    builder = getattr(module, name, None)
    if not callable(builder):
        raise UsageError(f"--job {spec!r}: {where} has no function {name!r}")
    return builder


def build_job(builder, chosen):
    """``(job, options, values)`` from the job function and the job
    options ``chosen`` (`JobOptions`): ``values`` maps each of
    `JOB_OPTIONS` to what the job was built with -- the value given, else
    the function's default, else None (the function does not take it)."""
    given = chosen.given()
    embedded = chosen.embedded
    try:
        params = inspect.signature(builder).parameters
    except (TypeError, ValueError):
        params = {}
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unused = [k for k in given if k not in params and not takes_all]
    if unused and not embedded:
        log.warning("the job function takes no %s; ignored",
                    ", ".join(f"--{k}" for k in unused))
    kwargs = {k: v for k, v in given.items() if k in params or takes_all}
    values = {k: kwargs.get(k, _default(params.get(k)))
              for k in JOB_OPTIONS}
    name = getattr(builder, "__qualname__", repr(builder))
    try:
        result = builder(**kwargs)
    except Exception as exc:
        raise JobBuildError(f"the job function {name} failed: "
                            f"{type(exc).__name__}: {first_line(exc)} "
                            "(--log-level DEBUG shows the traceback)") \
            from exc
    job, options = (result if isinstance(result, tuple) and len(result) == 2
                    else (result, {}))
    if not isinstance(job, Job):
        raise UsageError(
            f"--job: {name} returned {type(job).__name__}, not a Job (or "
            "(job, options))")
    if not isinstance(options, dict):
        raise UsageError("--job: the options a job function returns must be "
                         f"a dict, got {type(options).__name__}")
    return job, options, values


def _default(param):
    """A parameter's default if it is a plain value (what a checkpoint
    directory can record), else None."""
    if param is None or param.default is param.empty:
        return None
    value = param.default
    return value if isinstance(value, (int, float, str)) and \
        not isinstance(value, bool) else None


def job_nodes(job):
    return job.nodes()


def nodes_matching(option, pattern, nodes, literal=False):
    """The nodes of ``nodes`` that ``pattern`` matches (fnmatch; with
    ``literal``, the node of that name); a `UsageError` naming ``option``
    and the job's nodes when none does -- the command line's one wording
    of that mistake."""
    matched = [n for n in nodes if (n == pattern if literal else
                                    fnmatch.fnmatchcase(n, pattern))]
    if not matched:
        shown = ", ".join(nodes[:12]) + (", ..." if len(nodes) > 12 else "")
        raise UsageError(f"{option} {pattern!r} matches no node of the job "
                         f"(its nodes: {shown})")
    return matched


def first_line(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- the epoch limiter ------------------------------------------------------------

def limiter_counters(job):
    """``({node: [(counter blob, init_count)]}, only)``: the counters of
    the job's `epoch_limiter` stop conditions -- a counter made by the init
    group (``CreateCounter``, ``init_count`` = epochs - 1) and counted down
    by a stop condition of the epoch group (``CountDown``) -- and whether
    every stop condition is one of them (then a run stops only when its
    epochs are done)."""
    stops = {str(name) for output in job.stop_conditions
             for name in output.names}
    counted, limiting = set(), set()
    for task in job.epoch_group.tasks():
        for op in _ops(task.planned_step()):
            hit = stops.intersection(map(str, op.outputs))
            if op.type == "CountDown" and hit and op.inputs:
                counted.add(str(op.inputs[0]))
                limiting |= hit
    found = {}
    for task in job.init_group.tasks():
        for op in _ops(task.planned_step()):
            if op.type == "CreateCounter" and op.outputs and \
                    str(op.outputs[0]) in counted:
                found.setdefault(task.node, []).append(
                    (str(op.outputs[0]), int(op.args.get("init_count", 0))))
    return found, bool(found) and limiting == stops


def _ops(step):
    """Every op of a step (or net), depth first."""
    if isinstance(step, Net):
        yield from step.ops
    elif isinstance(step, ExecutionStep):
        for net in step.nets:
            yield from net.ops
        for sub in step.substeps:
            yield from _ops(sub)
