"""``python -m localcluster.run``: train a job on this machine, one process
per node, and show what every node is doing.

With no arguments it trains the embedded example
(`localcluster.examples.regression`: a reader, N trainers and a parameter
server); ``--job MODULE:FUNC`` or ``--job path/to/file.py:FUNC`` trains
yours.  A job function takes the options it names among ``nodes``,
``epochs``, ``seed`` and ``threads`` (only those given on the command line
are passed, except to the embedded job) and returns a `Job`, or
``(job, options)`` with ``options`` a dict of:

- ``metrics``: ``{name: TaskOutput}`` -- scalars shown after every epoch
  (one of a node prototype's task, a value per instance, as
  ``<name>_0`` ... ``<name>_<N-1>``);
- ``records``: how many records an epoch processes (for records/s);
- ``max_restarts``, ``on_checkpoint_error``: `JobRunner` options (the
  command line's win).

A run owns its checkpoint directory while it lives (`rundir.directory`:
a lock, another run's checkpoints refused, the options compared on
``--resume``); ``--resume`` starts from an epoch every node has
(`resume`); a failure is one line and where it happened
(`train.failure`); Ctrl-C, SIGTERM and SIGHUP stop the run cleanly and
are never lost (`signals`).  The options arrive typed (`options`), made
once from the parser (`args`).

Exit status: 0 on success; 1 when the job fails (one line naming the
node, and how to resume when another try may succeed); 2 on usage errors
(one line); 128 + the signal when stopped by one -- 130 for Ctrl-C, 143
for SIGTERM, 129 for SIGHUP (the last complete checkpoint stays; the line
printed says how to resume).
"""

import json
import logging
import os
import sys
import tempfile

from .. import printer
from ..errors import LocalClusterError
from .args import parser
from .cleanup import cleanup
from .conditions import resolve_session
from .cpus import apply_cpus
from .rundir.directory import (TEMP_PREFIX, DirLock, check_fresh,
                               discard_if_unused, make_dir, restore_options,
                               save_options, saved_options, sweep_leftovers)
from .jobspec import (RunFailure, UsageError, build_job, first_line,
                      job_nodes, load_builder, nodes_matching)
from .options import RunOptions
from ..plan.fault_text import fault_text
from ..plan.fault_types import Epoch, Hang
from .resume import checkpoint_manager, resume_epoch
from .signals import STOP, StopSignals, exit_status
from .train.loop import Run
from .outfile import OutputFile
from .train.trace import TraceFile

log = logging.getLogger("localcluster.run")

# -- entry points ----------------------------------------------------------------------

def main(argv=None, signals=None):
    """The command line; its exit status.  ``signals``: the process's
    `StopSignals` if installed already (else installed here, and the old
    handlers restored on return)."""
    own = signals is None
    signals = signals or StopSignals()
    signals.install()
    try:
        return _main(argv, signals)
    finally:
        if own:
            signals.restore()


def _main(argv, signals):
    if sys.stdout is None or sys.stderr is None:
        return _closed_stream()
    p = parser()
    try:
        signals.arm()
        opts = RunOptions.from_namespace(p.parse_args(argv))
        logging.basicConfig(level=getattr(logging, opts.log_level),
                            format="%(levelname)s %(name)s: %(message)s")
        try:
            return _command(opts, signals)
        except UsageError as exc:
            p.error(str(exc))
        except (RunFailure, LocalClusterError, OSError) as exc:
            log.debug("the run cannot go on", exc_info=True)
            message = str(exc) if isinstance(exc, RunFailure) else \
                first_line(exc)
            sys.stderr.write(f"error: {message}\n")
            if opts.json:
                _json({"job": opts.job.spec, "status": "error",
                       "error": message})
            return 1
    except KeyboardInterrupt as exc:  # before or after training
        signals.stopping()
        sys.stderr.write("interrupted\n")
        return exit_status(exc)


def _closed_stream():
    which = "output" if sys.stdout is None else "error"
    other = sys.stderr if sys.stdout is None else sys.stdout
    if other is not None:
        other.write(f"error: standard {which} is closed: this command "
                    "writes its progress and errors there; redirect it "
                    "(> FILE, or > /dev/null) instead of closing it\n")
    return 2


