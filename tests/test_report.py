"""The run report (``python -m localcluster.report``): what the page says
about each run, that nothing from the records can inject markup, that it
stands alone (no network), that it survives odd files, and the command
line's exit statuses and one-line errors."""

import hashlib
import base64
import json
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

import _reportrecords as R
from localcluster.cli import report as rpt
from localcluster.cli.htmlreport.data import KILLED, build, metric_charts

EVIL = "<script>alert(1)</script>"


def _svgs(page):
    return re.findall(r'<svg class="chart".*?</svg>', page, re.S)


def _points(svg, series=None):
    """How many points the polylines (of ``series``) of a chart have."""
    total = 0
    for attrs, points in re.findall(
            r'<polyline ([^>]*?)points="([^"]*)"', svg):
        if series is None or f'data-series="{series}"' in attrs:
            total += len(points.split())
    return total


def _chart(page, label):
    return next(s for s in _svgs(page) if f'aria-label="{label}"' in s)


# -- what the page says -------------------------------------------------------------

def test_each_run_gets_its_status_and_a_run_without_end_line_is_killed():
    records = (R.one_run(run_id="a", end="ok")
               + R.one_run(run_id="b", end="error", t=R.T0 + 10)
               + R.one_run(run_id="c", end="interrupted", t=R.T0 + 20)
               + R.one_run(run_id="d", end=None, t=R.T0 + 30))
    report = build(records)
    assert [r.status for r in report.runs] == ["ok", "error", "interrupted",
                                               KILLED]
    page = rpt.render(records)
    for status in ("ok", "error", "interrupted", "did not end (killed?)"):
        assert f">{status}</span>" in page


def test_a_resumed_run_continues_the_epoch_axis_with_its_markers():
    records = R.resumed_history()
    report = build(records)
    assert [r.label for r in report.runs] == ["run 1", "run 2"]
    # run 1 (epochs 1-3), run 2 before (4-5) and after its restart (5-6)
    assert [[e["epoch"] for e in seg] for _, seg in report.segments] == \
        [[1, 2, 3], [4, 5], [5, 6]]
    assert [(x, kind) for x, _, kind, _ in report.markers()] == \
        [(3.5, "run"), (4.5, "restart")]
    page = rpt.render(records)
    loss = _chart(page, "loss")
    assert _points(loss) == 7                  # every epoch record, once
    assert _points(loss, "run 1") == 3
    assert "resumed from epoch 4" in page and "died (SIGKILL)" in page
    # the run's epochs, redone after the restart, stand side by side
    assert len(re.findall(r'class="bar"', _chart(page, "seconds"))) == 14


def test_every_metric_gets_a_chart_and_the_epoch_table_every_number():
    records = R.one_run(epochs=4, simulated=2.5)
    page = rpt.render(records)
    labels = re.findall(r'aria-label="([^"]*)"', page)
    assert labels[:2] == ["loss", "train_loss_0"]
    assert {"records / s", "seconds", "simulated seconds", "CPU",
            "resident memory"} <= set(labels)
    table = page[page.index("4 epoch records"):]
    loss3 = R.epoch_line("x", 3, 4, 0, [], 0)["metrics"]["loss"]
    assert f"{loss3:.4g}"[:5] in table      # the loss of epoch 3
    assert "16 process samples" in page


def _card(page, title):
    """The card titled ``title``: its note, chart and legend."""
    start = page.index(f"<h2>{title}</h2>")
    return page[start:page.index("</section>", start)]


def _metric_labels(page):
    labels = re.findall(r'aria-label="([^"]*)"', page)
    return labels[:labels.index("records / s")]


@pytest.mark.parametrize("count", [2, 12])
def test_a_family_of_numbered_metrics_shares_one_chart_a_line_each(count):
    records = R.with_family(R.one_run(epochs=3), count)
    page = rpt.render(records)
    assert _metric_labels(page) == ["loss", "train_loss_*"]
    card = _card(page, "train_loss_*")
    members = [f"train_loss_{i}" for i in range(count)]
    lines = re.findall(r'data-series="([^"]*)" points="[^"]*" fill="none" '
                       r'stroke="(#\w+)"', card)
    assert [name for name, _ in lines] == members      # in numeric order
    assert len({color for _, color in lines}) == count
    keys = re.findall(r'class="key line" style="--c:(#\w+)"><i></i>([^<]*)',
                      card)
    assert keys == [(color, name) for name, color in lines]
    assert "<title>train_loss_1 \u00b7 run 1 epoch 2\n" in card
    assert 'class="band"' not in card


