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
import importlib
import importlib.util
import inspect
import json
import logging
import os
import shlex
import sys
import tempfile
import threading
import time

import numpy as np
import psutil

from . import (Job, JobRunner, LocalClusterError, LocalHostScheduler,
               LocalSession, MultiNodeCheckpointManager, TaskOutput, printer)
from .checkpoint_file import remove_partials
from .runtime import shm

DEFAULT_JOB = "localcluster.examples.regression:build"
JOB_OPTIONS = ("nodes", "epochs", "seed", "threads")

log = logging.getLogger("localcluster.run")


class UsageError(Exception):
    """A bad command line: exit 2 with argparse's message."""


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
    result = builder(**kwargs)
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


# -- watching the nodes --------------------------------------------------------------

def _peak_rss(pid):
    """Peak resident set size of ``pid`` in bytes (Linux VmHWM), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class Usage:
    """CPU and memory of every node process, sampled after each epoch."""

    def __init__(self, session, nodes):
        self.session, self.nodes = session, nodes
        self._last = {}          # node -> (pid, cpu seconds, wall time)
        self.cpu_seconds = {n: 0.0 for n in nodes}
        self.peak_rss = {n: 0 for n in nodes}

    def _pids(self):
        if isinstance(self.session, LocalHostScheduler):
            return self.session.node_pids()
        return {node: os.getpid() for node in self.nodes}

    def sample(self):
        """``{node: {"cpu_percent", "rss_bytes"}}`` since the last sample."""
        now, out = time.monotonic(), {}
        for node, pid in self._pids().items():
            try:
                proc = psutil.Process(pid)
                times = proc.cpu_times()
                cpu = times.user + times.system
                rss = proc.memory_info().rss
            except psutil.Error:
                continue
            last_pid, last_cpu, last_time = self._last.get(
                node, (None, 0.0, None))
            if last_pid != pid:  # new (or restarted): since it started
                last_cpu, last_time = 0.0, _started(proc, now)
            spent = cpu - last_cpu
            self.cpu_seconds[node] = self.cpu_seconds.get(node, 0.0) + spent
            self.peak_rss[node] = max(self.peak_rss.get(node, 0),
                                      _peak_rss(pid) or rss)
            wall = None if last_time is None else now - last_time
            out[node] = {"cpu_percent": (round(100 * spent / wall, 1)
                                         if wall else None),
                         "rss_bytes": rss}
            self._last[node] = (pid, cpu, now)
        return out


def _started(proc, now):
    """``proc``'s start on the time.monotonic clock (None if unknown)."""
    try:
        return now - max(0.0, time.time() - proc.create_time())
    except psutil.Error:
        return None


def _scalar(value):
    array = np.asarray(value, dtype=float)
    return float(array.ravel()[0]) if array.size == 1 else \
        float(array.mean())


def _mib(n):
    return f"{n / (1 << 20):.0f}M"


class Progress:
    """What the run prints: a header, a line per epoch, a live line on a
    terminal, and the summary (to stderr under ``--json``)."""

    def __init__(self, out, live):
        self.out, self.live = out, live
        self._status, self._lock = "", threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def line(self, text):
        with self._lock:
            if self._status:
                self.out.write("\r\033[K")
                self._status = ""
            self.out.write(text + "\n")
            self.out.flush()

    def start_live(self, what):
        if not self.live:
            return
        started = time.monotonic()

        def tick():
            while not self._stop.wait(0.25):
                with self._lock:
                    self._status = (f"  {what()} ... "
                                    f"{time.monotonic() - started:.1f} s")
                    self.out.write("\r\033[K" + self._status)
                    self.out.flush()
        self._thread = threading.Thread(target=tick, daemon=True)
        self._thread.start()

    def stop_live(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1)
        with self._lock:
            if self._status:
                self.out.write("\r\033[K")
                self.out.flush()
                self._status = ""


# -- the trace -------------------------------------------------------------------------

