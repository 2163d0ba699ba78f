"""The sections of the report page, each an HTML string built from a
`data.Report`: the header (job, session, nodes, each run's status and
times), the options, the restarts and checkpoint tables, and the
collapsible epoch tables with every number (the cards of charts:
`charts`).

Every value from the records is escaped (`esc`) on its way into the
page, and long texts (an error's traceback) are clipped, with the rest
behind a ``<details>``.  (The page around them: `localcluster.cli.report`.)
"""

import time

from .data import KILLED, metric_charts, num
from .svg import esc, fmt_value, run_color

__all__ = ["header", "runs_card", "options_card", "restarts_card",
           "checkpoints_card", "epoch_tables", "clip", "card", "legend"]

#: characters of a long text shown in full behind its ``<details>``
CLIP = 20000
#: nodes named in the header before the rest go behind ``<details>``
HEADER_NODES = 12


def when(unix_time):
    t = num(unix_time)
    if t is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):   # no date this platform has
        return "-"


def clip(text, inline=160):
    """A possibly huge text: its first line (up to ``inline`` characters)
    and, if there is more, all of it (up to `CLIP`) behind a summary."""
    text = "" if text is None else str(text)
    if not text.strip():
        return '<span class="muted">-</span>'
    first = text.strip().splitlines()[0]
    short = first[:inline] + ("\u2026" if len(first) > inline else "")
    if short == text.strip():
        return esc(short)
    rest = len(text) - CLIP
    more = f"\n\u2026 ({rest:,} more characters)" if rest > 0 else ""
    return (f'<details class="long"><summary>{esc(short)}</summary>'
            f'<pre>{esc(text[:CLIP] + more)}</pre></details>')


def _status(status):
    kind = {"ok": "ok", "error": "bad", "interrupted": "warn",
            KILLED: "bad"}.get(status, "warn")
    return f'<span class="status {kind}">{esc(status)}</span>'


def card(title, body, note="", wide=False):
    note = f'<p class="note">{note}</p>' if note else ""
    cls = "card wide" if wide else "card"
    return f'<section class="{cls}"><h2>{esc(title)}</h2>{note}{body}</section>'


def _table(head, rows, cls=""):
    cls = f' class="{cls}"' if cls else ""
    head = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def legend(items):
    """``items``: ``(name, color, kind)``, kind ``line``/``band``/``dash``."""
    spans = "".join(f'<span class="key {kind}" style="--c:{color}">'
                    f'<i></i>{esc(name)}</span>' for name, color, kind in items)
    return f'<div class="legend">{spans}</div>'


# -- the header and the runs -----------------------------------------------------

def header(report, title):
    nodes = [str(n) for n in report.field("nodes", [])] \
        if isinstance(report.field("nodes"), list) else []
    shown = ", ".join(esc(n) for n in nodes[:HEADER_NODES])
    if len(nodes) > HEADER_NODES:
        shown += (f' <details class="inline"><summary>and '
                  f'{len(nodes) - HEADER_NODES} more</summary>'
                  f'{", ".join(esc(n) for n in nodes[HEADER_NODES:])}'
                  '</details>')
    facts = [("job", esc(report.field("job", "-"))),
             ("session", esc(report.field("session", "-"))),
             ("nodes", f"{len(nodes)}: {shown}" if nodes else "-"),
             ("host", esc(report.field("host", "-"))),
             ("version", esc(report.field("version", "-")))]
    conditions = report.field("conditions")
    if isinstance(conditions, list) and conditions:
        facts.append(("conditions", esc(", ".join(map(str, conditions)))))
    facts_html = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>"
                         for k, v in facts)
    runs = "".join(
        f'<span class="run-chip" style="--c:{run_color(r.index)}">'
        f'<b>{esc(r.label)}</b> {_status(r.status)} '
        f'<span class="muted">{esc(when(r.started))} \u00b7 '
        f'{esc(fmt_value(r.seconds, "s"))}</span></span>'
        for r in report.runs)
    if not report.runs:
        runs = '<span class="muted">no runs recorded in this file yet</span>'
    return (f'<header><h1>{esc(title)}</h1><dl class="facts">{facts_html}'
            f'</dl><div class="runs">{runs}{_summary(report)}</div></header>')


def _summary(report):
    """The outcome in one line: epochs, the first metric's way, restarts."""
    if not report.epochs:
        return ""
    last = max((num(e.get("epoch")) or 0 for _, e in report.epochs))
    parts = [f"epoch {last:g}"]
    if report.metrics:
        name = "loss" if "loss" in report.metrics else report.metrics[0]
        values = [num((e.get("metrics") or {}).get(name))
                  if isinstance(e.get("metrics"), dict) else None
                  for _, e in report.epochs]
        values = [v for v in values if v is not None]
        if values:
            parts.append(f"{name} {fmt_value(values[0])} \u2192 "
                         f"{fmt_value(values[-1])}")
    restarts = sum(len(r.restarts) for r in report.runs)
    parts.append(f"{restarts} restart{'s' if restarts != 1 else ''}")
    return (f'<span class="summary">{esc(" · ".join(parts))}</span>')


