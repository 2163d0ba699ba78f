"""One training run of ``python -m localcluster.run``: the session, the
`JobRunner` and what is shown of them -- the header, a line per epoch, and
the end: done, interrupted (every node stopped, how to resume) or failed
(the lines of `failure`).  Whatever the end, no partial checkpoint of
the run stays, and the trace (``--trace``) is written.
"""

import logging
import os
import platform
import sys
import time
import warnings

from ...errors import CheckpointWarning, LocalClusterError
from ...job import JobRunner
from ...sessions.kinds import KindNotInstalled, session_class
from ...task import TaskOutput
from ..version import __version__
from ...plan.faults import FaultPlan
from ..rundir.directory import is_run_file
from ..conditions import session_options
from .failure import describe, resume_hint
from ..jobspec import UsageError, job_nodes
from ..rundir.prune import prune
from .epochs import EpochWatch, prototype_metrics, short_names
from .logs import MasterLog, log_options
from ..rundir.metrics import MetricsLog, json_safe
from .progress import Progress, Usage
from ..signals import exit_status
from .trace import chrome_trace
from ...checkpoint.fileformat import PARTIAL, remove_partials_under
from ...checkpoint.state import Verdicts

__all__ = ["Run", "TEMP_KEEP_LAST"]

log = logging.getLogger("localcluster.run")

#: the complete epochs a run in the default temporary directory keeps:
#: what a resume needs (and the earlier files it refers to for blobs that
#: did not change); ``--cleanup`` removes it once the run has finished
TEMP_KEEP_LAST = 1


