"""The report's charts as inline SVG, drawn in Python so that they show in
any browser, without scripts and without the network: line charts (with
gaps, shaded min-max bands and vertical markers) and stacked bar charts,
each with axes, ticks and units.

Every text that reaches the SVG goes through `esc`; hover details are
``<title>`` children (a browser shows them natively; the page's little
script shows them as a styled tooltip).  Charts carry ``class="chart"``
and their lines ``data-series``, bars ``class="bar"``, so a test can find
and measure them.
"""

import html
import math

__all__ = ["esc", "Series", "Band", "line_chart", "bar_chart", "fmt_value",
           "fmt_bytes", "NODE_COLORS", "RUN_COLORS", "node_color",
           "run_color"]

W, H = 600, 270
LEFT, RIGHT, TOP, BOTTOM = 64, 18, 22, 42

#: one color per node, in the order nodes are first seen (then repeated)
NODE_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
               "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#3d8fd1",
               "#86bc86", "#d37295"]
#: one color per run of the file
RUN_COLORS = ["#2563eb", "#c2410c", "#15803d", "#7e22ce", "#0e7490",
              "#be123c", "#4d7c0f", "#a16207"]
INK, MUTED, GRID = "#1f2937", "#6b7280", "#e5e7eb"
MARKER = {"run": "#7c3aed", "restart": "#dc2626"}


def esc(text):
    """``text`` safe inside HTML and SVG text and quoted attributes."""
    return html.escape(str(text), quote=True)


def node_color(index):
    return NODE_COLORS[index % len(NODE_COLORS)]


def run_color(index):
    return RUN_COLORS[index % len(RUN_COLORS)]


class Series:
    """A line: ``segments`` of ``(x, y or None, tip)`` (None: a gap)."""

    def __init__(self, name, color, segments, width=2.0, dots=True,
                 dash=None):
        self.name, self.color, self.segments = name, color, segments
        self.width, self.dots, self.dash = width, dots, dash


class Band:
    """A shaded area between ``low`` and ``high``: points ``(x, low,
    high)``."""

    def __init__(self, name, color, points):
        self.name, self.color, self.points = name, color, points


# -- numbers ------------------------------------------------------------------------

