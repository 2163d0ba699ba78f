"""What ``python -m localcluster.run`` trains, and with which options.

`load_builder` finds the job function ``--job`` names (a module or a
file), `build_job` calls it with the options it takes and checks what it
returns; a checkpoint directory keeps the options its checkpoints were made
with (``localcluster-run.json``: `save_options`), which ``--resume``
restores and checks (`restore_options`); `check_paths` fails before
training on a path that cannot be written.  Problems are `UsageError`
(exit 2) or `JobBuildError` (exit 1), each one line.
"""

import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys

from .job import Job

__all__ = ["DEFAULT_JOB", "JOB_OPTIONS", "RUN_FILE", "UsageError",
           "JobBuildError", "load_builder", "build_job", "job_nodes",
           "first_line", "saved_options", "save_options", "restore_options",
           "check_paths"]

DEFAULT_JOB = "localcluster.examples.regression:build"
JOB_OPTIONS = ("nodes", "epochs", "seed", "threads")


log = logging.getLogger("localcluster.run")


class UsageError(Exception):
    """A bad command line: exit 2 with argparse's message."""


class JobBuildError(Exception):
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


def build_job(builder, args, embedded):
    """``(job, options)`` from the job function and the command line."""
    given = {k: getattr(args, k) for k in JOB_OPTIONS
             if getattr(args, k) is not None}
    try:
        params = inspect.signature(builder).parameters
        takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        params, takes_all = {}, False
    unused = [k for k in given if k not in params and not takes_all]
    if unused and not embedded:
        log.warning("the job function takes no %s; ignored",
                    ", ".join(f"--{k}" for k in unused))
    kwargs = {k: v for k, v in given.items() if k in params or takes_all}
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
            f"--job: {getattr(builder, '__qualname__', builder)} returned "
            f"{type(job).__name__}, not a Job (or (job, options))")
    if not isinstance(options, dict):
        raise UsageError("--job: the options a job function returns must be "
                         f"a dict, got {type(options).__name__}")
    return job, options


def job_nodes(job):
    nodes = []
    for _, group in job.printable_groups():
        for node in group.used_nodes():
            if node not in nodes:
                nodes.append(node)
    return nodes


def first_line(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- the options a checkpoint directory was made with --------------------------------

RUN_FILE = "localcluster-run.json"


def saved_options(directory):
    try:
        with open(os.path.join(directory, RUN_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def save_options(directory, args):
    saved = {"job": args.job or DEFAULT_JOB,
             **{k: getattr(args, k) for k in JOB_OPTIONS}}
    tmp = os.path.join(directory, RUN_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(saved, f, indent=1)
    os.replace(tmp, os.path.join(directory, RUN_FILE))


def restore_options(args, saved, directory):
    """Fill the job options the resumed run was not given from ``saved``;
    a different value is a usage error (the checkpoints hold that job)."""
    given_job = args.job or DEFAULT_JOB
    if args.job is not None and saved.get("job") not in (None, given_job):
        raise UsageError(
            f"--job {args.job} is not the job the checkpoints under "
            f"{directory} were made by ({saved['job']}); drop --job to "
            "resume it, or start over in a new --checkpoint-dir")
    if args.job is None and saved.get("job") != DEFAULT_JOB:
        args.job = saved.get("job")
    for key in JOB_OPTIONS:
        given, then = getattr(args, key), saved.get(key)
        if given is None:
            setattr(args, key, then)
        elif then is not None and given != then:
            raise UsageError(
                f"--{key} {given} differs from the --{key} {then} the "
                f"checkpoints under {directory} were made with; drop it to "
                "resume, or start over in a new --checkpoint-dir")


# -- checks before anything runs -------------------------------------------------------

def check_paths(args):
    """Fail now, not after training, on a checkpoint directory or a trace
    file that cannot be written."""
    directory = args.checkpoint_dir
    if directory is not None:
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise UsageError(f"--checkpoint-dir {directory} is not a "
                             "directory")
        if args.resume is not None and not os.path.isdir(directory):
            raise UsageError(f"--checkpoint-dir {directory} does not exist: "
                             "nothing to resume")
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--checkpoint-dir {directory} cannot be "
                             f"made: {exc.strerror}") from exc
        if not os.access(directory, os.W_OK | os.X_OK):
            raise UsageError(f"--checkpoint-dir {directory} is not "
                             "writable")
    if args.trace is not None:
        parent = os.path.dirname(os.path.abspath(args.trace))
        if os.path.isdir(args.trace) or not os.path.isdir(parent) or \
                not os.access(parent, os.W_OK):
            raise UsageError(f"--trace {args.trace} cannot be written (is "
                             "its directory there and writable?)")
