"""The report's cards of charts, each an HTML string built from a
`cli.htmlreport.data.Report`: the metrics (one chart per metric, one per
family of numbered metrics), throughput, epoch and checkpoint seconds,
simulated time, and each node process's CPU and memory -- a line per run
or node, or a min-max band and a median line where there are too many.
(The charts themselves: `svg`; the card around each: `page.card`.)
"""

from .data import MAX_NODE_LINES, metric_charts, num
from .page import card, legend as legend_html
from .svg import (MARKER, Band, Series, bar_chart, esc, fmt_value, line_chart,
                  node_color, run_color)

__all__ = ["metric_cards", "throughput_card", "seconds_card",
           "simulated_card", "process_cards"]

#: the min-max band and the median line that stand in for many lines
BAND_COLOR, MEDIAN_COLOR = "#4e79a7", "#1f4e79"


def _run_series(report, name, value, unit, width=2.2):
    series, seen = [], set()
    for run, points in report.epoch_points(value):
        segment = [(x, y, None if y is None else
                    f"{run.label} \u00b7 epoch {x:g}\n{name}: "
                    f"{fmt_value(y, unit)}") for x, y, _ in points]
        label = run.label if run.index not in seen else ""
        seen.add(run.index)
        series.append(Series(label or run.label, run_color(run.index),
                             [segment], width))
    return series


def _run_legend(report):
    if len(report.runs) < 2:
        return ""
    items = [(r.label, run_color(r.index), "line") for r in report.runs]
    return legend_html(items + _marker_legend(report))


def _metric(name):
    """The value of metric ``name`` in an epoch record (None: absent)."""
    def value(record):
        metrics = record.get("metrics")
        return num(metrics.get(name)) if isinstance(metrics, dict) else None
    return value


def _marker_legend(report):
    kinds = {kind for _, _, kind, _ in report.markers()}
    return [(label, MARKER[kind], "dash") for kind, label in
            (("restart", "restart"), ("run", "run start")) if kind in kinds]


def metric_cards(report):
    """A chart per metric, and one per family of numbered metrics
    (`metric_charts`): a line per member up to `MAX_NODE_LINES`, else
    their min-max band and median."""
    cards = []
    for title, members in metric_charts(report.metrics):
        if len(members) == 1:
            series = _run_series(report, title, _metric(title), "")
            chart = line_chart(series, x_label="epoch", y_label=title,
                               markers=report.markers(),
                               x_range=report.epoch_range, zero=False)
            cards.append(card(title, chart + _run_legend(report),
                              "the job's metric after each epoch"))
        else:
            cards.append(_family_card(report, title, members))
    return "".join(cards)


def _family_card(report, title, members):
    family = title[:-1] + "<n>"          # train_loss_* -> train_loss_<n>
    if len(members) > MAX_NODE_LINES:
        segments = [[(x, f"{run.label} \u00b7 epoch {x:g}", *spread)
                     for x, *spread in points]
                    for run, points in report.metric_bands(members)]
        bands, series, legend = _spread_parts(
            segments, "", f"{len(members)} metrics")
        note = (f"the spread of the {len(members)} metrics "
                f"{esc(family)} after each epoch")
    else:
        colors = {name: node_color(i) for i, name in enumerate(members)}
        bands, series = [], [
            _member_series(report, name, colors[name], i, len(members))
            for i, name in enumerate(members)]
        legend = [(name, colors[name], "line") for name in members]
        note = f"one line per {esc(family)} after each epoch"
    chart = line_chart(series, bands=bands, x_label="epoch", y_label=title,
                       markers=report.markers(), x_range=report.epoch_range,
                       zero=False)
    legend += _marker_legend(report)
    return card(title, chart + legend_html(legend), note)


def _member_series(report, name, color, index, count):
    """One member of a family: a line over every run, each point's tip
    naming the member, the run and the epoch.  Members drawn first are
    wider, so that lines on top of each other (nodes whose metric is the
    same) still show each color."""
    segments = [[(x, y, None if y is None else
                  f"{name} \u00b7 {run.label} epoch {x:g}\n"
                  f"{fmt_value(y)}") for x, y, _ in points]
                for run, points in report.epoch_points(_metric(name))]
    width = 1.6 + 2.4 * (count - 1 - index) / max(count - 1, 1)
    return Series(name, color, segments, round(width, 2))


