"""``python -m localcluster.run``: train a job on this machine, one process
per node, and show what every node is doing.

With no arguments it trains the embedded example
(`localcluster.examples.regression`: a reader, N trainers and a parameter
server); ``--job MODULE:FUNC`` or ``--job path/to/file.py:FUNC`` trains
yours.  A job function takes the options it names among ``nodes``,
``epochs``, ``seed`` and ``threads`` (only those given on the command line
are passed, except to the embedded job) and returns a `Job`, or
``(job, options)`` with ``options`` a dict of:

- ``metrics``: ``{name: TaskOutput}`` -- scalars shown after every epoch;
- ``records``: how many records an epoch processes (for records/s);
- ``max_restarts``, ``on_checkpoint_error``: `JobRunner` options (the
  command line's win).

Exit status: 0 on success, 1 when the job fails (one line naming the node,
and how to resume), 2 on usage errors, 130 when interrupted (the last
complete checkpoint stays; the line printed says how to resume).
"""

import argparse
import json
import logging
import os
import shlex
import signal
import sys
import tempfile
import time

from . import (JobRunner, LocalClusterError, LocalHostScheduler,
               LocalSession, MultiNodeCheckpointManager, TaskOutput, printer)
from ._runjob import (DEFAULT_JOB, RUN_FILE, JobBuildError,
                      UsageError, build_job, check_paths, first_line,
                      job_nodes, load_builder, restore_options, save_options,
                      saved_options)
from ._runreport import Progress, Usage, chrome_trace, mib, scalar
from .checkpoint_file import remove_partials_under
from .runtime import shm

log = logging.getLogger("localcluster.run")


# -- the command line ----------------------------------------------------------------

def _at_least(low):
    """An argparse type: a whole number >= ``low``."""
    def convert(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    convert.__name__ = f"whole number >= {low}"
    return convert


_positive, _non_negative = _at_least(1), _at_least(0)


def _resume(text):
    return "latest" if text == "latest" else _non_negative(text)


def parser():
    p = argparse.ArgumentParser(
        prog="python -m localcluster.run",
        description="Train a job on this machine, one process per node "
                    "(default: the embedded parameter-server regression).")
    p.add_argument("--job", metavar="MODULE:FUNC",
                   help="your job: MODULE:FUNC or path/to/file.py:FUNC, a "
                        "function returning a Job (or (job, options))")
    p.add_argument("--nodes", type=_positive,
                   help="trainer nodes (default 2 for the embedded job)")
    p.add_argument("--epochs", type=_positive,
                   help="epochs to train (default 5 for the embedded job)")
    p.add_argument("--seed", type=_non_negative,
                   help="seed of the job's data (default 0)")
    p.add_argument("--threads", type=_positive,
                   help="hogwild threads per trainer (default 2; 1 makes a "
                        "run bit-for-bit repeatable)")
    p.add_argument("--session", choices=("localhost", "local"),
                   default="localhost",
                   help="one process per node (default) or all in-process")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="where every node checkpoints every epoch (default: "
                        "a fresh temporary directory, printed)")
    p.add_argument("--resume", nargs="?", const="latest", type=_resume,
                   metavar="EPOCH",
                   help="resume from EPOCH's checkpoint (no number: the "
                        "latest complete one); needs --checkpoint-dir")
    p.add_argument("--max-restarts", type=_non_negative, default=None,
                   metavar="K",
                   help="restart a dead node and resume from the last "
                        "checkpoint up to K times (default 0)")
    p.add_argument("--print-plan", action="store_true",
                   help="print the job's plan and exit")
    p.add_argument("--trace", metavar="FILE",
                   help="write a Chrome trace (chrome://tracing, Perfetto): "
                        "one track per node, spans for epochs, tasks, steps")
    p.add_argument("--json", action="store_true",
                   help="print one JSON summary on stdout (the progress "
                        "lines go to stderr)")
    p.add_argument("--log-level", default="WARNING",
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="logging level (default WARNING)")
    p.add_argument("--cleanup", action="store_true",
                   help="remove shared-memory segments left by killed runs, "
                        "report them, and exit")
    return p


# -- running ---------------------------------------------------------------------------

class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP: stopped like Ctrl-C (every node stopped, the
    last checkpoint kept), then exit 128 + the signal number."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_on(signum, frame):
    raise Interrupted(signum)


