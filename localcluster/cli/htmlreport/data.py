"""What the report of a run shows, computed from a ``metrics.jsonl``'s
records (`localcluster.cli.rundir.metrics` describes them): the runs and how
each ended, every epoch on one epoch axis, the per-node process series on
one time axis, the metric charts (`metric_charts`: one per metric, one
per family of numbered metrics), and the min/median/max bands that stand
in for the nodes or a family's members when there are too many to draw
one line each.

It is the report's only reader of the records, and it trusts nothing in
them: a missing or null field, a number that is a string, a line of a run
whose ``run`` line was lost -- each is shown as absent, never an error.
(The HTML: `localcluster.cli.report`; the charts: `svg`.)
"""

import math

from ..numbered import families, numbered

__all__ = ["Run", "Report", "num", "build", "metric_charts", "KILLED",
           "MAX_NODE_LINES"]

#: the status of a run that has a ``run`` line and no ``end`` line
KILLED = "did not end (killed?)"
#: with more process series than this, the CPU and memory charts show
#: min/median/max bands, the median, and the slowest node
MAX_NODE_LINES = 12


#: beyond this magnitude a number counts as absent: no axis spans it
LIMIT = 1e300


def num(value):
    """``value`` as a finite float, or None (null, NaN, text, a bool, or
    beyond +-`LIMIT`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:      # an int too big for a float
        return None
    return value if math.isfinite(value) and abs(value) <= LIMIT else None


def _dict(value):
    return value if isinstance(value, dict) else {}


class Run:
    """One run of the file: its ``run`` line (None if it was lost), its
    epochs and restarts in file order, and its ``end`` line (None if the
    run never wrote one: it was killed, or it is still going)."""

    def __init__(self, run_id, index):
        self.id, self.index = run_id, index
        self.start, self.end = None, None
        self.epochs, self.restarts = [], []
        self.offset = 0.0      # where it starts on the report's time axis

    def field(self, name, default=None):
        value = _dict(self.start).get(name)
        return default if value is None else value

    @property
    def status(self):
        if self.end is None:
            return KILLED
        return str(self.end.get("status") or "unknown")

    @property
    def label(self):
        return f"run {self.index + 1}"

    @property
    def started(self):
        return num(_dict(self.start).get("time"))

    @property
    def seconds(self):
        """How long it ran: its ``end`` line's, else its last epoch's."""
        end = num(_dict(self.end).get("seconds"))
        if end is not None:
            return end
        elapsed = [num(e.get("elapsed")) for e in self.epochs]
        elapsed = [e for e in elapsed if e is not None]
        return max(elapsed, default=0.0)

    def at(self, unix_time):
        """``unix_time`` on the report's time axis (None if unknown)."""
        t, start = num(unix_time), self.started
        if t is None or start is None:
            return None
        return self.offset + max(0.0, t - start)


class Report:
    """Everything the page draws: ``runs``; ``epochs`` (``(run, record)``
    in file order); ``segments`` (runs of epochs drawn as one line: a run
    is split where it restarted); ``metrics`` (names, in first-seen
    order); ``processes`` (series names); ``slowest`` (a node, or None)."""

    def __init__(self):
        self.runs, self.epochs, self.segments = [], [], []
        self.metrics, self.processes = [], []
        self.slowest = None

    @property
    def first(self):
        return next((r for r in self.runs if r.start is not None), None)

    def field(self, name, default=None):
        """A field of the last run line that has it."""
        for run in reversed(self.runs):
            if run.field(name) is not None:
                return run.field(name)
        return default

    @property
    def epoch_range(self):
        """``(first, last)`` epoch of the file, or None: every epoch chart
        shows this range, so that they line up."""
        epochs = [num(e.get("epoch")) for _, e in self.epochs]
        epochs = [e for e in epochs if e is not None]
        return (min(epochs), max(epochs)) if epochs else None

    @property
    def has_simulated(self):
        return any(num(e.get("simulated_seconds")) is not None
                   for _, e in self.epochs)

    def epoch_points(self, value):
        """``[(run, [(epoch, y, record), ...]), ...]`` per segment, with
        ``value(record)`` as y (None: a gap)."""
        out = []
        for run, records in self.segments:
            points = []
            for record in records:
                x = num(record.get("epoch"))
                if x is not None:
                    points.append((x, value(record), record))
            out.append((run, points))
        return out

    def markers(self):
        """``[(epoch, label, kind, tip)]``: where each run after the first
        starts and where each restart resumed, between two epochs."""
        out = []
        for run in self.runs:
            if run.index > 0:
                start = num(run.field("resumed_from")) or 0
                out.append((start + 0.5, run.label, "run",
                            _run_tip(run, start)))
            for restart in run.restarts:
                start = num(restart.get("resumed_from")) or 0
                out.append((start + 0.5, "restart", "restart",
                            _restart_tip(run, restart, start)))
        return out

    def time_markers(self):
        """Run starts and restarts on the time axis of `process_series`."""
        out = [(run.offset, run.label, "run",
                _run_tip(run, num(run.field("resumed_from")) or 0))
               for run in self.runs if run.index > 0]
        for run in self.runs:
            for restart in run.restarts:
                x = run.at(restart.get("time"))
                if x is not None:
                    start = num(restart.get("resumed_from")) or 0
                    out.append((x, "restart", "restart",
                                _restart_tip(run, restart, start)))
        return out

    def process_series(self, field):
        """``{name: [[(seconds, value, run, record), ...] per run]}`` of a
        ``processes`` field, x on the time axis (runs end to end)."""
        series = {name: [] for name in self.processes}
        for run in self.runs:
            lines = {name: [] for name in self.processes}
            for record in run.epochs:
                x = num(record.get("elapsed"))
                if x is None:
                    continue
                for name, stats in _dict(record.get("processes")).items():
                    y = num(_dict(stats).get(field))
                    if y is not None and name in lines:
                        lines[name].append((run.offset + x, y, run, record))
            for name, points in lines.items():
                if points:
                    series[name].append(points)
        return series

    def bands(self, field):
        """``[(seconds, low, median, high, low_name, high_name)]``: over
        the processes of each epoch, for many-node charts."""
        out = []
        for run in self.runs:
            for record in run.epochs:
                x = num(record.get("elapsed"))
                spread = _spread(
                    (name, _dict(stats).get(field)) for name, stats in
                    _dict(record.get("processes")).items())
                if x is not None and spread is not None:
                    out.append((run.offset + x,) + spread)
        return out

    def metric_bands(self, members):
        """``[(run, [(epoch, low, median, high, low_name, high_name)])]``
        per segment: the spread of the metrics ``members`` after each
        epoch, for a family of numbered metrics too big for a line
        each."""
        out = []
        for run, records in self.segments:
            points = []
            for record in records:
                x = num(record.get("epoch"))
                metrics = _dict(record.get("metrics"))
                spread = _spread((name, metrics.get(name))
                                 for name in members)
                if x is not None and spread is not None:
                    points.append((x,) + spread)
            out.append((run, points))
        return out


