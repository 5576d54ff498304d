"""Line charts as inline SVG text, for the HTML report: no scripts, no dependencies.

``line_chart({"e-nodes": [5, 7, 7], "e-classes": [5, 6, 6]}, x_label=..., y_label=...)``
gives one ``<svg>`` element (inline in HTML: no namespace, nothing loaded): both axes from zero with round tick values, each axis labelled,
one ``<polyline>`` per series with one point per value (the value's index on the x axis), a
dot per point with its value as a tooltip, and a legend.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

from ir.errors import PurefxError

COLORS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00")
"""The series' colours, in order (then again from the first)."""


class PlotError(PurefxError):
    """A chart that cannot be drawn: no series, a series with no values, a value that is not a
    finite number at least zero."""


def nice_ceiling(value: float) -> float:
    """The least of 1, 2, 2.5, 5 times a power of ten that is >= ``value`` (1 for 0): the top
    of an axis whose ticks are round numbers. O(1)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * power * (1 + 1e-12):
            return step * power
    return 10.0 * power


def line_chart(
    series: Mapping[str, Sequence[float]],
    *,
    x_label: str,
    y_label: str,
    title: str = "",
    width: int = 520,
    height: int = 260,
    standalone: bool = False,
    zero: bool = True,
) -> str:
    """One ``<svg>`` element charting each of ``series`` (name -> values) against the values'
    index, ``0 .. len - 1``, on shared axes from zero.

    Parameters:
        series: the lines, in legend order; each value a finite number >= 0.
        x_label, y_label: the axis labels (escaped).
        title: the chart's accessible title (``<title>``), default the y label.
        width, height: the drawing's size in pixels.
        zero: the y axis starts at 0; else at a round number at or below the least value
            (growth from a large start is then visible).
        standalone: for an ``.svg`` file of its own: with the SVG namespace (which inline
            SVG in HTML does without).

    Returns:
        The SVG text: ``<polyline class="series-I" points="x,y ...">`` for the I-th series
        (one ``x,y`` pair per value), a ``<circle>`` per value with a ``<title>`` giving it,
        tick labels, both axis labels and a legend.

    Raises:
        PlotError: no series, an empty series, a negative or non-finite value (naming the
        series and the index).

    Complexity: O(total values).
    """
    if not series:
        raise PlotError("line_chart: no series to draw; pass {name: values}")
    for name, values in series.items():
        if not len(values):
            raise PlotError(f"line_chart: series {name!r} has no values")
        for i, v in enumerate(values):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise PlotError(
                    f"line_chart: series {name!r} value {i} is {v!r}; expected a finite "
                    "number >= 0"
                )
    left, right, top, bottom = 64, 16, 30, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    last = max(len(v) for v in series.values()) - 1
    x_top = max(1, last)
    y_lo, step, y_top = _y_axis(series, zero)

    def x_of(i: float) -> float:
        return left + plot_w * i / x_top

    def y_of(v: float) -> float:
        return top + plot_h * (1 - (v - y_lo) / (y_top - y_lo))

    space = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    out = [
        (f'<svg{space} class="chart" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" font-family="sans-serif">'),
        f"<title>{_e(title or y_label)}</title>",
        (f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fff" '
        'stroke="#d8dee6"/>'),
    ]
    parts = round((y_top - y_lo) / step)
    for k in range(parts + 1):  # y ticks: round numbers from the bottom to the top
        v = y_lo + step * k
        y = y_of(v)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                   'stroke="#eaeef2"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
                   f'fill="#5b6673">{_number(v)}</text>')
    step = max(1, math.ceil(x_top / 10))
    for i in range(0, x_top + 1, step):  # x ticks: the indices, at most about ten
        x = x_of(i)
        out.append(f'<line x1="{x:.1f}" y1="{top + plot_h}" x2="{x:.1f}" '
                   f'y2="{top + plot_h + 4}" stroke="#5b6673"/>')
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
                   f'font-size="11" fill="#5b6673">{i}</text>')
    out.append(f'<text class="x-label" x="{left + plot_w / 2:.1f}" y="{height - 6}" '
               f'text-anchor="middle" font-size="12">{_e(x_label)}</text>')
    out.append(f'<text class="y-label" x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" '
               f'font-size="12" transform="rotate(-90 14 {top + plot_h / 2:.1f})">'
               f"{_e(y_label)}</text>")
    for n, (name, values) in enumerate(series.items()):
        color = COLORS[n % len(COLORS)]
        points = " ".join(f"{x_of(i):.1f},{y_of(v):.1f}" for i, v in enumerate(values))
        out.append(f'<polyline class="series-{n}" fill="none" stroke="{color}" '
                   f'stroke-width="2" points="{points}"/>')
        for i, v in enumerate(values):
            out.append(f'<circle cx="{x_of(i):.1f}" cy="{y_of(v):.1f}" r="3" fill="{color}">'
                       f"<title>{_e(name)} at {i}: {_number(v)}</title></circle>")
        lx, ly = left + 10 + 120 * n, top - 12
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 18}" y2="{ly}" stroke="{color}" '
                   'stroke-width="2"/>')
        out.append(f'<text x="{lx + 24}" y="{ly + 4}" font-size="12">{_e(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _y_axis(series: Mapping[str, Sequence[float]], zero: bool) -> tuple[float, float, float]:
    """The y axis: ``(bottom, tick step, top)``, round numbers around the values, about four
    steps; steps of at least 1 where every value is an int."""
    values = [v for vs in series.values() for v in vs]
    high = max(values)
    low = 0.0 if zero else min(values)
    step = nice_ceiling((high - low) / 4) if high > low else nice_ceiling(high or 1) / 5
    if all(float(v).is_integer() for v in values):
        step = max(step, 1.0)
    bottom = 0.0 if zero else math.floor(low / step) * step
    top = max(bottom + step, math.ceil(high / step - 1e-9) * step)
    return bottom, step, top


def _number(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.3g}"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)