def _per_run_card(report, title, field, name, unit, y_label, note):
    """A card of one epoch record ``field`` over the epochs, a line per
    run."""
    series = _run_series(report, name, lambda r: num(r.get(field)), unit)
    chart = line_chart(series, x_label="epoch", y_label=y_label, unit=unit,
                       markers=report.markers(), x_range=report.epoch_range)
    return card(title, chart + _run_legend(report), note)


def throughput_card(report):
    return _per_run_card(report, "Throughput", "records_per_s", "throughput",
                         "rec/s", "records / s",
                         "records per second of an epoch and its checkpoint")


def seconds_card(report):
    groups = {}
    for run, record in report.epochs:
        epoch = num(record.get("epoch"))
        if epoch is None:
            continue
        run_s, ckpt_s = num(record.get("seconds")), \
            num(record.get("checkpoint_seconds"))
        where = f"{run.label} \u00b7 epoch {epoch:g}"
        groups.setdefault(epoch, []).append([
            (run_s, f"{where}\nepoch: {fmt_value(run_s, 's')}"),
            (ckpt_s, f"{where}\ncheckpoint: {fmt_value(ckpt_s, 's')}")])
    stacks = [("epoch", "#4e79a7"), ("checkpoint", "#f28e2b")]
    chart = bar_chart(sorted(groups.items()), stacks=stacks, x_label="epoch",
                      y_label="seconds", unit="s", markers=report.markers(),
                      x_range=report.epoch_range)
    key = legend_html([(n, c, "band") for n, c in stacks])
    return card("Epoch and checkpoint time", chart + key,
                "an epoch that ran twice (after a restart) has two bars")


def simulated_card(report):
    if not report.has_simulated:
        return ""
    return _per_run_card(report, "Simulated time", "simulated_seconds",
                         "simulated", "s", "simulated seconds",
                         "virtual seconds of each epoch (--simulate)")


# -- the process charts ----------------------------------------------------------

def process_cards(report):
    if not report.processes:
        return ""
    return (_process_card(report, "CPU", "cpu_percent", "%", "CPU")
            + _process_card(report, "Memory (RSS)", "rss_bytes", "bytes",
                            "resident memory"))


def _process_card(report, title, field, unit, y_label):
    markers = report.time_markers()
    series_by_name = report.process_series(field)
    colors = {n: node_color(i) for i, n in enumerate(report.processes)}
    bands = []
    if len(report.processes) > MAX_NODE_LINES:
        points = [(x, f"{x:.2f} s", *spread)
                  for x, *spread in report.bands(field)]
        bands, series, legend = _spread_parts(
            [points], unit, f"{len(report.processes)} processes")
        slow = report.slowest
        if slow in series_by_name:
            series.append(_node_series(slow, "#dc2626",
                                       series_by_name[slow], unit))
            legend.append((f"slowest node: {slow}", "#dc2626", "line"))
    else:
        series = [_node_series(n, colors[n], series_by_name[n], unit)
                  for n in report.processes]
        legend = [(n, colors[n], "line") for n in report.processes]
    chart = line_chart(series, bands=bands, x_label="seconds of running",
                       y_label=y_label, unit=unit, markers=markers,
                       epochs=False)
    note = "sampled after each epoch; runs placed end to end"
    return card(title, chart + legend_html(legend), note)


def _spread_parts(segments, unit, what):
    """What stands in for too many lines to draw: ``segments`` (each a
    list of ``(x, where, low, median, high, low_name, high_name)``) ->
    ``(bands, series, legend)``: a min-max band per segment, one median
    line whose tips name the lowest and the highest, and their keys."""
    bands, medians = [], []
    for points in segments:
        if not points:
            continue
        bands.append(Band("min\u2013max", BAND_COLOR,
                          [(x, lo, hi) for x, _, lo, _, hi, _, _ in points]))
        medians.append([(x, mid, f"{where}\nmin {fmt_value(lo, unit)} "
                         f"({lo_n})\nmedian {fmt_value(mid, unit)}\n"
                         f"max {fmt_value(hi, unit)} ({hi_n})")
                        for x, where, lo, mid, hi, lo_n, hi_n in points])
    legend = [(f"min\u2013max of {what}", BAND_COLOR, "band"),
              ("median", MEDIAN_COLOR, "line")]
    return bands, [Series("median", MEDIAN_COLOR, medians, 2.0)], legend


def _node_series(name, color, segments, unit):
    out = [[(x, y, f"{name} \u00b7 {run.label} epoch "
             f"{record.get('epoch')}\n{x:.2f} s: {fmt_value(y, unit)}")
            for x, y, run, record in points] for points in segments]
    return Series(name, color, out, 1.8)


