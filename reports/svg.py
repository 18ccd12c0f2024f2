"""Line charts for the self-contained HTML report, drawn by matplotlib and inlined as SVG.

matplotlib is imported lazily here (report rendering only): the runtime path never pays for it.
Charts are reproducible byte for byte: no pyplot (no GUI backend, no global figure state; the
headless Agg canvas), ``svg.hashsalt`` fixed per chart title for the element ids, no creation date in the
metadata, and text kept as ``<text>`` elements (searchable, escaped by matplotlib's XML writer).
"""

from __future__ import annotations

import io
import math
from typing import Sequence

WIDTH_IN, HEIGHT_IN = 7.6, 3.6
# Fixed margins leave room for 28-character labels rotated 60 degrees at 7 pt; a tight bounding
# box would render every chart twice (about twice the report time for the same picture).
MARGINS = {"left": 0.14, "right": 0.98, "top": 0.91, "bottom": 0.48}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
MAX_X_LABELS = 40
LABEL_CHARS = 28
SVG_RC = {"svg.fonttype": "none", "font.size": 8}


def _plottable(values: Sequence[float | None], log: bool) -> list[float]:
    """The series with gaps (NaN) where a value is missing, infinite, or not positive on a log axis."""
    return [v if v is not None and math.isfinite(v) and (v > 0 or not log) else math.nan for v in values]


def _x_labels(labels: Sequence[object]) -> tuple[list[int], list[str]]:
    """Tick positions and texts: at most ``MAX_X_LABELS`` ticks, each text cut to ``LABEL_CHARS``."""
    step = max(1, len(labels) // MAX_X_LABELS)
    ticks = list(range(0, len(labels), step))
    return ticks, [str(labels[i])[:LABEL_CHARS] for i in ticks]


def _svg_text(fig: object, salt: str) -> str:
    """The figure as an inline ``<svg>`` element without the XML prolog. Ids are hashed with
    ``salt`` (not a random one), so the SVG is reproducible, and a per-chart salt keeps ids
    unique among the several charts inlined in one page."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({**SVG_RC, "svg.hashsalt": f"ncnnport:{salt}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def line_chart(title: str, labels: Sequence[object], series: dict[str, Sequence[float | None]], *,
               log: bool = False, threshold: float | None = None, y_label: str = "") -> str:
    """Points joined by lines, one colour per series, rotated x labels and an optional dashed gate
    line; returned as SVG markup for inlining in the HTML report."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError("matplotlib is not installed; the HTML report's plots need it: "
                           "pip install 'ncnnport[report]'") from exc

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = list(range(len(labels)))
    for k, (name, values) in enumerate(series.items()):
        ax.plot(xs, _plottable(values, log), marker="o", markersize=3, linewidth=1.2,
                color=COLORS[k % len(COLORS)], label=name)
    if threshold is not None and threshold > 0:
        ax.axhline(threshold, color="#d62728", linestyle="--", linewidth=1, label="gate")
    if log:
        ax.set_yscale("log")
    ticks, texts = _x_labels(labels)
    ax.set_xticks(ticks, texts, rotation=60, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(y_label)
    ax.grid(True, color="#e5e5e5", linewidth=0.6)
    ax.legend(loc="best", fontsize=7, frameon=False)
    fig.subplots_adjust(**MARGINS)
    return _svg_text(fig, title)
