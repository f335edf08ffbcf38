"""Inline SVG built on the server: the speedup heatmap and the tuning curves (no JS, no assets).

Every drawn element has a class the tests (and a curious reader of the page) can count:
`hm-cell` per record in a heatmap, `curve-pt` per complete trial on a curve. Every text that
comes from the database goes through `html.escape`.
"""

from __future__ import annotations

import math
from html import escape

from jointtune.db import Record
from jointtune.server.dashboard.data import StudyCurve, dim_names, shape_order

_CELL_W, _CELL_H, _LABEL_W, _HEAD_H = 128, 24, 210, 30
#: speedups are coloured on a log2 scale clipped to [1/_SPAN, _SPAN]
_SPAN = 2.0
_RED, _WHITE, _GREEN = (215, 48, 39), (247, 247, 247), (26, 152, 80)


def speedup_color(speedup: float | None) -> str:
    """Red below 1×, near-white at 1×, green above; grey when there is no baseline to compare to."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return "#d9d9d9"
    t = max(-1.0, min(1.0, math.log2(speedup) / math.log2(_SPAN)))
    end = _GREEN if t > 0 else _RED
    rgb = [round(w + (e - w) * abs(t)) for w, e in zip(_WHITE, end)]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _text_color(speedup: float | None) -> str:
    if speedup is None or speedup <= 0:
        return "#333"
    return "#fff" if abs(math.log2(speedup)) > 0.6 * math.log2(_SPAN) else "#222"


def shape_label(shape: dict[str, int]) -> str:
    return " ".join(f"{d}={shape[d]}" for d in dim_names(shape))


def heatmap_svg(records: list[Record]) -> str:
    """Rows = shapes sorted by M, columns = dtype / world size / timing policy, one coloured cell per record."""
    shapes = sorted({r.shape_key: r.shape for r in records}.items(), key=lambda item: shape_order(item[1]))
    columns = sorted({(r.dtype, r.world_size, r.timing) for r in records})
    row_of = {key: i for i, (key, _) in enumerate(shapes)}
    col_of = {col: j for j, col in enumerate(columns)}
    width = _LABEL_W + _CELL_W * len(columns) + 4
    height = _HEAD_H + _CELL_H * len(shapes) + 4
    parts = [
        f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="speedup vs baseline heatmap">'
    ]
    for (dtype, world, timing), j in col_of.items():
        x = _LABEL_W + j * _CELL_W + _CELL_W / 2
        label = f"{dtype} / w{world} / {timing}"
        parts.append(f'<text class="hm-col" x="{x}" y="{_HEAD_H - 10}" text-anchor="middle">{escape(label)}</text>')
    for i, (_key, shape) in enumerate(shapes):
        y = _HEAD_H + i * _CELL_H + _CELL_H / 2 + 4
        parts.append(
            f'<text class="hm-row" x="{_LABEL_W - 8}" y="{y}" text-anchor="end">{escape(shape_label(shape))}</text>'
        )
        for j in range(len(columns)):  # a faint frame where nothing was tuned
            parts.append(
                f'<rect class="hm-empty" x="{_LABEL_W + j * _CELL_W + 1}" y="{_HEAD_H + i * _CELL_H + 1}" '
                f'width="{_CELL_W - 2}" height="{_CELL_H - 2}" rx="3"/>'
            )
    for record in sorted(records, key=lambda r: (row_of[r.shape_key], col_of[(r.dtype, r.world_size, r.timing)], r.id)):
        x = _LABEL_W + col_of[(record.dtype, record.world_size, record.timing)] * _CELL_W + 1
        y = _HEAD_H + row_of[record.shape_key] * _CELL_H + 1
        s = record.speedup
        text = "n/a" if s is None else f"{s:.2f}×"
        tip = (
            f"{shape_label(record.shape)} · {record.dtype} · w{record.world_size} · {record.timing} · "
            f"{record.kernel_version}: "
            f"{record.latency_p50_us:.1f} µs" + ("" if s is None else f", baseline {record.baseline_us:.1f} µs")
        )
        parts.append(
            f'<g class="hm-cell" data-speedup="{"" if s is None else f"{s:.4f}"}">'
            f"<title>{escape(tip)}</title>"
            f'<rect x="{x}" y="{y}" width="{_CELL_W - 2}" height="{_CELL_H - 2}" rx="3" fill="{speedup_color(s)}"/>'
            f'<text x="{x + (_CELL_W - 2) / 2}" y="{y + _CELL_H / 2 + 3}" text-anchor="middle" '
            f'fill="{_text_color(s)}">{text}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)


def legend_svg() -> str:
    """The colour scale, 0.5× to 2×, in nine steps."""
    steps = [2 ** (k / 4) for k in range(-4, 5)]
    parts = ['<svg class="legend" xmlns="http://www.w3.org/2000/svg" width="380" height="34" viewBox="0 0 380 34">']
    for k, s in enumerate(steps):
        parts.append(f'<rect x="{10 + k * 40}" y="2" width="40" height="14" fill="{speedup_color(s)}"/>')
        if k % 2 == 0:
            parts.append(f'<text x="{30 + k * 40}" y="30" text-anchor="middle">{s:.2g}×</text>')
    parts.append("</svg>")
    return "".join(parts)


_W, _H, _PAD_L, _PAD_R, _PAD_T, _PAD_B = 400, 210, 58, 12, 12, 32


def curve_svg(curve: StudyCurve) -> str:
    """Best latency so far (a step line with a point per complete trial) over every trial's own value."""
    points = curve.points
    if not points:
        return '<p class="muted">No complete trials yet.</p>'
    last = max(p.number for p in points)
    best_values = [p.best for p in points]
    low, high = min(best_values), max(best_values)
    span = (high - low) or max(abs(high), 1.0) * 0.1
    low, high = low - 0.08 * span, high + 0.25 * span

    def sx(number: float) -> float:
        return _PAD_L + (number / max(last, 1)) * (_W - _PAD_L - _PAD_R)

    def sy(value: float) -> float:
        value = max(low, min(high, value))  # a far-off trial sits on the edge instead of flattening the curve
        return _PAD_T + (high - value) / (high - low) * (_H - _PAD_T - _PAD_B)

    parts = [
        f'<svg class="curve" xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
        f'role="img" aria-label="best latency vs trial">',
        f'<rect class="plot-bg" x="{_PAD_L}" y="{_PAD_T}" width="{_W - _PAD_L - _PAD_R}" '
        f'height="{_H - _PAD_T - _PAD_B}"/>',
    ]
    for k in range(4):
        value = low + (high - low) * k / 3
        y = sy(value)
        parts.append(f'<line class="grid" x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{value:.4g}</text>')
    for number in sorted({0, last // 2, last}):
        parts.append(f'<text class="tick" x="{sx(number):.1f}" y="{_H - 16}" text-anchor="middle">{number}</text>')
    parts.append(f'<text class="axis" x="{(_PAD_L + _W) / 2}" y="{_H - 2}" text-anchor="middle">trial</text>')
    parts.append(
        f'<text class="axis" transform="translate(12 {(_H - _PAD_B) / 2}) rotate(-90)" text-anchor="middle">µs</text>'
    )
    for p in points:
        parts.append(f'<circle class="trial-pt" cx="{sx(p.number):.1f}" cy="{sy(p.value):.1f}" r="2.5"/>')
    steps: list[str] = []
    for k, p in enumerate(points):
        if k:
            steps.append(f"{sx(p.number):.1f},{sy(points[k - 1].best):.1f}")
        steps.append(f"{sx(p.number):.1f},{sy(p.best):.1f}")
    steps.append(f"{sx(last):.1f},{sy(points[-1].best):.1f}")
    parts.append(f'<polyline class="best-line" points="{" ".join(steps)}"/>')
    for p in points:
        parts.append(
            f'<circle class="curve-pt" cx="{sx(p.number):.1f}" cy="{sy(p.best):.1f}" r="3">'
            f"<title>trial {p.number}: {p.value:.4g} µs (best so far {p.best:.4g} µs)</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)
