"""``python -m localcluster.report CKPT_DIR [-o report.html]``: one HTML
page that shows what the runs in a checkpoint directory did.

Every ``python -m localcluster.run`` appends its history to
``<checkpoint dir>/metrics.jsonl`` (`localcluster.cli.rundir.metrics`); this
reads it back and writes a single self-contained page -- no network, no
external scripts, fonts or styles -- with the job and each run's status,
the run's options, charts of the metrics, throughput, epoch and
checkpoint time, each node's CPU and memory, the restarts, and every
number in collapsible tables.  Metrics numbered per node
(``train_loss_0`` ... ``train_loss_31``) share one chart,
``train_loss_*``: a line each up to 12, else their min-max band and
median.  The charts are inline SVG drawn in Python (`htmlreport.svg`),
so they show without scripts; a few lines of script only turn their
hover details into tooltips.  A Content-Security-Policy lets
only that script run.

Library: `render` (records -> HTML) and `write_report` (records, a
directory or a metrics.jsonl -> a file).

Exit status: 0 (the path written is printed); 2 for usage errors (no such
directory, no metrics.jsonl in it); 1 when the page cannot be written.
Each error is one line.
"""

import base64
import errno
import hashlib
import os
import sys
import time

from .version import __version__
from .args import OneLineParser
from .rundir.directory import saved_options
from .rundir.metrics import METRICS_FILE, read_metrics
from .htmlreport.data import build
from .htmlreport.charts import (metric_cards, process_cards, seconds_card,
                                simulated_card, throughput_card)
from .htmlreport.page import (checkpoints_card, epoch_tables, header,
                              options_card, restarts_card, runs_card)
from .htmlreport.svg import esc
from ..checkpoint.atomic import atomic_write

__all__ = ["render", "write_report", "find_metrics", "main", "REPORT_FILE"]

#: the page's name in the checkpoint directory when no -o is given
REPORT_FILE = "report.html"

_CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:#1f2937;font:14px/1.45 system-ui,
-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
header{background:#fff;border-bottom:1px solid #e5e7eb;padding:18px 28px 14px}
h1{margin:0 0 8px;font-size:20px;font-weight:650;word-break:break-all}
h2{margin:0 0 2px;font-size:15px;font-weight:600;word-break:break-all}
.facts{display:flex;flex-wrap:wrap;gap:4px 26px;margin:0 0 10px}
.facts div{display:flex;gap:6px;max-width:100%}
dt{color:#6b7280}dd{margin:0;word-break:break-word}
.runs{display:flex;flex-wrap:wrap;gap:8px;align-items:center}
.summary{margin-left:6px;font-weight:600;color:#374151}
.run-chip{border:1px solid #e5e7eb;border-left:4px solid var(--c);
border-radius:6px;padding:3px 10px;background:#fafafa}
.status{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;
font-weight:600}
.status.ok{background:#dcfce7;color:#166534}
.status.bad{background:#fee2e2;color:#991b1b}
.status.warn{background:#fef3c7;color:#92400e}
main{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));
gap:16px;padding:18px 28px 28px;align-items:start}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:10px;
padding:14px 16px;box-shadow:0 1px 2px rgba(0,0,0,.04);min-width:0}
.card.wide{grid-column:1/-1}
.note{margin:0 0 8px;color:#6b7280;font-size:12.5px}
svg.chart{width:100%;height:auto;display:block;overflow:visible}
svg .tick{font-size:11px;fill:#6b7280}svg .axis{font-size:12px;fill:#374151}
svg .mlabel{font-size:11px;font-weight:600}
svg .dot:hover{stroke:#111;stroke-width:1.5}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin-top:6px;
font-size:12.5px;max-height:5.5em;overflow:auto}
.key{display:inline-flex;align-items:center;gap:5px;word-break:break-all}
.key i{display:inline-block;width:16px;height:3px;background:var(--c);
border-radius:2px}
.key.band i{height:10px;opacity:.85}
.key.dash i{height:0;border-top:2px dashed var(--c);background:none}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;
background:var(--c);margin-right:6px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #f0f1f3;
vertical-align:top;word-break:break-word}
th{color:#6b7280;font-weight:600;background:#fafafa;position:sticky;top:0;
white-space:nowrap;word-break:normal}
table.num td{font-variant-numeric:tabular-nums;white-space:nowrap}
table.compact td{padding:2px 8px}
.runs-table td{white-space:nowrap}
.runs-table td:nth-child(9){white-space:normal;width:40%}
.scroll{max-height:480px;overflow:auto;margin-top:6px}
details{margin:4px 0}summary{cursor:pointer;color:#374151}
details.long pre{white-space:pre-wrap;word-break:break-all;max-height:320px;
overflow:auto;background:#f9fafb;padding:8px;border-radius:6px;font-size:12px}
details.inline{display:inline}
.stats{display:flex;gap:22px;margin:4px 0 8px}
.stats dd{font-size:17px;font-weight:600}
.muted{color:#6b7280}.empty{color:#6b7280;padding:30px 0;text-align:center}
code{font-size:12px}
footer{color:#6b7280;font-size:12px;padding:0 28px 24px}
.tip{position:absolute;display:none;pointer-events:none;background:#111827;
color:#fff;padding:5px 8px;border-radius:6px;font-size:12px;
white-space:pre-line;max-width:360px;z-index:9;word-break:break-word}
"""

# Hover details: each chart element's <title> becomes a styled tooltip.
_JS = """(function(){
var tip=document.createElement('div');tip.className='tip';
document.body.appendChild(tip);
document.querySelectorAll('svg.chart title').forEach(function(t){
var p=t.parentNode;p.setAttribute('data-tip',t.textContent);p.removeChild(t);});
document.addEventListener('mouseover',function(e){
var el=e.target.closest&&e.target.closest('[data-tip]');
if(!el){tip.style.display='none';return;}
tip.textContent=el.getAttribute('data-tip');tip.style.display='block';});
document.addEventListener('mousemove',function(e){
tip.style.left=(e.pageX+14)+'px';tip.style.top=(e.pageY+14)+'px';});
})();"""

_JS_HASH = base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode()
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{_JS_HASH}'")


def render(records, title=None, saved_options=None):
    """The report page of ``records`` (`read_metrics`'s list) as HTML.
    ``saved_options``: a run file's options, shown when no run line has
    them."""
    report = build(records)
    if title is None:
        job = str(report.field("job", "") or "")
        title = f"localcluster report: {job}" if job else "localcluster report"
    cards = [runs_card(report)]
    if report.epochs:
        cards += [metric_cards(report), throughput_card(report),
                  seconds_card(report), simulated_card(report),
                  process_cards(report), restarts_card(report),
                  checkpoints_card(report)]
    else:
        cards.append('<section class="card"><h2>Epochs</h2><p class="muted">'
                     'no epoch has finished yet</p></section>')
        if any(r.restarts for r in report.runs):
            cards.append(restarts_card(report))
    cards.append(options_card(report, saved_options))
    if report.epochs:
        cards.append(epoch_tables(report))
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<title>{esc(title)}</title><style>{_CSS}</style></head><body>'
        + header(report, title) + "<main>" + "".join(cards) + "</main>"
        f'<footer>localcluster {esc(__version__)} \u00b7 {len(records)} '
        f'records \u00b7 generated {esc(generated)}</footer>'
        f"<script>{_JS}</script></body></html>\n")


def find_metrics(path):
    """``path`` (a checkpoint directory or its metrics.jsonl) ->
    ``(metrics file, directory)``.  FileNotFoundError, with a message
    saying what to give instead, when there is none."""
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied", path)
        metrics = os.path.join(path, METRICS_FILE)
        if not os.path.isfile(metrics):
            raise FileNotFoundError(
                f"{path} has no {METRICS_FILE}: it is written by "
                "`python -m localcluster.run` runs from this version on; "
                "give the --checkpoint-dir of such a run")
        return metrics, path
    if os.path.isfile(path):
        return path, os.path.dirname(os.path.abspath(path))
    raise FileNotFoundError(
        f"{path} does not exist; give a run's checkpoint directory "
        f"(its --checkpoint-dir) or the {METRICS_FILE} in it")


def write_report(records_or_dir, path, title=None):
    """Write the report page to ``path`` (atomically) and return ``path``.
    ``records_or_dir``: a list of records, a checkpoint directory, or a
    metrics.jsonl.  FileNotFoundError when there is no metrics file;
    OSError when ``path`` cannot be written."""
    saved = None
    if isinstance(records_or_dir, (str, os.PathLike)):
        metrics, directory = find_metrics(os.fspath(records_or_dir))
        records = read_metrics(metrics)
        saved = saved_options(directory)
    else:
        records = list(records_or_dir)
    return _write(render(records, title, saved), os.fspath(path))


def _write(page, path):
    """Write ``page`` to ``path`` atomically (never a half page there)."""
    atomic_write(path, lambda f: f.write(page), mode=0o644, binary=False)
    return path


def _parser():
    parser = OneLineParser(
        prog="python -m localcluster.report",
        description="Write one self-contained HTML page showing the runs "
                    "recorded in a checkpoint directory's metrics.jsonl.")
    parser.add_argument("path", metavar="CKPT_DIR",
                        help="a run's --checkpoint-dir, or its metrics.jsonl")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help=f"where to write the page (default: "
                             f"CKPT_DIR/{REPORT_FILE})")
    parser.add_argument("--title", help="the page's title")
    return parser


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _main(args, parser.prog)
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted; no page written", file=sys.stderr)
        return 130


def _main(args, prog):
    try:
        metrics, directory = find_metrics(args.path)
        records = read_metrics(metrics)
        if not records:
            raise FileNotFoundError(
                f"{metrics} holds no record of a run: it is not a "
                f"{METRICS_FILE} (a run writes its first line as it "
                "starts); give a run's checkpoint directory or its "
                f"{METRICS_FILE}")
    except FileNotFoundError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: {args.path} cannot be read ({exc.strerror or exc}); "
              "give a readable metrics file", file=sys.stderr)
        return 2
    output = args.output or os.path.join(directory, REPORT_FILE)
    page = render(records, args.title, saved_options(directory))
    try:
        _write(page, output)
    except OSError as exc:
        print(f"{prog}: {output} cannot be written "
              f"({exc.strerror or exc}); pass -o with a writable path",
              file=sys.stderr)
        return 1
    print(output)
    return 0