def test_more_than_12_members_are_a_band_and_a_median_naming_the_extremes():
    records = R.with_family(R.one_run(epochs=3), 32)
    page = rpt.render(records)
    assert _metric_labels(page) == ["loss", "train_loss_*"]
    card = _card(page, "train_loss_*")
    assert card.count('class="band"') == 1
    assert _points(card) == _points(card, "median") == 3   # no member line
    assert "the 32 metrics train_loss_&lt;n&gt;" in card
    assert "min\u2013max of 32 metrics" in card
    tips = re.findall(r"<title>(run 1 \u00b7 epoch 2\n[^<]*)</title>", card)
    assert len(tips) == 1
    assert "(train_loss_0)" in tips[0] and "(train_loss_31)" in tips[0]


def test_a_family_across_runs_and_a_restart_has_a_band_per_segment():
    page = rpt.render(R.with_family(R.resumed_history(), 32))
    card = _card(page, "train_loss_*")
    assert card.count('class="band"') == 3     # run 1, run 2 around its restart
    assert _points(card, "median") == 7        # every epoch record, once
    assert ">restart</span>" in card and ">run start</span>" in card


def test_the_epoch_table_keeps_every_member_in_numeric_order():
    records = R.with_family(R.one_run(epochs=3), 32)
    for record in records[1:4]:         # the job's order: loss last
        record["metrics"] = dict(reversed(record["metrics"].items()))
    page = rpt.render(records)
    table = page[page.index("3 epoch records"):]
    head = re.findall(r"<th>([^<]*)</th>", table)
    metrics = head[head.index("restarts") + 1:head.index("checkpoint error")]
    assert metrics == ["loss"] + [f"train_loss_{i}" for i in range(32)]
    last = records[2]["metrics"]["train_loss_31"]       # epoch 2
    assert f"{last:.4g}"[:5] in table


def test_which_names_make_a_family():
    # a lone x_1 is a chart of its own; digits with leading zeros count
    # (zero-padded node numbers: worker_01); a stem needs a character and
    # the number must end the name
    names = ["acc", "x_1", "w_10", "loss", "w_02", "w_01", "_3", "_4",
             "z_1a", "z_2a", "top_1"]
    assert metric_charts(names) == [
        ("loss", ["loss"]), ("acc", ["acc"]), ("x_1", ["x_1"]),
        ("w_*", ["w_01", "w_02", "w_10"]), ("_3", ["_3"]), ("_4", ["_4"]),
        ("z_1a", ["z_1a"]), ("z_2a", ["z_2a"]), ("top_1", ["top_1"])]
    # x_1 and x_01 are one family; x_2 sorts before x_10
    assert metric_charts(["x_10", "x_2", "x_01", "x_1"]) == \
        [("x_*", ["x_01", "x_1", "x_2", "x_10"])]


def test_the_job_options_come_from_the_run_file_when_no_run_line_has_them(
        tmp_path):
    records = [r for r in R.one_run(epochs=2) if r["kind"] != "run"]
    R.write(tmp_path / "metrics.jsonl", records)
    (tmp_path / "localcluster-run.json").write_text(json.dumps(
        {"job": "mine.py:build", "seed": 1234}))
    out = rpt.write_report(str(tmp_path), tmp_path / "r.html")
    page = open(out).read()
    assert "<code>seed</code>" in page and "1234" in page


# -- nothing from the records reaches the page unescaped ---------------------------

def test_names_jobs_metrics_and_errors_are_escaped():
    nodes = [EVIL, 'a"b&c', "trainer_0"]
    records = R.one_run(nodes=nodes, epochs=2, end="error",
                        metrics={EVIL: 1.0, "loss": 0.5})
    records[0]["job"] = f"job{EVIL}"
    records[-1]["error"] = f'<img src=x onerror="alert(2)">{EVIL}'
    records.insert(2, {"kind": "restart", "run": records[0]["run"],
                       "time": R.T0, "resumed_from": 1, "error": EVIL})
    page = rpt.render(records)
    assert "alert(1)</script>" not in page and "<img" not in page
    assert page.count("<script") == 1          # the page's own, only
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a&quot;b&amp;c" in page


