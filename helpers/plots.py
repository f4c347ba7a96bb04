"""Plots of what was measured: a house style, and the timeline that several lessons draw."""

from __future__ import annotations

import matplotlib.pyplot as plt

PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def style() -> None:
    """The course's matplotlib defaults: readable in a notebook and on a projector."""
    plt.rcParams.update(
        {
            "figure.figsize": (8, 4),
            "figure.dpi": 100,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.prop_cycle": plt.cycler(color=PALETTE),
            "font.size": 10,
        }
    )


def timeline(spans, *, title: str = "", unit: str = "ms", ax=None, colors: dict | None = None):
    """Draw measured intervals as horizontal bars, one lane per worker or stream.

    ``spans``: dicts with ``lane``, ``start``, ``end`` (seconds, any origin) and ``label``;
    bars with the same label share a colour and one legend entry. Returns the axes.
    """
    spans = list(spans)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 * len({s["lane"] for s in spans}) + 1.5))
    origin = min(s["start"] for s in spans)
    scale = {"s": 1, "ms": 1e3, "us": 1e6}[unit]
    lanes = list(dict.fromkeys(s["lane"] for s in spans))
    labels = list(dict.fromkeys(s["label"] for s in spans))
    colors = colors or {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}
    seen = set()
    for span in spans:
        y = lanes.index(span["lane"])
        left, width = (span["start"] - origin) * scale, (span["end"] - span["start"]) * scale
        label = span["label"] if span["label"] not in seen else None
        seen.add(span["label"])
        ax.barh(y, width, left=left, height=0.6, color=colors[span["label"]], label=label, edgecolor="white")
    ax.set_yticks(range(len(lanes)), [str(lane) for lane in lanes])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit}, measured)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    if title:
        ax.set_title(title)
    return ax