def metric_charts(names):
    """``[(title, members)]``: what the metric charts show, ``loss``
    first, then in the order of ``names``.  Names ``<stem>_<n>`` (see
    `localcluster.cli.numbered`) that share their stem with at least one
    other share one chart titled ``<stem>_*``, its members in numeric order; any other
    name (a lone ``x_1`` too) is a chart of its own, titled by it."""
    names = sorted(names, key=lambda n: n != "loss")
    grouped = families(names)
    out, done = [], set()
    for name in names:
        found = numbered(name)
        members = grouped.get(found[0], []) if found else []
        if len(members) < 2:
            out.append((name, [name]))
        elif found[0] not in done:
            done.add(found[0])
            out.append((f"{found[0]}_*", sorted(members, key=_number)))
    return out


def _number(name):
    """A numbered metric's sort key: its number, then (``x_1`` and
    ``x_01``) its name."""
    return numbered(name)[1], name


def _spread(named_values):
    """``(low, median, high, low_name, high_name)`` of ``(name, value)``
    pairs (values that are not numbers skipped), or None if none is."""
    values = sorted((v, str(name)) for name, value in named_values
                    if (v := num(value)) is not None)
    if not values:
        return None
    ys = [v for v, _ in values]
    return ys[0], _median(ys), ys[-1], values[0][1], values[-1][1]


def _run_tip(run, start):
    return f"{run.label} starts after epoch {start:g} ({run.status})"


def _restart_tip(run, restart, start):
    error = str(restart.get("error") or "").strip().splitlines()
    error = error[0][:200] if error else "no reason recorded"
    return f"restart in {run.label}: resumed from epoch {start:g}\n{error}"


def _median(sorted_values):
    n = len(sorted_values)
    mid = n // 2
    if n % 2:
        return sorted_values[mid]
    return (sorted_values[mid - 1] + sorted_values[mid]) / 2


def build(records):
    """The `Report` of a list of records (as `read_metrics` returns)."""
    report, by_id = Report(), {}
    for record in records:
        if not isinstance(record, dict):
            continue
        run_id = str(record.get("run"))
        run = by_id.get(run_id)
        if run is None:
            run = by_id[run_id] = Run(run_id, len(report.runs))
            report.runs.append(run)
        _add(report, run, record)
    offset = 0.0
    for run in report.runs:
        run.offset = offset
        offset += run.seconds
    report.slowest = _slowest(report)
    return report


def _add(report, run, record):
    kind = record.get("kind")
    if kind == "run":
        run.start = run.start or record
    elif kind == "end":
        run.end = record
    elif kind == "restart":
        run.restarts.append(record)
        report.segments.append((run, []))
    elif kind == "epoch":
        run.epochs.append(record)
        report.epochs.append((run, record))
        if not report.segments or report.segments[-1][0] is not run:
            report.segments.append((run, []))
        report.segments[-1][1].append(record)
        _names(report.metrics, _dict(record.get("metrics")))
        _names(report.processes, _dict(record.get("processes")))


def _names(known, mapping):
    for name in mapping:
        if name not in known:
            known.append(name)


def _slowest(report):
    """The node whose epochs took longest in all (its ``nodes`` seconds),
    among those with process series; else the most CPU-hungry process."""
    total = {}
    for _, record in report.epochs:
        for name, stats in _dict(record.get("nodes")).items():
            seconds = num(_dict(stats).get("seconds"))
            if seconds is not None and name in report.processes:
                total[name] = total.get(name, 0.0) + seconds
    if not total:
        for _, record in report.epochs:
            for name, stats in _dict(record.get("processes")).items():
                cpu = num(_dict(stats).get("cpu_percent"))
                if cpu is not None:
                    total[name] = total.get(name, 0.0) + cpu
    return max(total, key=lambda n: (total[n], n)) if total else None