def test_the_page_stands_alone_and_only_its_own_script_may_run():
    page = rpt.render(R.resumed_history())
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)
    assert not re.search(r"<(link|img|iframe)|\ssrc=|@import|url\(", page)
    script = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest())
    csp = re.search(r'Content-Security-Policy" content="([^"]*)"',
                    page).group(1)
    assert f"script-src 'sha256-{digest.decode()}'" in csp
    assert "default-src 'none'" in csp


def test_a_huge_error_is_clipped_and_kept_behind_details():
    records = R.one_run(epochs=1, end="error")
    records[-1]["error"] = "boom: first line\n" + "x" * 5_000_000
    page = rpt.render(records)
    assert len(page) < 200_000
    assert "boom: first line" in page
    assert re.search(r"\(4,98\d,\d+ more characters\)", page)


# -- odd files ------------------------------------------------------------------------

def test_an_empty_file_and_a_lone_run_line_still_make_a_page(tmp_path):
    empty = rpt.render([])
    assert "no runs recorded in this file yet" in empty
    lone = rpt.render(R.one_run(epochs=2, end=None)[:1])
    assert "no epoch has finished yet" in lone
    assert f">{KILLED}</span>" in lone
    assert not _svgs(lone)


def test_null_and_nan_metrics_are_gaps_not_errors():
    records = R.one_run(epochs=4)
    records[2]["metrics"] = {"loss": None, "train_loss_0": "n/a"}
    records[3]["metrics"]["loss"] = float("nan")   # not from JSON: a float
    records[1]["records_per_s"] = float("inf")
    page = rpt.render(records)
    loss = _chart(page, "loss")
    assert _points(loss) == 2                      # epochs 1 and 4
    assert len(re.findall("<polyline", loss)) == 2  # the gap splits it
    assert _points(_chart(page, "records / s")) == 3


JUNK = [None, "x", float("nan"), float("inf"), -1, 0, 1e308, -1e308, 10**400,
        5e-324, [], {}, True, {"a": "b"}, [1, 2], EVIL]
HISTORY = R.resumed_history() + R.one_run(
    epochs=2, run_id="z", end="error", t=R.T0 + 300, first=7, simulated=1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(HISTORY) - 1),
                          st.integers(0, 10 ** 6), st.integers(0, 10 ** 6),
                          st.sampled_from(JUNK)), max_size=8))
def test_any_field_of_any_type_is_shown_as_absent_never_an_error(changes):
    records = json.loads(json.dumps(HISTORY))
    for index, key, inner, junk in changes:
        record = records[index]
        name = sorted(record)[key % len(record)]
        value = record[name]
        if isinstance(value, dict) and value and inner % 2:
            sub = sorted(value)[inner % len(value)]
            if isinstance(value[sub], dict) and value[sub]:
                value[sub][sorted(value[sub])[inner % len(value[sub])]] = junk
            else:
                value[sub] = junk
        else:
            record[name] = junk
    page = rpt.render(records)
    assert "<h2>Runs</h2>" in page and page.count("<script") == 1


def test_one_epoch_only_draws_a_dot_per_chart():
    page = rpt.render(R.one_run(epochs=1))
    loss = _chart(page, "loss")
    assert _points(loss) == 1 and loss.count("<circle") == 1


def test_many_nodes_are_bands_a_median_and_the_slowest_node_named():
    nodes = [f"n{i}" for i in range(256)]
    records = R.one_run(nodes=nodes, epochs=3)
    for record in records[1:4]:                  # n17 takes longest
        record["nodes"]["n17"]["seconds"] = 9.0
    report = build(records)
    assert report.slowest == "n17"
    page = rpt.render(records)
    cpu = _chart(page, "CPU")
    assert 'class="band"' in cpu
    assert _points(cpu, "median") == 3 and _points(cpu, "n17") == 3
    assert _points(cpu) == 6                     # no line per node
    assert "slowest node: n17" in page
    legend = page[page.index('aria-label="CPU"'):]
    legend = legend[:legend.index("</section>")]
    assert legend.count('class="key') == 3


