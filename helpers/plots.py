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


# --- added with lesson 01: stacked parts, simulated vs formula, two runs that should agree ----------


def stacked_bars(groups, parts: dict, *, ax=None, ylabel: str = "", title: str = "", totals: bool = True):
    """Bars built from stacked parts; ``parts`` maps a label to one value per group. Returns the axes."""
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(1.8 * len(groups) + 3, 4))
    positions = np.arange(len(groups))
    bottom = np.zeros(len(groups))
    for i, (label, values) in enumerate(parts.items()):
        values = np.asarray(values, dtype=float)
        ax.bar(
            positions,
            values,
            0.6,
            bottom=bottom,
            label=label,
            color=PALETTE[i % len(PALETTE)],
            edgecolor="white",
        )
        bottom += values
    if totals:
        for x, total in zip(positions, bottom, strict=True):
            ax.annotate(
                f"{total:.4g}",
                (x, total),
                ha="center",
                va="bottom",
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(positions, [str(g) for g in groups])
    ax.set_ylim(0, max(bottom.max(), 1e-12) * 1.15)
    ax.set_ylabel(ylabel)
    ax.grid(axis="x", visible=False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    if title:
        ax.set_title(title)
    return ax


def simulated_vs_formula(
    x, simulated: dict, formula: dict, *, ax=None, xlabel="", ylabel="", title="", kind="simulated"
):
    """Markers for what was counted (``kind``: simulated or measured), a dashed line for the formula of each label."""
    if ax is None:
        _, ax = plt.subplots()
    markers = "os^Dv<>p"
    for i, (label, values) in enumerate(simulated.items()):
        color = PALETTE[i % len(PALETTE)]
        ax.plot(x, values, markers[i % len(markers)], color=color, ms=7 - 2 * i, label=f"{label} ({kind})")
        if label in formula:
            ax.plot(x, formula[label], "--", color=color, lw=1, label=f"{label} (formula)")
    return _finish_axes(ax, xlabel, ylabel, title)


def _finish_axes(ax, xlabel: str, ylabel: str, title: str):
    """Axis labels, a frameless legend and the title (when there is one)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(frameon=False, fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def agreeing_runs(
    a, b, *, labels=("run a", "run b"), ylabel: str = "loss", title: str = "", floor: float = 1e-18
):
    """Two runs that should agree: both curves on top, their absolute difference on a log scale below."""
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    steps = np.arange(1, len(a) + 1)
    fig, (top, low) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True, height_ratios=[2.2, 1])
    top.plot(steps, a, lw=4, alpha=0.45, label=labels[0])
    top.plot(steps, b, "--", lw=1.5, color=PALETTE[1], label=labels[1])
    top.set_ylabel(ylabel)
    top.legend(frameon=False)
    if title:
        top.set_title(title)
    diff = np.abs(a - b)
    low.semilogy(steps, np.maximum(diff, floor), ".", color=PALETTE[3])
    low.set_ylabel("|difference|")
    low.set_xlabel("step")
    low.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    exact = int((diff == 0).sum())
    note = f"max {diff.max():.2g}" + (
        f"; {exact} of {len(a)} steps exactly equal (drawn at {floor:g})" if exact else ""
    )
    low.set_title(note, fontsize=9, loc="left")
    fig.tight_layout()
    return fig


# --- added with lesson 03: measured curves with reference lines, and DDP's bucket layout ----------------


def measured_curves(
    x,
    series: dict,
    *,
    ax=None,
    logx: bool = False,
    logy: bool = False,
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    refs: dict | None = None,
    marks: dict | None = None,
    styles: dict | None = None,
):
    """Measured values against ``x``, one line with markers per label in ``series``.

    ``refs``: label -> y drawn as a dotted horizontal line (a ceiling or a baseline measured elsewhere);
    ``marks``: label -> x drawn as a thin vertical line; ``styles``: label -> extra ``plot`` keywords.
    """
    if ax is None:
        _, ax = plt.subplots()
    markers = "os^Dv<>p"
    for i, (label, values) in enumerate(series.items()):
        style = {"marker": markers[i % len(markers)], "color": PALETTE[i % len(PALETTE)], "lw": 1.6, "ms": 5}
        style.update((styles or {}).get(label, {}))
        ax.plot(x, values, label=label, **style)
    for j, (label, y) in enumerate((refs or {}).items()):
        ax.axhline(y, ls=":", lw=1.5, color=PALETTE[(len(series) + j) % len(PALETTE)], label=label)
    for label, xv in (marks or {}).items():
        ax.axvline(xv, ls="--", lw=1, color="#555555")
        ax.annotate(
            label, (xv, 1), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=8
        )
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    return _finish_axes(ax, xlabel, ylabel, title)


def bucket_map(layouts: dict, *, title: str = "", unit: float = 2**20, unit_name: str = "MiB"):
    """How parameters fall into buckets: one row per setting, segments in the order buckets fill.

    ``layouts``: row label -> list of buckets, each a list of ``(parameter name, bytes)``. A segment's
    width is its size, its colour is its bucket; layer names are written where they fit.
    """
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(layouts) + 1.6))
    total = max(sum(b for bucket in buckets for _, b in bucket) for buckets in layouts.values()) / unit
    for row, buckets in enumerate(layouts.values()):
        left = 0.0
        for index, bucket in enumerate(buckets):
            color = PALETTE[index % len(PALETTE)]
            start = left
            for name, nbytes in bucket:
                width = nbytes / unit
                ax.barh(row, width, left=left, height=0.62, color=color, edgecolor="white", lw=0.8)
                if width > 0.06 * total:
                    ax.text(left + width / 2, row, name, ha="center", va="center", fontsize=8, color="white")
                left += width
            ax.annotate(
                f"b{index}",
                ((start + left) / 2, row - 0.31),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 8),
                textcoords="offset points",
                color=color,
                fontweight="bold",
            )
    ax.set_yticks(range(len(layouts)), list(layouts))
    ax.invert_yaxis()
    ax.set_xlabel(f"gradient bytes ({unit_name}), in the order backward produces them")
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


# --- added with lesson 12: one measured quantity per panel, a bar per setting ---------------------------


def side_by_side(settings, panels: dict, *, title: str = "", note: str = ""):
    """Bars of measured values, one panel per quantity; ``panels`` maps 'quantity (unit)' to one value per setting."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (label, values) in zip(axes, panels.items(), strict=True):
        bars = ax.bar(
            [str(s) for s in settings], values, 0.55, color=PALETTE[: len(settings)], edgecolor="white"
        )
        for bar, value in zip(bars, values, strict=True):
            ax.annotate(
                f"{value:.3g}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                xytext=(0, 2),
                textcoords="offset points",
            )
        ax.set_ylabel(label)
        ax.set_ylim(0, max(max(values), 1e-12) * 1.18)
        ax.grid(axis="x", visible=False)
    if title:
        fig.suptitle(title)
    if note:
        fig.text(0.5, 0.005, note, ha="center", va="bottom", fontsize=8, color="#555555")
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1))
    return fig


