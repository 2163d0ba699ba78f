"""Every epoch of ``python -m localcluster.run``: its line, the live line
while it runs, and its record in ``metrics.jsonl``.

An epoch line says where the run is and what it costs::

    epoch 3/5  0.140 s + ckpt 0.012 s  loss 0.2202  468,345 rec/s  elapsed 0.5 s  ETA 0.3 s  | reader 51% 104M  ps 0% 64M ...

-- ``k/N`` (N: the job's ``epochs``, when it has one), the epoch group's
seconds and its checkpoint's, the job's metrics, records/s over the whole
epoch (checkpoint included: what the run sustains), the run's elapsed time
and an ETA (the mean epoch of this run times the epochs left), then each
node process's CPU and memory since the last epoch.  With more than
`LIST_AT_MOST` node processes the nodes are summarized as min/median/max
with the node that finished the epoch group last named,
and metrics named ``<name>_<n>`` (one per trainer) as ``<name>_* (count)
min/median/max``; ``--verbose`` adds a line per node and one with every
metric.  So a line stays under 200 characters at any number of nodes.

A metric of a node prototype's task (``Node("trainer", num_instances=N)``)
fetches as a list, one value per instance: it is shown and recorded as
the numbered metrics ``<name>_0`` ... ``<name>_<N-1>`` (`metric_values`),
as if each instance had its own.

While an epoch runs, a terminal shows a live line: the epoch, its
seconds so far, and the nodes still busy (`Session.running_nodes`: the
run driver's state) -- which node an epoch waits on.
"""

import re
import statistics
import time

from .progress import IN_PROCESS, mib, scalar
from ..numbered import families, numbered

__all__ = ["EpochWatch", "LIST_AT_MOST", "short_names", "metrics_text",
           "nodes_text", "change_text", "prototype_metrics", "metric_values"]

#: node processes listed one by one on an epoch line; more are summarized
LIST_AT_MOST = 4
#: busy nodes named on the live line; more are counted
_BUSY_SHOWN = 3


def _g(value):
    return "n/a" if value is None else format(value, ".4g")


def _natural(name):
    """Sort key: ``loss`` first, then by name, numbers as numbers."""
    return (name != "loss",
            [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)])


def prototype_metrics(job, metrics):
    """``{name: N}`` of the metrics (``{name: TaskOutput}``) that are
    outputs of a task of a node prototype of ``job`` with N instances."""
    counts = job.prototypes()
    if not counts:
        return {}
    of_output = {}
    for _, group in job.printable_groups():
        for task in group.tasks():
            count = counts.get(task.node)
            if count is not None:
                of_output.update((id(out), count) for out in task.outputs())
    return {name: of_output[id(out)] for name, out in metrics.items()
            if id(out) in of_output}


def _instance_values(fetched, output, count):
    """A prototype's fetched output, one value per instance: a one-blob
    output fetches as the instances' list, a list or dict of blobs as a
    list per blob."""
    shape = output.get()
    if isinstance(shape, str):
        return list(fetched)
    per_blob = list(fetched.values()) if isinstance(fetched, dict) \
        else list(fetched)
    return [[values[i] for values in per_blob] for i in range(count)]


def metric_values(metrics, instances=None):
    """``{name: float or None}`` of the metrics ``{name: TaskOutput}``
    after a run (`scalar`); a metric of a prototype (``instances``:
    `prototype_metrics`) as ``<name>_<i>``, one per instance."""
    instances = instances or {}
    values = {}
    for name, output in metrics.items():
        count = instances.get(name)
        if count is None:
            values[name] = scalar(output.fetch())
            continue
        each = _instance_values(output.fetch(), output, count)
        values.update((f"{name}_{i}", scalar(v)) for i, v in enumerate(each))
    return values