def chrome_trace(nodes, epochs, saves):
    """Chrome trace-event JSON: the runner and every node a process (a
    track); epochs and checkpoints on the runner's, each node's part of an
    epoch and its steps (a thread per executor thread) on the node's."""
    pids = {"runner": 0, **{node: i + 1 for i, node in enumerate(nodes)}}
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
               "args": {"name": name}} for name, pid in pids.items()]
    tids = {}

    def tid(node, thread):
        key = (node, thread)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == node]) + 1
            events.append({"ph": "M", "name": "thread_name",
                           "pid": pids[node], "tid": tids[key],
                           "args": {"name": thread}})
        return tids[key]

    def span(name, cat, pid, thread_id, start, seconds, args=None):
        events.append({"name": name, "cat": cat, "ph": "X", "pid": pid,
                       "tid": thread_id, "ts": round(start * 1e6, 1),
                       "dur": round(max(seconds, 0) * 1e6, 1),
                       "args": args or {}})

    for report in epochs:
        span(f"epoch {report.epoch}", "epoch", 0, 0, report.started,
             report.seconds, {"stopped": report.stopped})
        for node, seconds in report.node_seconds.items():
            if node in pids:
                span(f"epoch {report.epoch}", "task", pids[node], 0,
                     report.started, seconds)
        for node, spans in (report.trace or {}).items():
            if node not in pids:
                continue
            for name, task, thread, start, end in spans:
                span(name, "step", pids[node], tid(node, thread), start,
                     end - start, {"task": task})
    for epoch, started, seconds in saves:
        span(f"checkpoint {epoch}", "checkpoint", 0, 0, started, seconds)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# -- running ---------------------------------------------------------------------------