# --- added with lesson 11: layer placement, and measured stacks against a formula -------------------


def placement(sizes, device_map: dict, *, title: str = "", unit: float = 2**20, unit_name: str = "MiB"):
    """One bar per module in model order, its height its size, its colour the device it is placed on.

    ``sizes``: ``(module name, bytes)`` in the order the model runs them; ``device_map``: name -> device.
    """
    names = [n for n, _ in sizes]
    devices = list(dict.fromkeys(device_map[n] for n in names))
    fig, ax = plt.subplots(figsize=(min(14, 3 + 0.28 * len(names)), 3.8))
    for i, (name, nbytes) in enumerate(sizes):
        d = device_map[name]
        ax.bar(i, nbytes / unit, 0.8, color=PALETTE[devices.index(d) % len(PALETTE)])
    for j, d in enumerate(devices):
        ax.bar(0, 0, color=PALETTE[j % len(PALETTE)], label=f"device {d}")
    short = [n.replace("model.", "").replace("layers.", "L") for n in names]
    ax.set_xticks(range(len(names)), short, rotation=90, fontsize=7)
    ax.set_ylabel(unit_name)
    ax.grid(axis="x", visible=False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def stacked_vs_formula(
    groups,
    parts: dict,
    formula_totals,
    *,
    ax=None,
    ylabel: str = "",
    title: str = "",
    label: str = "formula (total)",
):
    """Measured parts stacked per group, with the formula's total for each group drawn as a black dash."""
    import numpy as np

    ax = stacked_bars(groups, parts, ax=ax, ylabel=ylabel, title=title)
    positions = np.arange(len(groups))
    ax.hlines(formula_totals, positions - 0.38, positions + 0.38, colors="black", lw=2.5, label=label)
    top = max(max(formula_totals), ax.get_ylim()[1] / 1.15)
    ax.set_ylim(0, top * 1.18)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return ax


# --- added with lesson 09: training curves read from SWIFT's logs ------------------------------------


def training_curves(
    runs: dict, *, metrics=(("loss", "loss"), ("token_acc", "token accuracy")), title: str = "", up_to=None
):
    """One panel per metric, side by side, one line per run. ``runs`` maps a label to an object with
    ``steps`` and the metric attributes (e.g. ``helpers.sft.RunLog``), all as measured; ``up_to``: the last
    step drawn, so that runs of different lengths are compared at the same steps."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.8), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, (attr, name) in zip(axes[0], metrics, strict=True):
        for i, (label, run) in enumerate(runs.items()):
            kept = [i for i, step in enumerate(run.steps) if up_to is None or step <= up_to]
            steps, values = [run.steps[i] for i in kept], [getattr(run, attr)[i] for i in kept]
            marker = "o" if len(values) <= 12 else None
            ax.plot(
                steps,
                values,
                styles[i % len(styles)],
                marker=marker,
                ms=4,
                lw=1.8,
                color=PALETTE[i % len(PALETTE)],
                label=label,
            )
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(name)
        ax.set_title(f"{name} (measured, from logging.jsonl)", fontsize=10)
    axes[0][0].legend(frameon=False, fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def seeds_and_means(rows, key: str, *, group: str = "data", ylabel: str = "", title: str = ""):
    """One column per group: every run as a dot (labelled by seed), and the group's mean as a bar, so the
    spread between seeds is seen next to the difference between groups. ``rows`` are dicts."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    groups = list(dict.fromkeys(row[group] for row in rows))
    for x, name in enumerate(groups):
        values = [row[key] for row in rows if row[group] == name]
        ax.bar(x, sum(values) / len(values), width=0.5, color=PALETTE[x % len(PALETTE)], alpha=0.35,
               label="mean over seeds" if x == 0 else None)  # fmt: skip
        ax.scatter([x] * len(values), values, color=PALETTE[x % len(PALETTE)], zorder=3, s=28)
        for row in (r for r in rows if r[group] == name):
            ax.annotate(
                f"seed {row['seed']}",
                (x, row[key]),
                xytext=(8, 0),
                textcoords="offset points",
                fontsize=8,
                va="center",
            )
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel or key)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_title(title or f"{ylabel or key}: each seed (dots) and the mean (bars), measured", fontsize=10)
    ax.legend(frameon=False, fontsize=9)
    fig.tight_layout()
    return fig