def _command(opts, signals):
    out = sys.stderr if opts.json else sys.stdout
    if opts.cleanup:
        return cleanup(opts.checkpoint_dir, opts.json, out)
    if opts.resume is not None and opts.checkpoint_dir is None:
        raise UsageError("--resume needs --checkpoint-dir (where the "
                         "checkpoints are)")
    if opts.resume is not None and opts.overwrite:
        raise UsageError("--overwrite starts over and --resume goes on: "
                         "give one of them")
    resolve_session(opts.session)
    if opts.print_plan:
        return _print_plan(opts)
    if opts.check is not None:
        # the testing kit is imported by the runs that check, not by all
        from .check import run_checks
        return run_checks(opts, out)
    trace = TraceFile(opts.trace) if opts.trace else None
    if opts.report is not None:
        OutputFile("--report", opts.report)  # writable, before any training
    given = opts.checkpoint_dir
    if given is not None:
        make_dir(given, opts.resume)
    directory = given or tempfile.mkdtemp(prefix=TEMP_PREFIX)
    lock = DirLock(directory).acquire()
    try:
        sweep_leftovers(directory)
        if opts.resume is not None:
            saved = saved_options(directory)
            if saved is not None:
                restore_options(opts.job, saved, directory)
        else:
            check_fresh(directory, opts.overwrite)
        job, options, values = _build(opts.job)
        _check_fault_nodes(opts.session.faults, job)
        for warning in fault_warnings(opts.session.faults,
                                      opts.session.timeout,
                                      values.get("epochs")):
            sys.stderr.write(f"warning: {warning}\n")
        apply_cpus(job, opts.session.cpus)
        manager = checkpoint_manager(directory, job)
        resume = None if opts.resume is None else resume_epoch(
            manager, opts.resume, job)
        save_options(directory, opts.job.spec, values)
        code, summary = Run(opts, job, options, out, manager, resume,
                            trace, signals, values).train()
    finally:
        lock.release()
        if given is None:
            discard_if_unused(directory)
    if opts.json:
        _json(summary)
    return code


def _check_fault_nodes(faults, job):
    for node in faults.nodes() if faults else ():
        nodes_matching("--faults", node, job_nodes(job), literal=True)


def fault_warnings(faults, timeout, epochs):
    """What to say before a run of ``faults`` that cannot do what it
    seems to: a hang with no ``--timeout`` (the run waits forever), a
    trigger at an epoch the run never reaches (the fault never fires)."""
    out = []
    for fault in faults or ():
        text = fault_text(fault)
        if isinstance(fault, Hang) and timeout is None:
            out.append(f"--faults {text!r} with no --timeout: the run will "
                       "wait for the hung node forever (Ctrl-C stops it); "
                       "give --timeout SECONDS to see it fail (or restart,"
                       " with --max-restarts)")
        at = getattr(fault, "at", None)
        k = at.k if isinstance(at, Epoch) else getattr(fault, "epoch", None)
        if epochs is not None and isinstance(k, int) and k > epochs:
            out.append(f"--faults {text!r}: the run trains {epochs} "
                       f"epoch(s), so epoch {k} is never reached and the "
                       "fault will not fire")
    return out


def _build(chosen):
    return build_job(load_builder(chosen.spec), chosen)


def _print_plan(opts):
    """Print the plan; nothing is made (a --resume's options are read)."""
    if opts.resume is not None and os.path.isdir(opts.checkpoint_dir):
        saved = saved_options(opts.checkpoint_dir)
        if saved is not None:
            restore_options(opts.job, saved, opts.checkpoint_dir)
    job, _, values = _build(opts.job)
    text = printer.to_string(job)
    if opts.json:
        _json({"job": opts.job.spec, "options": values,
               "nodes": job_nodes(job),
               "groups": {label: group.used_nodes()
                          for label, group in job.printable_groups()
                          if group.num_registered_tasks()},
               "plan": text.splitlines()})
    else:
        print(text)
    return 0


def _json(value):
    json.dump(value, sys.stdout, indent=1)
    sys.stdout.write("\n")
    sys.stdout.flush()


def command():
    """``python -m localcluster.run``: `main`, and every way out of it an
    exit status with at most one line -- never a traceback.  The package
    installed `STOP` before anything else was imported (a stop signal is
    noted from the first moment, never lost nor a traceback); installing
    it again here changes nothing."""
    signals = STOP
    signals.install()
    try:
        code = main(signals=signals)
    except BrokenPipeError:  # `... | head`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 1
    except SystemExit as exc:  # usage errors, --help
        code = exc.code
    except KeyboardInterrupt as exc:  # outside main's own handling
        signals.stopping()
        code = exit_status(exc)
    except Exception as exc:  # noqa: BLE001 -- a bug: one line, not a trace
        log.debug("unexpected error", exc_info=True)
        sys.stderr.write(f"error: unexpected {type(exc).__name__}: "
                         f"{first_line(exc)} (a bug in localcluster: "
                         "--log-level DEBUG shows the traceback; please "
                         "report it)\n")
        code = 1
    # A late Ctrl-C must not turn the status into a death by signal while
    # the interpreter shuts down.
    signals.exiting()
    return code