class Run:
    """One training run: ``train()`` gives ``(exit status, JSON summary)``.
    """

    def __init__(self, opts, job, options, out, manager, resume, trace,
                 signals, values=None):
        self.opts, self.job, self.options = opts, job, options
        #: the job options the job was built with (``epochs``: N of k/N)
        self.values = values or {}
        self.out, self.manager, self.resume = out, manager, resume
        self.trace, self.signals = trace, signals
        self.directory = manager.db_prefix
        self.nodes = job_nodes(job)
        self.summary = {"job": opts.job.spec,
                        "session": opts.session.kind, "nodes": self.nodes,
                        "checkpoint_dir": self.directory,
                        "master_pid": os.getpid(),
                        "resumed_from": resume, "epochs": [], "status": "ok"}
        self.started = time.time()
        # durations from the monotonic clock: a wall clock stepped back
        # mid-run must not make a run last a negative time.  The one start
        # of the run: the epoch lines' elapsed, the done line and the end
        # of metrics.jsonl all count from it
        self._began = time.monotonic()
        self.run_id = f"{self.started:.3f}-{os.getpid()}"
        self.metrics_log = None
        self.master_log = None
        #: the complete epochs a run keeps on disk (None: all) -- the
        #: default temporary directory keeps the last `TEMP_KEEP_LAST`
        self.keep_last = opts.keep_last if opts.keep_last is not None \
            else (TEMP_KEEP_LAST if opts.checkpoint_dir is None else None)
        #: the quick verdicts of the directory's files, kept from one
        #: prune to the next (each reads the new epoch's manifests only)
        self._verdicts = Verdicts()
        self.max_restarts = opts.max_restarts \
            if opts.max_restarts is not None \
            else options.get("max_restarts", 0)
        self.watch = self.runner = None

    def train(self):
        try:
            code, summary = self._run()
            if self.opts.report is not None and not self._write_report():
                if code == 0:
                    summary.update(status="error",
                                   error="the report was not written")
                    code = 1
            return code, summary
        finally:
            if self.master_log is not None:
                self.master_log.close()

    def _write_report(self):
        """``--report FILE``: the run's page, from its metrics.jsonl."""
        from ..report import write_report
        try:
            path = write_report(self.directory, self.opts.report)
        except (OSError, ValueError) as exc:
            self._err(f"error: --report {self.opts.report}: the report was "
                      f"not written ({exc})")
            return False
        line = f"  report: {path} (open it in a browser)"
        self.out.write(line + "\n")
        if self.master_log is not None:
            self.master_log.write(line)
        return True

    def _run(self):
        opts, metrics = self.opts, self.options.get("metrics") or {}
        bad = [k for k, v in metrics.items() if not isinstance(v, TaskOutput)]
        if bad:
            return self._failed(1, f"the job's metrics {bad} are not "
                                "TaskOutputs (task.add_output(blob) makes "
                                "one)")
        session_class = _session_class(opts.session.kind)
        kwargs = {"faults": opts.session.faults,
                  **session_options(opts.session, opts.job.seed,
                                     self.job),
                  **log_options(opts.logs, self.nodes,
                                in_process=opts.session.kind == "local")}
        if opts.logs.log_dir is not None:
            try:
                self.master_log = MasterLog(opts.logs.log_dir, self.nodes)
            except OSError as exc:
                raise UsageError(f"--log-dir {opts.logs.log_dir}: "
                                 f"{exc.strerror}; pick a writable "
                                 "directory") from None
        if opts.session.kind == "ray" and opts.session.ray_address:
            kwargs["address"] = opts.session.ray_address
        progress = self._header(session_class, kwargs)
        session = session_class(**kwargs)
        self._open_metrics(kwargs)
        try:
            session.trace_steps = self.trace is not None
            self.watch = EpochWatch(
                self.nodes, metrics, self.options.get("records"),
                Usage(session, self.nodes), progress, self.summary,
                self.resume, of=self.values.get("epochs"), verbose=opts.verbose,
                session=session, metrics_log=self.metrics_log,
                run_id=self.run_id, restarts=self._restarts,
                started=self._began,
                instances=prototype_metrics(self.job, metrics))
            self.runner = JobRunner(
                self.job, self.manager, resume_from_epoch=self.resume,
                max_restarts=self.max_restarts,
                timeout=opts.session.timeout,
                on_checkpoint_error=self.options.get("on_checkpoint_error",
                                                     "warn"),
                on_epoch=self._on_epoch)
            last = self._train(session, progress)
        except KeyboardInterrupt as exc:
            self._stop(session)
            return self._interrupted(exc, progress)
        except LocalClusterError as exc:
            self._stop(session)
            return self._error(exc)
        finally:
            session.close()
        return self._done(last, time.monotonic() - self._began, progress)

    def _on_epoch(self, report):
        """An epoch and its checkpoint are done: show and log it, then
        keep only the newest ``keep_last`` complete epochs on disk.  A
        stop signal waits until the epoch is shown and in metrics.jsonl
        (and one that came during the epoch stops the run here)."""
        with self.signals.deferred():
            self.watch.on_epoch(report)
        if self.keep_last is None or report.checkpoint_error is not None:
            return
        try:
            removed = prune(self.directory, self.keep_last,
                            nodes=self.job.nodes_to_checkpoint(),
                            verdicts=self._verdicts)
        except (OSError, LocalClusterError) as exc:
            log.warning("--keep-last: %s could not be pruned (%s); the run "
                        "goes on", self.directory, exc)
            return
        if removed:
            log.info("--keep-last %d: removed %s", self.keep_last,
                     ", ".join(removed))

    # -- metrics.jsonl ----------------------------------------------------------------

    def _restarts(self):
        return self.runner.result.restarts if self.runner else []

    def _open_metrics(self, kwargs):
        """Start this run's lines in ``metrics.jsonl`` (a directory where
        it cannot be written: the run goes on without it, warned)."""
        try:
            self.metrics_log = MetricsLog(self.directory)
        except OSError as exc:
            sys.stderr.write(f"warning: {self.directory}: metrics.jsonl "
                             f"cannot be written ({exc.strerror}); the run "
                             "goes on without its history\n")
            return
        options = self.opts.as_record()
        self.metrics_log.write({
            "kind": "run", "run": self.run_id, "time": self.started,
            "job": self.summary["job"], "session": self.opts.session.kind,
            "nodes": self.nodes, "epochs": self.values.get("epochs"),
            "resumed_from": self.resume, "master_pid": os.getpid(),
            "host": platform.node(), "version": __version__,
            "options": json_safe(options),
            "conditions": [str(c) for c in kwargs.get("conditions") or ()]})

    def _end_metrics(self, status, last=None, error=None, seconds=None):
        if self.metrics_log is None:
            return
        if self.watch is not None:
            self.watch.log_restarts()
        self.metrics_log.write({
            "kind": "end", "run": self.run_id, "time": time.time(),
            "status": status, "last_epoch": last,
            "seconds": time.monotonic() - self._began if seconds is None
            else seconds, "error": error})
        self.metrics_log.close()
        self.metrics_log = None

    def _resume_hint(self):
        return resume_hint(self.opts.session, self.opts.max_restarts,
                           self.directory)

    def _header(self, session_class, kwargs):
        opts, resume = self.opts, self.resume
        progress = Progress(self.out, live=self.out.isatty(),
                            copy=self.master_log)
        n = len(self.nodes)
        progress.line(f"localcluster: {n} node{'' if n == 1 else 's'} "
                      f"({short_names(self.nodes)}), {session_class.__name__}")
        if kwargs.get("conditions"):
            progress.line("  conditions: " + "; ".join(
                str(c) for c in kwargs["conditions"]))
        if kwargs.get("schedule") is not None:
            progress.line(f"  simulated: {kwargs['schedule']!r} -- epochs "
                          "show virtual time (a machine per node) beside "
                          "wall time")
        if opts.session.kind != "local":
            progress.line(f"  master pid {os.getpid()}; each node process is "
                          f"titled 'localcluster: <node> ({os.getpid()})' "
                          "(ps, top)")
        logs = opts.logs
        if logs.log_dir is not None:
            shown = ("every node's output" if logs.tee and not logs.log_nodes
                     else "no node output" if not logs.log_nodes else
                     "the output of " + ", ".join(logs.log_nodes))
            progress.line(f"  logs: {os.path.join(logs.log_dir, '<node>.log')}"
                          f" and {self.master_log.path} (the terminal shows "
                          f"{shown})")
        if opts.session.cpus:
            progress.line("  cpus: " + "; ".join(
                f"{pattern}={','.join(map(str, cpus))}"
                for pattern, cpus in opts.session.cpus))
        kept = ("" if self.keep_last is None else
                " (keeps the last " + (
                    "complete epoch" if self.keep_last == 1 else
                    f"{self.keep_last} complete epochs")
                + ("; --checkpoint-dir DIR keeps all" if
                   opts.checkpoint_dir is None and opts.keep_last is None
                   else "") + ")")
        progress.line(f"  checkpoints: {self.directory}{kept}"
                      + (f" (resuming from epoch {resume})"
                         if resume is not None else ""))
        if self.max_restarts and opts.session.kind == "local" and \
                opts.session.faults is None:
            progress.line("  note: --max-restarts does nothing under "
                          "--session local: a node there is a thread of "
                          "this process (only a --faults kill ends one)")
        if resume is not None and self.manager.epoch_is_final(resume):
            progress.line(f"  epoch {resume} is where this run stopped: "
                          "there is no epoch left to train")
        return progress

    def _train(self, session, progress):
        self.watch.usage.sample()
        saved = sys.stdout, sys.stderr
        # under --json stdout is for the summary alone: node output too
        shown = (sys.stderr if self.opts.json else sys.stdout), sys.stderr
        sys.stdout, sys.stderr = map(progress.guard, shown)
        progress.start_live(self.watch.live_text)
        try:
            with warnings.catch_warnings():
                # the runner's log line says it once; not again with the
                # warnings module's source line
                warnings.simplefilter("ignore", CheckpointWarning)
                last = self.runner.train(session)
        finally:
            progress.stop_live()
            sys.stdout, sys.stderr = saved
        self.signals.check()  # a signal whose exception was swallowed
        self.watch.usage.sample()
        return last

    def _stop(self, session):
        """After an interrupt or a failure: every node stopped, and no
        partial checkpoint of ours left.  No later signal cuts it short."""
        self.signals.stopping()
        session.close()
        remove_partials_under(self.directory)

    def _interrupted(self, exc, progress):
        latest = self._latest()
        self._show_unreported(latest)
        message = ("interrupted; every node stopped; " + (
            f"the last complete checkpoint is epoch {latest}"
            if latest is not None else "no checkpoint was complete yet"))
        progress.line(message)
        if latest is not None:
            progress.line("resume with: "
                          + self._resume_hint())
        self._write_trace()
        return self._failed(exit_status(exc), message, "interrupted",
                            latest=latest)

    def _show_unreported(self, latest):
        """An epoch whose checkpoint is complete (``latest``) but that the
        stop came too early to show -- it landed while the checkpoint was
        being written, or right after: shown and recorded now, so that the
        history and the checkpoints agree."""
        report = self.runner.result.unreported if self.runner else None
        if report is None or self.watch is None or \
                report.epoch != latest or report.epoch <= self.watch.epoch:
            return
        self.watch.on_epoch(report, stopped=True)

    def _error(self, exc):
        failure = describe(exc, self.max_restarts, self.opts.session.timeout,
                           self.opts.log_level == "DEBUG")
        latest = None if failure.recurs else self._latest()
        hint = (f"; resume with: {self._resume_hint()}"
                if latest is not None else "")
        self._err(f"error: {failure.line}{hint}")
        for line in failure.details:
            self._err(line)
        self._write_trace()
        return self._failed(1, failure.line, latest=latest,
                            node=getattr(exc, "node", None), quiet=True)

    def _unsaved_text(self, last):
        """What the done line adds when checkpoints were not written: what
        a resume could start from."""
        if not self.runner.result.checkpoint_errors:
            return ""
        latest = self._latest()
        if latest is None:
            return "; no checkpoint was written: nothing can be resumed"
        if latest != last:
            return f"; the last complete checkpoint is epoch {latest}"
        return ""

    def _latest(self):
        try:
            return self.manager.get_resume_from_epoch_id()
        except LocalClusterError:
            return None

    def _failed(self, code, message, status="error", quiet=False, **extra):
        self.summary.update(status=status, error=message, **extra)
        self._end_metrics(status, extra.get("latest"), message)
        self._add_pids()
        if status == "error" and not quiet:
            self._err(f"error: {message}")
        return code, self.summary

    def _write_trace(self):
        """The trace of what ran; True if written (or not asked for)."""
        if self.trace is None:
            return True
        epochs = self.runner.result.epochs if self.runner else []
        saves = self.watch.saves if self.watch else []
        pids = dict(self.watch.pids if self.watch else {},
                    runner=os.getpid())
        try:
            self.trace.write(chrome_trace(self.nodes, epochs, saves, pids))
        except OSError as exc:
            self._err(f"error: {exc}")
            return False
        return True

    def _done(self, last, seconds, progress):
        summary, runner, usage = self.summary, self.runner, self.watch.usage
        summary.update(
            last_epoch=last, seconds=seconds,
            checkpoints=sorted(
                os.path.join(self.directory, f)
                for f in os.listdir(self.directory)
                if PARTIAL not in f and not is_run_file(f)),
            node_usage={n: {"peak_rss_bytes": usage.peak_rss.get(n) or None,
                            "cpu_seconds": round(
                                usage.cpu_seconds.get(n, 0.0), 3)}
                        for n in usage.peak_rss},
            checkpoint_errors=[{"epoch": e, "message": m}
                               for e, m in runner.result.checkpoint_errors],
            restarts=[{"resumed_from": e, "error": m}
                      for e, m in runner.result.restarts])
        self._add_pids()
        self._end_metrics("ok", last, seconds=seconds)
        progress.line(self.watch.done_line(last, seconds, self.directory)
                      + self._unsaved_text(last))
        if self.opts.session.faults is not None:
            fired = self.opts.session.faults.fired()
            summary["faults_fired"] = [
                {"fault": str(FaultPlan(f.fault)), "node": f.node,
                 "time": f.time} for f in fired]
            progress.line(f"  faults fired: {len(fired)} of "
                          f"{len(self.opts.session.faults)}" + "".join(
                              f"; {FaultPlan(f.fault)}" for f in fired))
        if not self._write_trace():
            summary.update(status="error", error="the trace was not written")
            return 1, summary
        if self.trace is not None:
            progress.line(f"  trace: {self.trace.path} (open in "
                          "chrome://tracing or ui.perfetto.dev)")
        return 0, summary


    def _err(self, text):
        """A line on stderr (and in ``--log-dir``'s master.log)."""
        sys.stderr.write(text + "\n")
        if self.master_log is not None:
            self.master_log.write(text)

    def _add_pids(self):
        """``node_pids`` in the summary: the process each node last ran an
        epoch in (``--session local``: this process)."""
        if self.watch is not None:
            self.summary["node_pids"] = {n: self.watch.pids.get(n)
                                         for n in self.nodes}


def _session_class(kind):
    """The session class of ``--session``."""
    try:
        return session_class(kind)
    except KindNotInstalled as exc:
        raise UsageError(f"--session {kind}: {exc}") from None
