"""Tiny dependency-free SVG charts for the self-contained HTML report."""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 760, 260, 70, 90, 20, 20
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def _y_scale(values: Sequence[float], log: bool):
    finite = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return (lambda v: PAD_T), [], 0, 1
    lo, hi = min(finite), max(finite)
    if log:
        lo, hi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        hi = hi if hi > lo else lo + 1
        ticks = [10.0 ** e for e in range(int(lo), int(hi) + 1)]
        f = lambda v: PAD_T + (H - PAD_T - PAD_B) * (1 - (math.log10(max(v, 10 ** lo)) - lo) / (hi - lo))  # noqa: E731
    else:
        if hi == lo:
            hi = lo + 1e-9
        ticks = [lo + (hi - lo) * i / 4 for i in range(5)]
        f = lambda v: PAD_T + (H - PAD_T - PAD_B) * (1 - (v - lo) / (hi - lo))  # noqa: E731
    return f, ticks, lo, hi


def line_chart(title: str, labels: Sequence[str], series: dict[str, Sequence[float | None]], *,
               log: bool = False, threshold: float | None = None, y_label: str = "") -> str:
    """Points joined by lines, one colour per series; x labels rotated; optional gate line."""
    n = max(1, len(labels))
    xs = [PAD_L + (W - PAD_L - PAD_R) * (i + 0.5) / n for i in range(n)]
    allv = [v for s in series.values() for v in s if v is not None] + ([threshold] if threshold else [])
    fy, ticks, _, _ = _y_scale(allv, log)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
             f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
             f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" '
             'fill="#fafafa" stroke="#ccc"/>']
    for t in ticks:
        y = fy(t)
        parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{t:.3g}</text>')
    if threshold is not None and threshold > 0:
        y = fy(threshold)
        parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d62728" '
                     'stroke-dasharray="4 3"/><text x="' + f'{W - PAD_R - 2}" y="{y - 3:.1f}" font-size="10" '
                     'text-anchor="end" fill="#d62728">gate</text>')
    step = max(1, n // 40)
    for i, (x, lab) in enumerate(zip(xs, labels)):
        if i % step == 0:
            parts.append(f'<text transform="translate({x:.1f},{H - PAD_B + 10}) rotate(60)" font-size="9">'
                         f'{escape(str(lab))[:28]}</text>')
    for k, (name, vals) in enumerate(series.items()):
        c = COLORS[k % len(COLORS)]
        pts = [(x, fy(v)) for x, v in zip(xs, vals) if v is not None and math.isfinite(v) and (v > 0 or not log)]
        if len(pts) > 1:
            parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="' +
                         " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{c}"/>' for x, y in pts]
        parts.append(f'<text x="{PAD_L + 8 + 150 * k}" y="{PAD_T + 12}" font-size="11" fill="{c}">'
                     f'{escape(name)}</text>')
    if y_label:
        parts.append(f'<text transform="translate(14,{(H - PAD_B + PAD_T) / 2:.0f}) rotate(-90)" '
                     f'font-size="11" text-anchor="middle">{escape(y_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