_BYTES = [(2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"),
          (2 ** 10, "KiB"), (1, "B")]


def fmt_bytes(value):
    for size, name in _BYTES:
        if abs(value) >= size or size == 1:
            return f"{_short(value / size)} {name}"


def _short(value):
    """A number in at most four significant digits, without noise."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e4 <= magnitude < 1e15:
        return f"{value:,.0f}"
    if magnitude >= 1e4 or magnitude < 1e-3:
        text = f"{value:.3g}"
        return text.replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")
    digits = max(0, 3 - int(math.floor(math.log10(magnitude))))
    return f"{value:.{digits}f}".rstrip("0").rstrip(".")


def fmt_value(value, unit=""):
    """A value as the tooltips and tables show it, with its unit."""
    if value is None:
        return "-"
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "rec/s":
        return f"{value:,.0f} rec/s"
    text = _short(value)
    return f"{text} {unit}" if unit and unit != "%" else text + unit


def _tick_text(value, step, unit):
    if unit == "%":
        return f"{_tick_number(value, step)}%"
    if unit == "rec/s" or abs(value) >= 1e4:
        for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(value) >= size:
                return _tick_number(value / size, step / size) + suffix
    return _tick_number(value, step)


def _tick_number(value, step):
    if abs(value) < step * 1e-6:
        return "0"
    if step >= 1 and float(value).is_integer():
        return f"{value:.0f}"
    decimals = max(0, -int(math.floor(math.log10(step))) + 1)
    text = f"{value:.{decimals}f}".rstrip("0").rstrip(".")
    return text if len(text) <= 7 else f"{value:.2g}"


def nice_ticks(low, high, count=5):
    """About ``count`` round ticks covering ``low..high``: ``(ticks,
    step)`` with the step 1, 2 or 5 times a power of ten."""
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(low / step + 1e-9) * step
    ticks, value = [], first
    while value < high + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks, step


# -- scales -------------------------------------------------------------------------

class _Linear:
    def __init__(self, low, high, start, end):
        self.low, self.high, self.start, self.end = low, high, start, end

    def __call__(self, value):
        span = (self.high - self.low) or 1.0
        return self.start + (value - self.low) / span * (self.end - self.start)


class _Log(_Linear):
    def __call__(self, value):
        return super().__call__(math.log10(max(value, 1e-300)))


def _y_axis(values, unit, zero):
    """``(scale, ticks, labels, log)`` for the values of a chart."""
    low, high = min(values), max(values)
    if unit != "bytes" and low > 0 and high / low >= 50:
        low_exp = math.floor(math.log10(low))
        high_exp = math.ceil(math.log10(high))
        scale = _Log(low_exp, high_exp, H - BOTTOM, TOP)
        every = max(1, math.ceil((high_exp - low_exp) / 6))
        ticks = [10.0 ** e for e in range(low_exp, high_exp + 1, every)]
        return scale, ticks, [_short(t) for t in ticks], True
    if zero:
        low, high = min(low, 0.0), max(high, 0.0)
    if unit == "bytes":
        size, name = next(s for s in _BYTES if high >= s[0] or s[0] == 1)
        ticks, step = nice_ticks(low / size, high / size)
        labels = [f"{_tick_number(t, step)} {name}" for t in ticks]
        ticks = [t * size for t in ticks]
    else:
        ticks, step = nice_ticks(low, high)
        labels = [_tick_text(t, step, unit) for t in ticks]
    return _Linear(ticks[0], ticks[-1], H - BOTTOM, TOP), ticks, labels, False


def _x_axis(xs, epochs, x_range=None):
    low, high = x_range or (min(xs), max(xs))
    if epochs:
        low, high = low - 0.5, high + 0.5
        ticks, step = nice_ticks(low, high, 8)
        step = max(1, step)
        ticks = [t for t in _int_ticks(low, high, step)]
        return _Linear(low, high, LEFT, W - RIGHT), ticks, step
    ticks, step = nice_ticks(min(low, 0.0), high, 6)
    return _Linear(ticks[0], ticks[-1], LEFT, W - RIGHT), ticks, step


def _int_ticks(low, high, step):
    step = int(math.ceil(step))
    first = int(math.ceil(low / step)) * step
    return [t for t in range(first, int(math.floor(high)) + 1, step)
            if t >= low]


# -- drawing ------------------------------------------------------------------------

def _frame(x, xticks, xstep, y, yticks, ylabels, x_label, y_label, log):
    out = []
    for tick, label in zip(yticks, ylabels):
        ty = y(tick)
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{ty:.1f}" '
                   f'y2="{ty:.1f}" stroke="{GRID}"/>')
        out.append(f'<text x="{LEFT - 6}" y="{ty + 4:.1f}" '
                   f'text-anchor="end" class="tick">{esc(label)}</text>')
    for tick in xticks:
        tx = x(tick)
        out.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{H - BOTTOM}" '
                   f'y2="{H - BOTTOM + 4}" stroke="{MUTED}"/>')
        out.append(f'<text x="{tx:.1f}" y="{H - BOTTOM + 16}" '
                   f'text-anchor="middle" class="tick">'
                   f'{esc(_tick_number(tick, xstep))}</text>')
    out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" '
               f'y2="{H - BOTTOM}" stroke="{MUTED}"/>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 6}" '
               f'text-anchor="middle" class="axis">{esc(x_label)}</text>')
    if log:
        y_label = f"{y_label} (log scale)"
    out.append(f'<text transform="translate(14 {(TOP + H - BOTTOM) / 2}) '
               f'rotate(-90)" text-anchor="middle" class="axis">'
               f'{esc(y_label)}</text>')
    return out


def _markers(x, markers):
    out, last_label = [], -1e9
    for mx, label, kind, tip in sorted(markers, key=lambda m: m[0]):
        px = x(mx)
        if not LEFT <= px <= W - RIGHT:
            continue
        color = MARKER.get(kind, MUTED)
        out.append(f'<g class="marker"><title>{esc(tip)}</title>'
                   f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" '
                   f'y2="{H - BOTTOM}" stroke="{color}" stroke-width="1.5" '
                   f'stroke-dasharray="4 3"/>'
                   f'<rect x="{px - 4:.1f}" y="{TOP}" width="8" '
                   f'height="{H - BOTTOM - TOP}" fill="transparent"/>')
        if px - last_label > 46:
            last_label = px
            out.append(f'<text x="{px + 3:.1f}" y="{TOP - 6}" '
                       f'class="mlabel" fill="{color}">{esc(label)}</text>')
        out.append('</g>')
    return out


def _svg(parts, label):
    return (f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" '
            f'aria-label="{esc(label)}" xmlns="http://www.w3.org/2000/svg">'
            + "".join(parts) + "</svg>")


def _pieces(segment):
    """A segment split at its gaps: runs of points with a value."""
    piece = []
    for point in segment:
        if point[1] is None:
            if piece:
                yield piece
            piece = []
        else:
            piece.append(point)
    if piece:
        yield piece


def line_chart(series, *, x_label, y_label, unit="", markers=(), bands=(),
               epochs=True, zero=True, x_range=None):
    """A line chart of ``series`` (and ``bands`` under them); x is an
    epoch axis (integer ticks) or, with ``epochs=False``, seconds;
    ``x_range``: ``(first, last)`` x to show (default: the data's).
    ``markers``: ``(x, label, kind, tip)`` vertical dashed lines."""
    xs = [p[0] for s in series for seg in s.segments for p in seg
          if p[1] is not None] + [p[0] for b in bands for p in b.points]
    ys = [p[1] for s in series for seg in s.segments for p in seg
          if p[1] is not None]
    ys += [v for b in bands for p in b.points for v in p[1:3]]
    if not xs:
        return '<p class="empty">no values to draw</p>'
    x, xticks, xstep = _x_axis(xs, epochs, x_range)
    y, yticks, ylabels, log = _y_axis(ys, unit, zero)
    parts = _frame(x, xticks, xstep, y, yticks, ylabels, x_label, y_label,
                   log)
    for band in bands:
        top = " ".join(f"{x(p[0]):.1f},{y(p[2]):.1f}" for p in band.points)
        bottom = " ".join(f"{x(p[0]):.1f},{y(p[1]):.1f}"
                          for p in reversed(band.points))
        parts.append(f'<polygon class="band" data-series="{esc(band.name)}"'
                     f' points="{top} {bottom}" fill="{band.color}" '
                     f'fill-opacity="0.18" stroke="none"/>')
    parts += _markers(x, markers)
    for s in series:
        parts += _line(s, x, y)
    return _svg(parts, y_label)


def _line(series, x, y):
    out = []
    dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
    dots = series.dots and sum(len(g) for g in series.segments) <= 80
    for segment in series.segments:
        for piece in _pieces(segment):
            points = " ".join(f"{x(px):.1f},{y(py):.1f}"
                              for px, py, _ in piece)
            out.append(f'<polyline data-series="{esc(series.name)}" '
                       f'points="{points}" fill="none" '
                       f'stroke="{series.color}" '
                       f'stroke-width="{series.width}" '
                       f'stroke-linejoin="round"{dash}/>')
            for px, py, tip in piece:
                if not tip:
                    continue
                radius, opacity = (3, 1) if dots else (4, 0)
                out.append(f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" '
                           f'r="{radius}" fill="{series.color}" '
                           f'fill-opacity="{opacity}" class="dot">'
                           f'<title>{esc(tip)}</title></circle>')
    return out


def bar_chart(groups, *, stacks, x_label, y_label, unit="", markers=(),
              x_range=None):
    """Stacked bars per epoch: ``groups`` of ``(epoch, bars)``, a bar a
    list of ``(value or None, tip)`` -- one per ``stacks`` entry (``(name,
    color)``).  Bars of one epoch (it ran more than once) stand side by
    side."""
    totals = [sum(v for v, _ in bar if v is not None)
              for _, bars in groups for bar in bars]
    if not totals:
        return '<p class="empty">no values to draw</p>'
    x, xticks, xstep = _x_axis([g[0] for g in groups], True, x_range)
    yticks, ystep = nice_ticks(0.0, max(totals) or 1.0)
    y = _Linear(0.0, yticks[-1], H - BOTTOM, TOP)
    parts = _frame(x, xticks, xstep, y, yticks,
                   [_tick_text(t, ystep, unit) for t in yticks],
                   x_label, y_label, False)
    slot = (x(1) - x(0)) * 0.8
    for epoch, bars in groups:
        width = slot / len(bars)
        for i, bar in enumerate(bars):
            left = x(epoch) - slot / 2 + i * width
            base = 0.0
            for (value, tip), (_, color) in zip(bar, stacks):
                if value is None or value <= 0:
                    continue
                top, bottom = y(base + value), y(base)
                base += value
                parts.append(f'<rect class="bar" x="{left:.2f}" '
                             f'y="{top:.2f}" width="{max(width - 1, 0.5):.2f}"'
                             f' height="{max(bottom - top, 0.5):.2f}" '
                             f'fill="{color}"><title>{esc(tip)}</title>'
                             '</rect>')
    parts += _markers(x, markers)
    return _svg(parts, y_label)