def _first_line(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _resume_hint(args, checkpoint_dir):
    parts = []
    if args.job:
        parts += ["--job", args.job]
    for option in JOB_OPTIONS:
        value = getattr(args, option)
        if value is not None:
            parts += [f"--{option}", str(value)]
    if args.session != "localhost":
        parts += ["--session", args.session]
    parts += ["--checkpoint-dir", checkpoint_dir, "--resume"]
    return "python -m localcluster.run " + " ".join(shlex.quote(p)
                                                   for p in parts)


def _remove_all_partials(directory):
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if ".partial-" in name:
            base = name.split(".partial-")[0]
            removed += remove_partials(os.path.join(directory, base))
    return removed


def cleanup(out):
    removed = shm.sweep_stale()
    if removed:
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
        return cleanup(out)
    if args.resume is not None and args.checkpoint_dir is None:
        p.error("--resume needs --checkpoint-dir (where the checkpoints are)")
    embedded = args.job is None
    try:
        builder = load_builder(args.job or DEFAULT_JOB)
        job, options = build_job(builder, args, embedded)
    except UsageError as exc:
        p.error(str(exc))
    if args.print_plan:
        print(printer.to_string(job))
        return 0
    return train(args, job, options, out)


def train(args, job, options, out):
    metrics = options.get("metrics") or {}
    bad = [k for k, v in metrics.items() if not isinstance(v, TaskOutput)]
    if bad:
        out.write(f"error: job metrics {bad} are not TaskOutputs\n")
        return 2
    nodes = job_nodes(job)
    checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(
        prefix="localcluster-ckpt-")
    manager = MultiNodeCheckpointManager(checkpoint_dir)
    resume = args.resume
    if resume == "latest":
        resume = manager.get_resume_from_epoch_id()
        if resume is None:
            out.write(f"error: no complete checkpoint under {checkpoint_dir} "
                      "to resume from; run without --resume to start over\n")
            return 1
    max_restarts = args.max_restarts if args.max_restarts is not None \
        else options.get("max_restarts", 0)
    session_class = LocalHostScheduler if args.session == "localhost" \
        else LocalSession
    progress = Progress(out, live=out.isatty())
    progress.line(f"localcluster: {len(nodes)} nodes ({', '.join(nodes)}), "
                  f"{session_class.__name__}")
    progress.line(f"  checkpoints: {checkpoint_dir}"
                  + (f" (resuming from epoch {resume})"
                     if resume is not None else ""))
    summary = {"job": args.job or DEFAULT_JOB, "session": args.session,
               "nodes": nodes, "checkpoint_dir": checkpoint_dir,
               "resumed_from": resume, "epochs": []}
    first_loss, saves, started = None, [], time.monotonic()
    session = session_class()
    usage = Usage(session, nodes)
    state = {"epoch": resume or 0}
    try:
        session.trace_steps = bool(args.trace)

        def on_epoch(report):
            nonlocal first_loss
            values = {k: _scalar(v.fetch()) for k, v in metrics.items()}
            per_node = usage.sample()
            records = options.get("records")
            rate = records / report.seconds if records and \
                report.seconds > 0 else None
            entry = {"epoch": report.epoch, "seconds": report.seconds,
                     "checkpoint_seconds": report.checkpoint_seconds,
                     "metrics": values, "records_per_s": rate,
                     "nodes": {n: dict(per_node.get(n, {}),
                                       seconds=report.node_seconds.get(n))
                               for n in nodes},
                     "checkpoint_error": report.checkpoint_error}
            summary["epochs"].append(entry)
            saves.append((report.epoch, report.started + report.seconds,
                          report.checkpoint_seconds))
            state["epoch"] = report.epoch
            if first_loss is None and "loss" in values:
                first_loss = values["loss"]
            shown = "  ".join(f"{k} {v:.4g}" for k, v in sorted(
                values.items(), key=lambda kv: kv[0] != "loss"))
            rate_text = f"  {rate:,.0f} rec/s" if rate else ""
            node_text = "  ".join(
                f"{n} {u['cpu_percent']:.0f}% {_mib(u['rss_bytes'])}"
                if u.get("cpu_percent") is not None
                else f"{n} {_mib(u['rss_bytes'])}"
                for n, u in per_node.items())
            progress.line(f"epoch {report.epoch:>3}  {report.seconds:7.3f} s"
                          f"  {shown}{rate_text}  | {node_text}")

        runner = JobRunner(
            job, manager, resume_from_epoch=resume,
            max_restarts=max_restarts,
            on_checkpoint_error=options.get("on_checkpoint_error", "warn"),
            on_epoch=on_epoch)
        usage.sample()
        progress.start_live(lambda: f"epoch {state['epoch'] + 1} running")
        try:
            last = runner.train(session)
        finally:
            progress.stop_live()
        usage.sample()
    except KeyboardInterrupt:
        session.close()
        _remove_all_partials(checkpoint_dir)
        latest = manager.get_resume_from_epoch_id()
        progress.line(
            f"interrupted during epoch {state['epoch'] + 1}; every node "
            "stopped" + (f"; the last complete checkpoint is epoch {latest}"
                         if latest is not None else "; no complete "
                         "checkpoint yet"))
        if latest is not None:
            progress.line(f"resume with: {_resume_hint(args, checkpoint_dir)}")
        return 130
    except LocalClusterError as exc:
        session.close()
        _remove_all_partials(checkpoint_dir)
        latest = manager.get_resume_from_epoch_id()
        hint = (f"; resume with: {_resume_hint(args, checkpoint_dir)}"
                if latest is not None else "")
        sys.stderr.write(f"error: {_first_line(exc)}{hint}\n")
        return 1
    finally:
        session.close()
    seconds = time.monotonic() - started
    summary.update(
        last_epoch=last, seconds=seconds,
        checkpoints=sorted(os.path.join(checkpoint_dir, f)
                           for f in os.listdir(checkpoint_dir)
                           if ".partial-" not in f),
        node_usage={n: {"peak_rss_bytes": usage.peak_rss.get(n) or None,
                        "cpu_seconds": round(usage.cpu_seconds.get(n, 0.0),
                                             3)}
                    for n in nodes},
        checkpoint_errors=[{"epoch": e, "message": m}
                           for e, m in runner.result.checkpoint_errors],
        restarts=[{"resumed_from": e, "error": m}
                  for e, m in runner.result.restarts],
        status="ok")
    if args.trace:
        with open(args.trace, "w") as f:
            json.dump(chrome_trace(nodes, runner.result.epochs, saves), f)
    final = summary["epochs"][-1]["metrics"] if summary["epochs"] else {}
    text = f"done: epoch {last} in {seconds:.2f} s"
    if "loss" in final and first_loss is not None:
        drop = first_loss / final["loss"] if final["loss"] else float("inf")
        text += (f"; loss {first_loss:.4g} -> {final['loss']:.4g} "
                 f"({drop:.0f}x lower)")
    progress.line(text + f"; checkpoints in {checkpoint_dir}")
    if args.trace:
        progress.line(f"  trace: {args.trace} (open in chrome://tracing or "
                      "ui.perfetto.dev)")
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        sys.stdout.write("\n")
    return 0


def _main():
    try:
        return main()
    except BrokenPipeError:  # `... | head`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(_main())
