"""The report page in a real browser (headless Chromium over the DevTools
protocol, `_chromium`): it loads without a console error, exception or
policy violation, every chart is laid out with real geometry, the hover
tooltips work, nothing injected runs, and a screenshot comes out.

Skipped when there is no Chromium (``apt-get install -y chromium``)."""

import pytest

import _chromium
import _reportrecords as R
from localcluster.cli.report import write_report

pytestmark = pytest.mark.skipif(
    _chromium.find_binary() is None,
    reason=f"no Chromium at {_chromium.BINARY}; {_chromium.INSTALL}")

WIDTH, HEIGHT = 1280, 900

#: per chart: its label, its box, and the geometry of what it draws
GEOMETRY = """Array.from(document.querySelectorAll('svg.chart')).map(svg => {
  const box = svg.getBoundingClientRect();
  const lines = Array.from(svg.querySelectorAll('polyline')).map(p => ({
    series: p.dataset.series, points: p.points.numberOfItems,
    width: p.getBBox().width, height: p.getBBox().height}));
  const bars = Array.from(svg.querySelectorAll('rect.bar')).map(r => {
    const b = r.getBBox(); return b.width * b.height;});
  return {label: svg.getAttribute('aria-label'), width: box.width,
          height: box.height, lines: lines, bars: bars,
          bands: svg.querySelectorAll('polygon.band').length,
          dots: svg.querySelectorAll('circle').length};
})"""

TOOLTIP = """(() => {
  const dot = document.querySelector('svg.chart circle');
  dot.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
  const tip = document.querySelector('.tip');
  return {shown: getComputedStyle(tip).display, text: tip.textContent};
})()"""


FAMILY_TIP = """(() => {
  const svg = document.querySelector('svg.chart[aria-label="train_loss_*"]');
  svg.querySelector('circle').dispatchEvent(
    new MouseEvent('mouseover', {bubbles: true}));
  const tip = document.querySelector('.tip');
  return {shown: getComputedStyle(tip).display, text: tip.textContent};
})()"""


@pytest.fixture
def browser():
    """A fresh Chromium per test: the suite checks after every test that
    it left no process behind."""
    with _chromium.Chromium(timeout=30) as chromium:
        yield chromium


def _open(browser, tmp_path, records):
    path = write_report(records, tmp_path / "report.html")
    browser.problems.clear()
    return browser.open(f"file://{path}", WIDTH, HEIGHT)


def test_the_page_loads_cleanly_and_every_chart_has_geometry(browser,
                                                             tmp_path):
    page = _open(browser, tmp_path, R.resumed_history())
    charts = page.evaluate(GEOMETRY)
    assert browser.problems == []
    labels = [c["label"] for c in charts]
    assert labels == ["loss", "train_loss_0", "records / s", "seconds",
                      "CPU", "resident memory"]
    for chart in charts:
        assert chart["width"] > 300 and chart["height"] > 100, chart
        assert all(line["points"] > 0 for line in chart["lines"]), chart
        assert all(line["width"] > 0 for line in chart["lines"]
                   if line["points"] > 1), chart
    by_label = {c["label"]: c for c in charts}
    # 7 epoch records: 3 of run 1, 2 + 2 of run 2 around its restart
    assert sum(li["points"] for li in by_label["loss"]["lines"]) == 7
    assert by_label["loss"]["dots"] == 7
    assert len(by_label["seconds"]["bars"]) == 14
    assert all(area > 0 for area in by_label["seconds"]["bars"])
    tip = page.evaluate(TOOLTIP)
    assert tip["shown"] == "block" and "epoch 1" in tip["text"]


def test_injected_markup_never_runs_and_many_nodes_render(browser,
                                                          tmp_path):
    nodes = ["<script>alert(1)</script>",
             '<img src=x onerror="alert(2)">'] + [f"n{i}" for i in range(254)]
    records = R.with_family(R.one_run(nodes=nodes, epochs=3, end="error"),
                            254)
    records[-1]["error"] = '<script>alert(3)</script>' * 1000
    page = _open(browser, tmp_path, records)
    assert browser.problems == []
    assert not [e for e in browser._events
                if e.get("method") == "Page.javascriptDialogOpening"]
    assert page.evaluate("document.querySelectorAll('script').length") == 1
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    charts = {c["label"]: c for c in page.evaluate(GEOMETRY)}
    # 254 train_loss_<i> share one chart: a band and its median
    assert list(charts) == ["loss", "train_loss_*", "records / s",
                            "seconds", "CPU", "resident memory"]
    cpu, family = charts["CPU"], charts["train_loss_*"]
    assert cpu["height"] > 100
    assert {li["series"] for li in cpu["lines"]} == {"median", "n253"}
    assert [li["series"] for li in family["lines"]] == ["median"]
    assert family["lines"][0]["points"] == 3
    assert family["lines"][0]["height"] > 10 and family["bands"] == 1
    tip = page.evaluate(FAMILY_TIP)
    assert tip["shown"] == "block"
    assert "(train_loss_0)" in tip["text"] and "(train_loss_253)" in tip["text"]


def test_a_screenshot_is_a_png_of_the_viewport(browser, tmp_path):
    page = _open(browser, tmp_path, R.one_run(epochs=4))
    png = page.screenshot()
    shot = tmp_path / "report.png"
    shot.write_bytes(png)
    assert _chromium.png_size(shot.read_bytes()) == (WIDTH, HEIGHT)
    assert browser.problems == []
