"""Charts as inline SVG strings: lines over time and grouped horizontal bars.

The dashboard is served from machines without network access and must stay
readable in a headless browser's screenshot, so it draws its own SVG instead
of loading a JavaScript chart library. Every mark carries a ``<title>`` (a
tooltip in a browser) with its exact value.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from html import escape

WIDTH = 600
#: Space for axis labels and the legend around the plot area.
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 48, 28
NO_DATA = '<text x="{x}" y="{y}" text-anchor="middle" class="muted">no data yet</text>'


@dataclass(frozen=True)
class Series:
    """One line: ``(x, y)`` points in x order, drawn in ``color``."""

    name: str
    points: list[tuple[float, float]]
    color: str


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (so
    that the axis ticks are round numbers)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value)


def fmt(value: float) -> str:
    """A number as a person reads it: integers without decimals, else 3 digits."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _frame(title: str, height: int, body: list[str], legend: list[tuple[str, str]]) -> str:
    keys, x = [], LEFT
    for name, color in legend:
        if x + 24 + 7 * len(name) > WIDTH:  # the marks' tooltips still name the rest
            keys.append(f'<text x="{x}" y="39" class="small">…</text>')
            break
        keys.append(f'<rect x="{x}" y="30" width="10" height="10" fill="{color}"/>'
                    f'<text x="{x + 14}" y="39" class="small">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">'
            f'<text x="{LEFT}" y="18" class="title">{escape(title)}</text>'
            + "".join(keys) + "".join(body) + "</svg>")


def line_chart(title: str, series: list[Series], x_label: Callable[[float], str], *,
               unit: str = "", height: int = 240) -> str:
    """Lines sharing one x axis (e.g. window starts) and a y axis from zero."""
    xs = [x for s in series for x, _ in s.points]
    if not xs:
        return _frame(title, height, [NO_DATA.format(x=WIDTH // 2, y=height // 2)], [])
    x0, x1 = min(xs), max(xs)
    top = nice_ceiling(max(y for s in series for _, y in s.points))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, height - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (plot_w * (x - x0) / (x1 - x0) if x1 > x0 else plot_w / 2)

    def py(y: float) -> float:
        return TOP + plot_h * (1 - y / top)

    body = _y_axis(top, unit, py)
    ends = {x0: "start", (x0 + x1) / 2: "middle", x1: "end"} if x1 > x0 else {x0: "middle"}
    for x, anchor in ends.items():
        body.append(f'<text x="{px(x):.1f}" y="{height - 8}" text-anchor="{anchor}" '
                    f'class="small">{escape(x_label(x))}</text>')
    for s in series:
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        body.append(f'<polyline points="{path}" fill="none" stroke="{s.color}" '
                    f'stroke-width="2"/>')
        body += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{s.color}">'
                 f'<title>{escape(s.name)} at {escape(x_label(x))}: {fmt(y)}{unit}</title>'
                 f'</circle>' for x, y in s.points]
    return _frame(title, height, body, [(s.name, s.color) for s in series])


def _y_axis(top: float, unit: str, py: Callable[[float], float]) -> list[str]:
    lines = []
    ticks = 4 if f"{top:e}".startswith("2") else 5  # steps of 0.5 or 1 leading digit
    for i in range(ticks + 1):
        value = top * i / ticks
        y = py(value)
        lines.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'class="grid"/><text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" '
                     f'class="small">{fmt(value)}{unit}</text>')
    return lines


def bar_chart(title: str, groups: dict[str, dict[str, float]], colors: dict[str, str], *,
              unit: str = "") -> str:
    """Horizontal bars: one block per group (a row label), one bar per series
    of ``colors`` that the group has, each with its value written at its end."""
    bar, gap = 14, 10
    rows = sum(max(1, len(values)) for values in groups.values())
    height = TOP + rows * bar + len(groups) * gap + 8
    if not groups:
        return _frame(title, TOP + 60, [NO_DATA.format(x=WIDTH // 2, y=TOP + 30)], [])
    label_w = min(200, 12 + 7 * max(len(name) for name in groups))
    top = nice_ceiling(max((v for values in groups.values() for v in values.values()),
                           default=0))
    plot_w = WIDTH - LEFT - label_w - RIGHT - 40
    body, y = [], TOP
    for group, values in groups.items():
        body.append(f'<text x="{LEFT + label_w - 8}" y="{y + bar * max(1, len(values)) / 2 + 4}"'
                    f' text-anchor="end" class="label">{escape(_shorten(group, label_w))}</text>')
        for name, value in values.items():
            w = plot_w * value / top
            body.append(f'<rect x="{LEFT + label_w}" y="{y}" width="{w:.1f}" height="{bar - 2}" '
                        f'fill="{colors.get(name, "#888")}"><title>{escape(group)} · '
                        f'{escape(name)}: {fmt(value)}{unit}</title></rect>'
                        f'<text x="{LEFT + label_w + w + 4:.1f}" y="{y + bar - 4}" '
                        f'class="small">{fmt(value)}{unit}</text>')
            y += bar
        y += max(0, 1 - len(values)) * bar + gap
    legend = [(name, color) for name, color in colors.items()
              if any(name in values for values in groups.values())]
    return _frame(title, height, body, legend)


def _shorten(text: str, width: int) -> str:
    """Cut a label to what fits in ``width`` pixels (the tooltip has all of it)."""
    fits = max(4, (width - 12) // 7)
    return text if len(text) <= fits else text[:fits - 1] + "…"


def points(values: Mapping[dt.datetime, float]) -> list[tuple[float, float]]:
    """A time series (a pandas Series indexed by time) as ``(epoch s, y)`` points."""
    return [(stamp.timestamp(), float(v)) for stamp, v in values.items()]


def clock(seconds: float) -> str:
    """An x label: the UTC time of day."""
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%H:%M:%S")
