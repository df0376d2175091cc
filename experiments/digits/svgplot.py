"""A minimal SVG chart writer for the digits experiments (no plotting library is installed).

It draws lines or markers per series on linear axes, with ticks, a legend and an optional y = x
diagonal.
"""

import html
import math

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
WIDTH, HEIGHT = 760, 480
LEFT, RIGHT, TOP, BOTTOM = 70, 220, 40, 55


def nice_ticks(lo, hi, count=6):
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 10))
    return ticks


def label(value):
    return f"{value:g}"


def chart(path, title, xlabel, ylabel, series, diagonal=False, y_range=None):
    """Writes an SVG chart. `series`: dicts with `label`, `points` [(x, y), ...], optional
    `line` (default True), `marker` (default True), `dash` and `color`."""
    points = [p for s in series for p in s["points"]]
    if not points:
        raise ValueError(f"{path}: nothing to plot")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = y_range if y_range else (min(ys), max(ys))
    if diagonal:
        x_lo = y_lo = min(x_lo, y_lo, 0)
        x_hi = y_hi = max(x_hi, y_hi)
    x_ticks, y_ticks = nice_ticks(x_lo, x_hi), nice_ticks(y_lo, y_hi)
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    sx = lambda x: LEFT + (x - x0) / (x1 - x0) * plot_w
    sy = lambda y: TOP + plot_h - (y - y0) / (y1 - y0) * plot_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2:.1f}" y="22" text-anchor="middle" font-size="15">{html.escape(title)}</text>']
    for t in x_ticks:
        out.append(f'<line x1="{sx(t):.1f}" y1="{TOP}" x2="{sx(t):.1f}" y2="{TOP + plot_h}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{sx(t):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{label(t)}</text>')
    for t in y_ticks:
        out.append(f'<line x1="{LEFT}" y1="{sy(t):.1f}" x2="{LEFT + plot_w}" y2="{sy(t):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{label(t)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 14}" text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(f'<text transform="translate(18,{TOP + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle">{html.escape(ylabel)}</text>')
    if diagonal:
        out.append(f'<line x1="{sx(x0):.1f}" y1="{sy(y0):.1f}" x2="{sx(min(x1, y1)):.1f}" y2="{sy(min(x1, y1)):.1f}" '
                   'stroke="#999" stroke-dasharray="4 3"/>')
    for index, s in enumerate(series):
        color = s.get("color", PALETTE[index % len(PALETTE)])
        coords = [(sx(x), sy(y)) for x, y in s["points"]]
        if s.get("line", True) and len(coords) > 1:
            dash = f' stroke-dasharray="{s["dash"]}"' if s.get("dash") else ""
            path_d = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            out.append(f'<polyline points="{path_d}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>')
        if s.get("marker", True):
            out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in coords)
        ly = TOP + 10 + 18 * index
        out.append(f'<line x1="{LEFT + plot_w + 12}" y1="{ly}" x2="{LEFT + plot_w + 32}" y2="{ly}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{LEFT + plot_w + 38}" y="{ly + 4}">{html.escape(s["label"])}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