class _QuietSignals:
    """While cleaning up after an interrupt, a second Ctrl-C (or SIGTERM)
    must not cut the cleanup short: ignore them, then restore."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self._old = [signal.signal(s, signal.SIG_IGN) for s in self.SIGNALS]

    def __exit__(self, *exc):
        for s, old in zip(self.SIGNALS, self._old):
            signal.signal(s, old)


def _exit_status(exc):
    return 128 + exc.signum if isinstance(exc, Interrupted) else 130


def _resume_hint(args, checkpoint_dir):
    """The command that resumes: the job's options come back from the
    checkpoint directory's run file, so only the run's own are repeated."""
    parts = []
    if args.session != "localhost":
        parts += ["--session", args.session]
    if args.max_restarts:
        parts += ["--max-restarts", str(args.max_restarts)]
    parts += ["--checkpoint-dir", checkpoint_dir, "--resume"]
    return "python -m localcluster.run " + " ".join(shlex.quote(p)
                                                   for p in parts)


def cleanup(out, as_json):
    removed = shm.sweep_stale()
    if as_json:
        json.dump({"removed": [f"/dev/shm/{n}" for n in removed]},
                  sys.stdout)
        sys.stdout.write("\n")
    elif removed:
        out.write(f"removed {len(removed)} stale shared-memory segment(s) "
                  "of runs that are gone:\n")
        for name in removed:
            out.write(f"  /dev/shm/{name}\n")
    else:
        out.write("no stale shared-memory segments\n")
    return 0


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(levelname)s %(name)s: %(message)s")
    out = sys.stderr if args.json else sys.stdout
    if args.cleanup:
        return cleanup(out, args.json)
    if args.resume is not None and args.checkpoint_dir is None:
        p.error("--resume needs --checkpoint-dir (where the checkpoints are)")
    old = {s: signal.signal(s, _stop_on)
           for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            check_paths(args)
            if args.resume is not None:
                saved = saved_options(args.checkpoint_dir)
                if saved is not None:
                    restore_options(args, saved, args.checkpoint_dir)
            builder = load_builder(args.job or DEFAULT_JOB)
            job, options = build_job(builder, args, args.job is None)
        except UsageError as exc:
            p.error(str(exc))
        except JobBuildError as exc:
            log.debug("the job function failed", exc_info=True)
            sys.stderr.write(f"error: {exc}\n")
            return 1
        if args.print_plan:
            print(printer.to_string(job))
            return 0
        stdout = sys.stdout
        if args.json:  # stdout is for the summary alone: node output too
            sys.stdout = sys.stderr
        try:
            code, summary = train(args, job, options, out)
        finally:
            sys.stdout = stdout
        if args.json:
            json.dump(summary, sys.stdout, indent=1)
            sys.stdout.write("\n")
        return code
    except KeyboardInterrupt as exc:  # before or after training
        sys.stderr.write("interrupted\n")
        return _exit_status(exc)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def train(args, job, options, out):
    """Train ``job``; ``(exit status, JSON summary)``."""
    metrics = options.get("metrics") or {}
    nodes = job_nodes(job)
    checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(
        prefix="localcluster-ckpt-")
    summary = {"job": args.job or DEFAULT_JOB, "session": args.session,
               "nodes": nodes, "checkpoint_dir": checkpoint_dir,
               "resumed_from": None, "epochs": [], "status": "ok"}
    bad = [k for k, v in metrics.items() if not isinstance(v, TaskOutput)]
    if bad:
        return _failed(summary, 1, f"the job's metrics {bad} are not "
                       "TaskOutputs (task.add_output(blob) makes one)")
    manager = MultiNodeCheckpointManager(checkpoint_dir)
    resume = args.resume
    if resume == "latest":
        resume = manager.get_resume_from_epoch_id()
        if resume is None:
            return _failed(summary, 1, f"no complete checkpoint under "
                           f"{checkpoint_dir} to resume from; run without "
                           "--resume to start over")
    summary["resumed_from"] = resume
    if resume is None:
        save_options(checkpoint_dir, args)
    max_restarts = args.max_restarts if args.max_restarts is not None \
        else options.get("max_restarts", 0)
    session_class = LocalHostScheduler if args.session == "localhost" \
        else LocalSession
    progress = Progress(out, live=out.isatty())
    progress.line(f"localcluster: {len(nodes)} node"
                  f"{'' if len(nodes) == 1 else 's'} ({', '.join(nodes)}), "
                  f"{session_class.__name__}")
    progress.line(f"  checkpoints: {checkpoint_dir}"
                  + (f" (resuming from epoch {resume})"
                     if resume is not None else ""))
    if max_restarts and args.session == "local":
        progress.line("  note: --max-restarts does nothing under --session "
                      "local: a node there is a thread of this process")
    if resume is not None and manager.epoch_is_final(resume):
        progress.line(f"  epoch {resume} is where this run stopped: there is "
                      "no epoch left to train")
    started = time.monotonic()
    session = session_class()
    session.trace_steps = bool(args.trace)
    watch = _EpochWatch(args, nodes, metrics, options, Usage(session, nodes),
                        progress, summary, resume)
    runner = JobRunner(
        job, manager, resume_from_epoch=resume, max_restarts=max_restarts,
        on_checkpoint_error=options.get("on_checkpoint_error", "warn"),
        on_epoch=watch.on_epoch)
    try:
        watch.usage.sample()
        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = map(progress.guard, streams)
        progress.start_live(watch.live_text)
        try:
            last = runner.train(session)
        finally:
            progress.stop_live()
            sys.stdout, sys.stderr = streams
        watch.usage.sample()
    except KeyboardInterrupt as exc:
        with _QuietSignals():
            session.close()
            remove_partials_under(checkpoint_dir)
        latest = manager.get_resume_from_epoch_id()
        message = ("interrupted; every node stopped; " + (
            f"the last complete checkpoint is epoch {latest}"
            if latest is not None else "no checkpoint was complete yet"))
        progress.line(message)
        if latest is not None:
            progress.line(f"resume with: {_resume_hint(args, checkpoint_dir)}")
        return _failed(summary, _exit_status(exc), message, "interrupted",
                       latest=latest)
    except LocalClusterError as exc:
        with _QuietSignals():
            session.close()
            remove_partials_under(checkpoint_dir)
        latest = manager.get_resume_from_epoch_id()
        hint = (f"; resume with: {_resume_hint(args, checkpoint_dir)}"
                if latest is not None else "")
        sys.stderr.write(f"error: {first_line(exc)}{hint}\n")
        return _failed(summary, 1, first_line(exc), latest=latest,
                       node=getattr(exc, "node", None))
    finally:
        session.close()
    return 0, _finish(args, summary, watch, runner, last,
                      time.monotonic() - started, progress)


def _failed(summary, code, message, status="error", **extra):
    summary.update(status=status, error=message, **extra)
    if status == "error" and "latest" not in extra:
        sys.stderr.write(f"error: {message}\n")
    return code, summary


def _finish(args, summary, watch, runner, last, seconds, progress):
    checkpoint_dir = summary["checkpoint_dir"]
    summary.update(
        last_epoch=last, seconds=seconds,
        checkpoints=sorted(os.path.join(checkpoint_dir, f)
                           for f in os.listdir(checkpoint_dir)
                           if ".partial-" not in f and f != RUN_FILE),
        node_usage={n: {"peak_rss_bytes": watch.usage.peak_rss.get(n) or
                        None,
                        "cpu_seconds": round(
                            watch.usage.cpu_seconds.get(n, 0.0), 3)}
                    for n in watch.usage.peak_rss},
        checkpoint_errors=[{"epoch": e, "message": m}
                           for e, m in runner.result.checkpoint_errors],
        restarts=[{"resumed_from": e, "error": m}
                  for e, m in runner.result.restarts])
    if args.trace:
        tmp = args.trace + ".tmp"
        with open(tmp, "w") as f:
            json.dump(chrome_trace(summary["nodes"], runner.result.epochs,
                                   watch.saves), f)
        os.replace(tmp, args.trace)
    final = summary["epochs"][-1]["metrics"] if summary["epochs"] else {}
    text = f"done: epoch {last} in {seconds:.2f} s"
    first = watch.first_loss
    if final.get("loss") is not None and first is not None:
        drop = first / final["loss"] if final["loss"] else float("inf")
        text += (f"; loss {first:.4g} -> {final['loss']:.4g} "
                 f"({drop:.0f}x lower)")
    progress.line(text + f"; checkpoints in {checkpoint_dir}")
    if args.trace:
        progress.line(f"  trace: {args.trace} (open in chrome://tracing or "
                      "ui.perfetto.dev)")
    return summary


class _EpochWatch:
    """The runner's ``on_epoch``: fetches the metrics, samples the nodes,
    prints the epoch's line and records it for the summary and trace."""

    def __init__(self, args, nodes, metrics, options, usage, progress,
                 summary, resume):
        self.nodes, self.metrics, self.usage = nodes, metrics, usage
        self.records = options.get("records")
        self.progress, self.summary = progress, summary
        self.saves, self.first_loss = [], None
        self.epoch, self.since = resume or 0, time.monotonic()

    def live_text(self):
        return (f"epoch {self.epoch + 1} running ... "
                f"{time.monotonic() - self.since:.1f} s")

    def on_epoch(self, report):
        values = {k: scalar(v.fetch()) for k, v in self.metrics.items()}
        per_node = self.usage.sample()
        rate = self.records / report.seconds if self.records and \
            report.seconds > 0 else None
        self.summary["epochs"].append({
            "epoch": report.epoch, "seconds": report.seconds,
            "checkpoint_seconds": report.checkpoint_seconds,
            "metrics": values, "records_per_s": rate,
            "nodes": {n: dict(per_node.get(n, {}),
                              seconds=report.node_seconds.get(n))
                      for n in self.nodes},
            "processes": per_node,
            "checkpoint_error": report.checkpoint_error})
        self.saves.append((report.epoch, report.started + report.seconds,
                           report.checkpoint_seconds))
        self.epoch, self.since = report.epoch, time.monotonic()
        if self.first_loss is None and values.get("loss") is not None:
            self.first_loss = values["loss"]
        shown = "  ".join(
            f"{k} {'n/a' if v is None else format(v, '.4g')}"
            for k, v in sorted(values.items(), key=lambda kv: kv[0] != "loss"))
        rate_text = f"  {rate:,.0f} rec/s" if rate else ""
        node_text = "  ".join(
            f"{n} {u['cpu_percent']:.0f}% {mib(u['rss_bytes'])}"
            if u.get("cpu_percent") is not None
            else f"{n} {mib(u['rss_bytes'])}"
            for n, u in per_node.items())
        self.progress.line(f"epoch {report.epoch:>3}  {report.seconds:7.3f} s"
                           f"  {shown}{rate_text}  | {node_text}")


def _main():
    try:
        return main()
    except BrokenPipeError:  # `... | head`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(_main())