def test_a_few_nodes_get_a_line_each_in_their_own_color():
    page = rpt.render(R.one_run(epochs=3))
    rss = _chart(page, "resident memory")
    for node in ("reader", "trainer_0", "trainer_1", "ps"):
        assert _points(rss, node) == 3
    colors = re.findall(r'data-series="(\w+)" points="[^"]*" fill="none" '
                        r'stroke="(#\w+)"', rss)
    assert len(set(colors)) == 4 and len({c for _, c in colors}) == 4
    assert "MiB" in rss                          # memory has its unit


def test_a_torn_last_line_is_skipped(tmp_path):
    path = R.write(tmp_path / "metrics.jsonl", R.one_run(epochs=2))
    with open(path, "a") as f:
        f.write('{"kind": "epoch", "run": "1763900000.000-42')
    out = rpt.write_report(str(path), tmp_path / "r.html")
    assert _points(_chart(open(out).read(), "loss")) == 2


# -- the command line ----------------------------------------------------------------

def test_the_cli_writes_report_html_into_the_directory(tmp_path, capsys):
    R.write(tmp_path / "metrics.jsonl", R.one_run(epochs=2))
    assert rpt.main([str(tmp_path)]) == 0
    written = str(tmp_path / "report.html")
    assert capsys.readouterr().out.strip() == written
    assert "<svg" in open(written).read()
    assert [p.name for p in tmp_path.iterdir()
            if p.name.endswith(".tmp")] == []


def test_the_cli_takes_a_metrics_file_and_an_output(tmp_path, capsys):
    path = R.write(tmp_path / "metrics.jsonl", R.one_run(epochs=2))
    out = tmp_path / "elsewhere.html"
    assert rpt.main([str(path), "-o", str(out), "--title", "T<1>"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert "<title>T&lt;1&gt;</title>" in out.read_text()


@pytest.mark.parametrize("case, status, says", [
    ("missing", 2, "does not exist"),
    ("no metrics", 2, "written by `python -m localcluster.run` runs"),
    ("unwritable", 1, "cannot be written"),
    ("bad option", 2, "unrecognized arguments"),
    ("not metrics", 2, "holds no record of a run"),   # was: exit 0, a page
])
def test_cli_errors_are_one_line_and_an_exit_status(tmp_path, case, status,
                                                    says):
    R.write(tmp_path / "metrics.jsonl", R.one_run(epochs=1))
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = {"missing": [str(tmp_path / "nope")],
            "no metrics": [str(empty)],
            "unwritable": [str(tmp_path), "-o",
                           str(tmp_path / "no" / "dir" / "r.html")],
            "bad option": [str(tmp_path), "--frobnicate"],
            "not metrics": [__file__, "-o", str(tmp_path / "r.html")]}[case]
    done = subprocess.run([sys.executable, "-m", "localcluster.report",
                           *argv], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == status
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr


# -- a real run ----------------------------------------------------------------------

def test_a_real_runs_directory_makes_a_report(tmp_path):
    ckpt = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, "-m", "localcluster.run", "--epochs", "2",
         "--checkpoint-dir", str(ckpt)], capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 0, done.stderr
    if not (ckpt / "metrics.jsonl").exists():
        pytest.skip("this run does not write metrics.jsonl yet")
    out = subprocess.run([sys.executable, "-m", "localcluster.report",
                          str(ckpt)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    page = (ckpt / "report.html").read_text()
    assert ">ok</span>" in page
    assert _points(_chart(page, "loss")) == 2
    assert os.path.getsize(ckpt / "report.html") > 0


def test_a_line_nested_past_the_parser_is_skipped_not_a_traceback(tmp_path):
    """A line of 100,000 nested lists (RecursionError in the parser) is a
    line that is not ours: skipped, and the report, ``ckpt ls`` and
    ``run --report`` read the rest."""
    path = tmp_path / "metrics.jsonl"
    R.write(path, R.one_run(epochs=2))
    with open(path, "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    from localcluster.cli.rundir.metrics import read_metrics
    assert [r["kind"] for r in read_metrics(path)] == \
        [r["kind"] for r in R.one_run(epochs=2)]
    assert rpt.main([str(tmp_path), "-o", str(tmp_path / "r.html")]) == 0


def test_an_unreadable_directory_is_said_so_not_a_missing_file(
        tmp_path, monkeypatch, capsys):
    R.write(tmp_path / "metrics.jsonl", R.one_run(epochs=1))
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False
                        if os.fspath(p) == str(tmp_path) else real(p, mode))
    assert rpt.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and "has no" not in err, err