def metrics_text(values, every=False):
    """The metrics of an epoch line: ``loss`` first, then by name; unless
    ``every``, groups of 3 or more ``<stem>_<n>`` as one
    ``<stem>_* (n) min/med/max``."""
    names = sorted(values, key=_natural)
    groups = {} if every else families(names)
    grouped = {n for members in groups.values() if len(members) >= 3
               for n in members}
    parts, done = [], set()
    for name in names:
        if name not in grouped:
            parts.append(f"{name} {_g(values[name])}")
            continue
        stem = numbered(name)[0]
        if stem in done:
            continue
        done.add(stem)
        numbers = [values[n] for n in groups[stem] if values[n] is not None]
        spread = ("n/a" if not numbers else "/".join(
            format(v, ".3g") for v in (min(numbers),
                                       statistics.median(numbers),
                                       max(numbers))))
        parts.append(f"{stem}_* ({len(groups[stem])}) {spread}")
    return "  ".join(parts)


def nodes_text(per_node, node_seconds):
    """The node part of an epoch line: each process, or (more than
    `LIST_AT_MOST`) CPU and RSS as min/median/max and the node that
    finished last."""
    if len(per_node) <= LIST_AT_MOST:
        return "  ".join(
            f"{n} {u['cpu_percent']:.0f}% {mib(u['rss_bytes'])}"
            if u.get("cpu_percent") is not None
            else f"{n} {mib(u['rss_bytes'])}"
            for n, u in per_node.items())
    cpus = [u["cpu_percent"] for u in per_node.values()
            if u.get("cpu_percent") is not None]
    rss = [u["rss_bytes"] for u in per_node.values()]
    text = f"{len(per_node)} nodes"
    if cpus:
        text += " cpu " + "/".join(
            f"{v:.0f}" for v in (min(cpus), statistics.median(cpus),
                                 max(cpus))) + "%"
    text += " rss " + "/".join(
        mib(v) for v in (min(rss), statistics.median(rss), max(rss)))
    slowest = _slowest(node_seconds)
    if slowest is not None:
        text += f"  last done {slowest} {node_seconds[slowest]:.3f} s"
    return text


def change_text(first, last):
    """How ``last`` compares with ``first``, in words a reader takes in at
    once: ``226x lower`` from 2x on, else a percentage (``20% lower``,
    never ``1x lower``); ``lower``/``higher`` where a ratio means nothing
    (a value of 0 or below)."""
    if last == first:
        return "unchanged"
    if first <= 0 or last <= 0:
        return "lower" if last < first else "higher"
    if first / last >= 2:
        return f"{first / last:.0f}x lower"
    if last / first >= 2:
        return f"{last / first:.0f}x higher"
    percent = abs(last - first) / first * 100
    return (f"{percent:.2g}% " if percent < 1 else f"{percent:.0f}% ") + (
        "lower" if last < first else "higher")


def short_names(names):
    """``names`` for one line: runs of ``<stem>_<n>`` with consecutive
    numbers as ``<stem>_<a>..<stem>_<b>`` (``trainer_0..trainer_31``)."""
    out, run = [], []

    def flush():
        if len(run) > 2:
            out.append(f"{run[0][2]}..{run[-1][2]}")
        else:
            out.extend(name for _, _, name in run)
        run.clear()
    for name in names:
        found = numbered(name)
        if found and run and run[-1][0] == found[0] and \
                run[-1][1] + 1 == found[1]:
            run.append((*found, name))
            continue
        flush()
        if found:
            run.append((*found, name))
        else:
            out.append(name)
    flush()
    return ", ".join(out)


def _slowest(node_seconds):
    timed = {n: s for n, s in (node_seconds or {}).items() if s is not None}
    return max(timed, key=timed.get) if timed else None


def _seconds(value):
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