def runs_card(report):
    rows = []
    for run in report.runs:
        epochs = [num(e.get("epoch")) for e in run.epochs]
        epochs = [e for e in epochs if e is not None]
        span = f"{min(epochs):g}\u2013{max(epochs):g}" if epochs else "-"
        resumed = run.field("resumed_from")
        end = run.end or {}
        rows.append([
            f'<span class="swatch" style="--c:{run_color(run.index)}"></span>'
            f'{esc(run.label)}', _status(run.status), esc(when(run.started)),
            esc(when(end.get("time"))), esc(fmt_value(run.seconds, "s")),
            esc(span), esc("-" if resumed is None else resumed),
            str(len(run.restarts)), clip(end.get("error")),
            f'<code>{esc(run.id)}</code>'])
    body = _table(["run", "status", "started", "ended", "ran", "epochs",
                   "resumed from", "restarts", "error", "id"], rows,
                  "runs-table")
    return card("Runs", body, wide=True)


def options_card(report, saved=None):
    columns = [(r.label, r.field("options")) for r in report.runs
               if isinstance(r.field("options"), dict)]
    if saved and not columns:
        columns = [("run file", saved)]
    if not columns:
        return ""
    distinct = []
    for label, options in columns:
        if all(options != o for _, o in distinct):
            distinct.append((label, options))
    keys = []
    for _, options in distinct:
        keys += [k for k in options if k not in keys]
    rows = [[f"<code>{esc(k)}</code>"] +
            [esc(_option(o.get(k))) for _, o in distinct] for k in keys]
    head = ["option"] + ([label for label, _ in distinct]
                         if len(distinct) > 1 else ["value"])
    note = "" if len(distinct) > 1 or len(columns) < 2 else \
        f"the same for all {len(columns)} runs"
    return card("Options", _table(head, rows, "compact"), note)


def _option(value):
    if value is None:
        return "-"
    if isinstance(value, (list, dict)):
        return ", ".join(map(str, value)) if isinstance(value, list) \
            else str(value)
    return str(value)


# -- tables -------------------------------------------------------------------------

def restarts_card(report):
    rows = [[esc(run.label), esc(when(r.get("time"))),
             esc(r.get("resumed_from", "-")), clip(r.get("error"))]
            for run in report.runs for r in run.restarts]
    if not rows:
        return card("Restarts", '<p class="muted">no restarts</p>')
    return card("Restarts", _table(["run", "time", "resumed from epoch",
                                     "why"], rows))


def checkpoints_card(report):
    seconds = [num(e.get("checkpoint_seconds")) for _, e in report.epochs]
    seconds = [s for s in seconds if s is not None]
    errors = [[esc(run.label), esc(e.get("epoch", "-")),
               clip(e.get("checkpoint_error"))]
              for run, e in report.epochs if e.get("checkpoint_error")]
    if not seconds and not errors:
        return ""
    facts = []
    if seconds:
        facts = [("checkpoints", str(len(seconds))),
                 ("total", fmt_value(sum(seconds), "s")),
                 ("mean", fmt_value(sum(seconds) / len(seconds), "s")),
                 ("longest", fmt_value(max(seconds), "s"))]
    body = '<dl class="stats">' + "".join(
        f"<div><dt>{k}</dt><dd>{esc(v)}</dd></div>" for k, v in facts) \
        + "</dl>"
    if errors:
        body += _table(["run", "epoch", "checkpoint error"], errors)
    else:
        body += '<p class="muted">every checkpoint was written</p>'
    return card("Checkpoints", body)


def epoch_tables(report):
    # every metric, a family's members side by side in numeric order
    metrics = [m for _, members in metric_charts(report.metrics)
               for m in members]
    head = ["run", "epoch", "of", "elapsed s", "epoch s", "checkpoint s",
            "simulated s", "rec/s", "restarts"] + metrics + \
        ["checkpoint error"]
    rows = []
    for run, e in report.epochs:
        m = e.get("metrics") if isinstance(e.get("metrics"), dict) else {}
        rows.append([esc(run.label)] + [
            esc(fmt_value(num(e.get(k)))) for k in
            ("epoch", "of", "elapsed", "seconds", "checkpoint_seconds",
             "simulated_seconds", "records_per_s", "restarts")] +
            [esc(fmt_value(num(m.get(k)))) for k in metrics] +
            [clip(e.get("checkpoint_error"), 60)])
    body = (f'<details><summary>{len(rows)} epoch records</summary>'
            f'<div class="scroll">{_table(head, rows, "num")}</div></details>')
    prow = []
    for run, e in report.epochs:
        procs = e.get("processes") if isinstance(e.get("processes"),
                                                 dict) else {}
        nodes = e.get("nodes") if isinstance(e.get("nodes"), dict) else {}
        for name, p in procs.items():
            p = p if isinstance(p, dict) else {}
            n = nodes.get(name) if isinstance(nodes.get(name), dict) else {}
            prow.append([esc(run.label), esc(e.get("epoch", "-")), esc(name),
                         esc(p.get("pid", "-")),
                         esc(fmt_value(num(n.get("seconds")))),
                         esc(fmt_value(num(p.get("cpu_percent")), "%")),
                         esc(fmt_value(num(p.get("cpu_seconds")))),
                         esc(fmt_value(num(p.get("rss_bytes")), "bytes")),
                         esc(fmt_value(num(p.get("peak_rss_bytes")),
                                       "bytes"))])
    if prow:
        table = _table(["run", "epoch", "process", "pid", "node s", "CPU",
                        "CPU s", "RSS", "peak RSS"], prow, "num")
        body += (f'<details><summary>{len(prow)} process samples</summary>'
                 f'<div class="scroll">{table}</div></details>')
    return card("Every number", body, wide=True)