class EpochWatch:
    """The runner's ``on_epoch``: fetches the metrics, samples the nodes,
    prints the epoch's line (and, ``verbose``, a line per node), appends
    the epoch to ``metrics.jsonl`` (``metrics_log``) and records it for the
    summary and the trace.  ``restarts()`` lists the runner's restarts so
    far; ``of``: the epoch the run trains to, if known.  ``epoch`` is the
    last epoch shown and recorded.  ``started``: the run's start
    (`time.monotonic`), which ``elapsed`` counts from -- the one the done
    line counts from too.  ``instances``: ``{metric: N}`` of the metrics of
    node prototypes (`prototype_metrics`), shown one per instance.
    """

    def __init__(self, nodes, metrics, records, usage, progress, summary,
                 resume, of=None, verbose=False, session=None,
                 metrics_log=None, run_id=None, restarts=None, started=None,
                 instances=None):
        self.nodes, self.metrics, self.usage = nodes, metrics, usage
        self.instances = instances or {}
        self.records = records
        self.progress, self.summary = progress, summary
        self.of, self.verbose, self.session = of, verbose, session
        self.metrics_log, self.run_id = metrics_log, run_id
        self.restarts = restarts or (lambda: [])
        self._restarts_logged = 0
        self.saves, self.first_loss = [], None
        self.epoch, self.since = resume or 0, time.monotonic()
        self.started = time.monotonic() if started is None else started
        self._spent = []   # seconds of each epoch of this run, checkpoint in
        #: ``{node: pid}`` of the process each node last ran an epoch in
        self.pids = {}

    # -- while an epoch runs --------------------------------------------------------

    def _k_of_n(self, epoch):
        return f"{epoch}/{self.of}" if self.of else f"{epoch}"

    def eta(self, epoch):
        """Seconds until the last epoch, from this run's mean epoch (None:
        no epoch done yet, or the run's length is not known)."""
        if not self.of or not self._spent:
            return None
        return max(0, self.of - epoch) * statistics.fmean(self._spent)

    def live_text(self):
        now = time.monotonic()
        text = (f"epoch {self._k_of_n(self.epoch + 1)} running "
                f"{now - self.since:.1f} s")
        busy = self.session.running_nodes() if self.session else []
        if busy:
            shown = ", ".join(busy[:_BUSY_SHOWN])
            more = len(busy) - _BUSY_SHOWN
            text += (f"  busy {len(busy)}: {shown}"
                     + (f" +{more} more" if more > 0 else ""))
        eta = self.eta(self.epoch)
        text += f"  elapsed {_seconds(now - self.started)}"
        if eta is not None:
            text += f"  ETA {_seconds(max(0.0, eta - (now - self.since)))}"
        return text

    # -- an epoch done ----------------------------------------------------------------

    def on_epoch(self, report, stopped=False):
        """Show and record the epoch of ``report``.  ``stopped``: the run
        was stopped (its session closed) after the epoch's checkpoint was
        complete and before it was shown -- it is shown and recorded all
        the same, without its nodes' usage."""
        values = metric_values(self.metrics, self.instances)
        per_node = {} if stopped else self.usage.sample()
        whole = report.seconds + (report.checkpoint_seconds or 0.0)
        # a checkpoint of unknown length: no rate rather than a high one
        rate = self.records / whole if self.records and whole > 0 and \
            not stopped else None
        pids = {} if stopped or not self.session else \
            self.session.node_pids()
        self.pids.update(pids)
        now = time.monotonic()
        self._spent.append(whole)
        entry = {
            "epoch": report.epoch, "seconds": report.seconds,
            "simulated_seconds": report.simulated_seconds,
            "checkpoint_seconds": report.checkpoint_seconds,
            "metrics": values, "records_per_s": rate,
            "nodes": {n: dict(per_node.get(n, {}),
                              seconds=report.node_seconds.get(n),
                              pid=pids.get(n))
                      for n in self.nodes},
            "processes": per_node,
            "checkpoint_error": report.checkpoint_error}
        self.summary["epochs"].append(entry)
        if report.checkpoint_seconds is not None:
            self.saves.append((report.epoch,
                               report.started + report.seconds,
                               report.checkpoint_seconds))
        self._log_epoch(report, entry, now, pids)
        self.epoch, self.since = report.epoch, now
        if self.first_loss is None and values.get("loss") is not None:
            self.first_loss = values["loss"]
        self.progress.line(self.line(report, values, rate, per_node, now,
                                     stopped))
        if self.verbose:
            for node in self.nodes:
                self.progress.line(self._node_line(node, entry, per_node))
            if values:
                self.progress.line("    metrics: "
                                   + metrics_text(values, every=True))

    def line(self, report, values, rate, per_node, now, stopped=False):
        simulated = "" if report.simulated_seconds is None else \
            f" (simulated {report.simulated_seconds:.3f} s)"
        ckpt = "" if report.checkpoint_seconds is None else \
            f" + ckpt {report.checkpoint_seconds:.3f} s"
        width = 2 * len(str(self.of)) + 1 if self.of else 3
        shown = metrics_text(values)
        text = (f"epoch {self._k_of_n(report.epoch):>{width}}  "
                f"{report.seconds:6.3f} s{ckpt}{simulated}"
                + (f"  {shown}" if shown else "")
                + (f"  {rate:,.0f} rec/s" if rate else "")
                + f"  elapsed {_seconds(now - self.started)}")
        eta = self.eta(report.epoch)
        if stopped:
            return text + "  | checkpointed as the run was stopped"
        if eta is not None and report.epoch < self.of:
            text += f"  ETA {_seconds(eta)}"
        return text + "  | " + nodes_text(per_node, report.node_seconds)

    def _node_line(self, node, entry, per_node):
        facts = entry["nodes"][node]
        shared = node not in per_node and IN_PROCESS in per_node
        usage = per_node.get(IN_PROCESS if shared else node, {})
        parts = [f"    {node}"]
        if facts.get("pid") is not None:
            parts.append(f"pid {facts['pid']}")
        if usage.get("cpu_percent") is not None:
            parts.append(f"cpu {usage['cpu_percent']:.0f}%"
                         + (" (all nodes)" if shared else ""))
        if usage.get("rss_bytes") is not None:
            parts.append(f"rss {mib(usage['rss_bytes'])}")
        if facts.get("seconds") is not None:
            parts.append(f"ran {facts['seconds']:.3f} s")
        return "  ".join(parts)

    def _log_epoch(self, report, entry, now, pids):
        log = self.metrics_log
        if log is None:
            return
        self.log_restarts()
        processes = {}
        for name, usage in entry["processes"].items():
            processes[name] = dict(
                usage, pid=pids.get(name),
                peak_rss_bytes=self.usage.peak_rss.get(name),
                cpu_seconds=self.usage.cpu_seconds.get(name))
        log.write({
            "kind": "epoch", "run": self.run_id, "time": time.time(),
            "epoch": report.epoch, "of": self.of,
            "elapsed": now - self.started, "seconds": report.seconds,
            "checkpoint_seconds": report.checkpoint_seconds,
            "simulated_seconds": report.simulated_seconds,
            "records_per_s": entry["records_per_s"],
            "metrics": entry["metrics"],
            "restarts": len(self.restarts()),
            "checkpoint_error": report.checkpoint_error,
            "nodes": {n: {"seconds": v["seconds"], "pid": v["pid"]}
                      for n, v in entry["nodes"].items()},
            "processes": processes})

    def log_restarts(self):
        """Append the restarts not yet in ``metrics.jsonl``."""
        if self.metrics_log is None:
            return
        restarts = self.restarts()
        for resumed_from, error in restarts[self._restarts_logged:]:
            self.metrics_log.write({
                "kind": "restart", "run": self.run_id, "time": time.time(),
                "resumed_from": resumed_from, "error": error})
        self._restarts_logged = len(restarts)

    def done_line(self, last, seconds, checkpoint_dir):
        """The line that ends a run."""
        epochs = self.summary["epochs"]
        final = epochs[-1]["metrics"] if epochs else {}
        ckpt = sum(e["checkpoint_seconds"] or 0.0 for e in epochs)
        text = f"done: epoch {last} in {seconds:.2f} s"
        if epochs:
            text += f" ({ckpt:.2f} s checkpointing)"
        first = self.first_loss
        if final.get("loss") is not None and first is not None:
            text += (f"; loss {first:.4g} -> {final['loss']:.4g} "
                     f"({change_text(first, final['loss'])})")
        return text + f"; checkpoints in {checkpoint_dir}"
