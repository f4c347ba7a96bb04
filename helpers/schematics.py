"""Schematic figures: pictures of a mechanism, computed from the algorithm they show, never from a measurement."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from helpers.dataparallel import STEP_COLORS
from helpers.plots import PALETTE

SCHEMATIC = "schematic, not measured"


def ring_steps(world: int) -> list[dict]:
    """The ring all-reduce on ``world`` ranks, step by step: which ranks' values each rank's chunks hold.

    Each rank cuts its tensor into ``world`` chunks. In reduce-scatter step s, rank r sends chunk
    (r - s) mod world to rank r + 1, which adds it to its own; after world - 1 steps rank r holds the full
    sum of chunk (r + 1) mod world. In all-gather step s, rank r sends chunk (r + 1 - s) mod world on, and
    the receiver keeps it. Returns one dict per state: ``phase``, ``step``, ``held[rank][chunk]`` (a
    frozenset of ranks) and ``sent`` (the (rank, chunk) pairs sent to reach this state).
    """
    held = [[frozenset({r}) for _ in range(world)] for r in range(world)]
    states = [{"phase": "start", "step": 0, "held": [row[:] for row in held], "sent": []}]
    for phase, offset in (("reduce-scatter", 0), ("all-gather", 1)):
        for step in range(world - 1):
            sent = [(r, (r + offset - step) % world) for r in range(world)]
            payload = {(r + 1) % world: (c, held[r][c]) for r, c in sent}  # everyone sends at once
            for receiver, (chunk, values) in payload.items():
                mine = held[receiver][chunk]
                held[receiver][chunk] = mine | values if phase == "reduce-scatter" else values
            states.append({"phase": phase, "step": step + 1, "held": [row[:] for row in held], "sent": sent})
    return states


def plot_ring(world: int = 4):
    """Draw :func:`ring_steps`: one column per state, one row of chunks per rank, darker = more ranks summed;
    an outlined chunk is the one that rank sends in the next step. Returns the figure."""
    states = ring_steps(world)
    fig, ax = plt.subplots(figsize=(1.45 * len(states) * (world + 1) / 5 + 1.2, 0.55 * world + 1.6))
    shades = plt.get_cmap("Blues")
    for column, state in enumerate(states):
        left = column * (world + 1)
        upcoming = set(states[column + 1]["sent"]) if column + 1 < len(states) else set()
        for rank in range(world):
            for chunk in range(world):
                count = len(state["held"][rank][chunk])
                outline = (rank, chunk) in upcoming
                ax.add_patch(Rectangle((left + chunk, rank), 0.92, 0.85, facecolor=shades(0.15 + 0.8 * count / world),
                                       edgecolor="black" if outline else "white", linewidth=2 if outline else 0.5))
                ax.text(left + chunk + 0.46, rank + 0.43, str(count), ha="center", va="center", fontsize=7,
                        color="white" if count > world / 2 else "black")
        label = "start" if state["phase"] == "start" else f"{state['phase']}\nstep {state['step']}"
        ax.text(left + world / 2, -0.35, label, ha="center", va="bottom", fontsize=8)
    ax.set_xlim(-0.2, len(states) * (world + 1))
    ax.set_ylim(world + 0.2, -1.4)
    ax.set_yticks([r + 0.43 for r in range(world)], [f"rank {r}" for r in range(world)])
    ax.set_xticks([])
    ax.grid(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"Ring all-reduce on {world} ranks ({SCHEMATIC}): each square is one chunk, the number is how "
                 "many ranks' values it holds;\nan outlined chunk is sent to the next rank in the following step",
                 fontsize=9)
    fig.tight_layout()
    return fig


def plot_bucket_filling(sizes: list[int], buckets: list[list[int]], *, title: str = ""):
    """Backward reaches the parameters from last to first; each gradient's hook drops it into its bucket, and a
    bucket's all-reduce can start once its last gradient arrives. ``sizes[i]`` is parameter i's gradient in
    bytes, ``buckets`` lists parameter indices per bucket. Returns the axes."""
    owner = {index: b for b, members in enumerate(buckets) for index in members}
    order = sorted(owner, reverse=True)  # the order in which backward produces the gradients
    fig, ax = plt.subplots(figsize=(9, 2.6))
    x, last_in = 0.0, {}
    for index in order:
        width = sizes[index] / max(sizes) * 1.6 + 0.4
        color = PALETTE[owner[index] % len(PALETTE)]
        ax.add_patch(Rectangle((x, 0), width * 0.95, 1, facecolor=color, edgecolor="white"))
        ax.text(x + width * 0.47, 0.5, f"p{index}\n{sizes[index]} B", ha="center", va="center", fontsize=7,
                color="white")
        x += width
        last_in[owner[index]] = x
    for b, end in sorted(last_in.items(), key=lambda item: item[1]):
        ax.add_patch(FancyArrowPatch((end - 0.05, 1.05), (end - 0.05, 1.7), arrowstyle="-|>", mutation_scale=10,
                                     color=PALETTE[b % len(PALETTE)]))
        ax.text(end - 0.05, 1.75, f"bucket {b} full:\nall-reduce", ha="center", va="bottom", fontsize=7)
    ax.set_xlim(-0.1, x + 0.3)
    ax.set_ylim(-0.3, 2.6)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.grid(False)
    ax.set_xlabel("backward, left to right: the hooks fire from the last parameter to the first")
    ax.set_title(title or f"Hooks filling buckets ({SCHEMATIC})", fontsize=9)
    return ax


def overlap_spans(compute: list[float], comm: list[float], *, overlap: bool) -> list[dict]:
    """Spans for a backward of buckets computed in turn (``compute[i]`` seconds each) and all-reduced
    (``comm[i]`` seconds each), one all-reduce at a time and in bucket order. Without overlap every
    all-reduce waits for the end of backward; with it, bucket i starts once its gradients exist and
    bucket i - 1's all-reduce is done."""
    spans, now, link_free = [], 0.0, 0.0
    ready = []
    for i, seconds in enumerate(compute):
        spans.append({"lane": "compute", "start": now, "end": now + seconds, "label": f"backward, bucket {i}"})
        now += seconds
        ready.append(now)
    for i, seconds in enumerate(comm):
        start = max(link_free, ready[i] if overlap else now)
        spans.append({"lane": "network", "start": start, "end": start + seconds, "label": f"all-reduce, bucket {i}"})
        link_free = start + seconds
    return spans


def plot_overlap(compute: list[float], comm: list[float]):
    """Two timelines of the same backward, all-reduce after it and overlapped with it. Returns the figure."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 3.4), sharex=True)
    for ax, overlap in zip(axes, (False, True), strict=True):
        spans = overlap_spans(compute, comm, overlap=overlap)
        end = max(s["end"] for s in spans)
        lanes = ["compute", "network"]
        for span in spans:
            bucket = int(span["label"].rsplit(" ", 1)[1])
            ax.barh(lanes.index(span["lane"]), span["end"] - span["start"], left=span["start"], height=0.6,
                    color=PALETTE[bucket % len(PALETTE)], edgecolor="white")
            ax.text((span["start"] + span["end"]) / 2, lanes.index(span["lane"]), f"b{bucket}", ha="center",
                    va="center", fontsize=7, color="white")
        ax.set_yticks([0, 1], lanes)
        ax.invert_yaxis()
        ax.set_title(("overlapped: each bucket's all-reduce starts when its gradients exist" if overlap else
                      "no overlap: every all-reduce waits for the end of backward") + f" (ends at {end:g})", fontsize=9)
    axes[-1].set_xlabel(f"time, arbitrary units ({SCHEMATIC})")
    fig.tight_layout()
    return fig


def plot_dp_vs_ddp(k: int = 3):
    """A schematic, not a measurement: DataParallel's data flow (one process, dev0 in the middle of every
    step) beside DDP's (one process per device, gradients all-reduced among equals)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.6))
    xs = [1.5 + 2.2 * d for d in range(k)]

    def box(ax, x, y, text, color, w=1.9):
        ax.text(
            x,
            y,
            text,
            ha="center",
            va="center",
            fontsize=8.5,
            wrap=True,
            bbox={"boxstyle": "round,pad=0.35", "fc": color, "ec": "none", "alpha": 0.35},
        )

    def arrow(ax, x0, y0, x1, y1, color="black"):
        ax.annotate("", (x1, y1), (x0, y0), arrowprops={"arrowstyle": "->", "color": color, "lw": 1.1})

    def note(ax, y, text):
        ax.text(xs[-1] + 1.3, y, text, ha="left", va="center", fontsize=8.5, style="italic")

    # DataParallel: dev0 starts, gathers and finishes every step; only forward and backward run everywhere
    rows = {"batch": 9.0, "fwd": 7.2, "loss": 5.6, "bwd": 4.0, "upd": 2.4}
    box(left, xs[0], rows["batch"], "batch + weights\n(dev0)", STEP_COLORS["scatter inputs"])
    for d, x in enumerate(xs):
        box(left, x, rows["fwd"], f"forward\nthread dev{d}", STEP_COLORS["parallel forward"])
        box(left, x, rows["bwd"], f"backward\nthread dev{d}", STEP_COLORS["parallel backward"])
        arrow(left, xs[0], rows["batch"] - 0.45, x, rows["fwd"] + 0.45)  # 1-2 scatter, replicate
        arrow(left, x, rows["fwd"] - 0.45, xs[0] + 0.2 * d, rows["loss"] + 0.35)  # 4 gather
        arrow(left, xs[0] + 0.2 * d, rows["loss"] - 0.35, x, rows["bwd"] + 0.45)  # 6 loss gradient
        arrow(
            left, x, rows["bwd"] - 0.45, xs[0] + 0.2 * d, rows["upd"] + 0.35, STEP_COLORS["reduce gradients"]
        )
    box(left, xs[0], rows["loss"], "gathered outputs, loss\n(dev0)", STEP_COLORS["loss on main"])
    box(left, xs[0], rows["upd"], "gradients summed,\noptimizer step (dev0)", STEP_COLORS["update"])
    note(left, rows["batch"] - 0.9, "1 scatter inputs\n2 replicate model\n(every step)")
    note(left, rows["fwd"] - 0.9, "4 gather outputs\nto dev0")
    note(left, rows["loss"] - 0.8, "6 loss gradient\nback to each device")
    note(left, rows["bwd"] - 0.9, "8 reduce gradients\nto dev0")
    left.set_title("DataParallel: one process, one thread per device", fontsize=11)

    # DDP: every process loads its own shard and steps its own optimizer; only the gradients travel
    for d, x in enumerate(xs):
        box(right, x, rows["batch"], f"process (rank) {d}\nits own shard", PALETTE[d % len(PALETTE)])
        box(right, x, rows["fwd"], "forward", STEP_COLORS["parallel forward"])
        box(right, x, rows["bwd"], "backward", STEP_COLORS["parallel backward"])
        box(right, x, rows["upd"], "own optimizer\nstep", STEP_COLORS["update"])
        for a, b in (("batch", "fwd"), ("fwd", "bwd"), ("bwd", "upd")):
            arrow(right, x, rows[a] - 0.5, x, rows[b] + 0.45)
    for d in range(k - 1):  # the all-reduce: neighbours exchange, no device is the main one
        right.annotate(
            "",
            (xs[d + 1] - 0.55, rows["bwd"]),
            (xs[d] + 0.55, rows["bwd"]),
            arrowprops={"arrowstyle": "<->", "color": STEP_COLORS["reduce gradients"], "lw": 1.4},
        )
    right.annotate(
        "",
        (xs[-1], rows["bwd"] - 0.35),
        (xs[0], rows["bwd"] - 0.35),
        arrowprops={
            "arrowstyle": "<->",
            "color": STEP_COLORS["reduce gradients"],
            "lw": 1.4,
            "connectionstyle": "arc3,rad=0.12",
        },
    )
    right.text(
        xs[k // 2],
        rows["bwd"] + 0.75,
        "all-reduce of the gradients (averaged),\noverlapping the backward pass",
        ha="center",
        bbox={"fc": "white", "ec": "none"},
        fontsize=8.5,
        color=STEP_COLORS["reduce gradients"],
    )
    note(right, rows["batch"], "weights broadcast\nfrom rank 0 once,\nwhen DDP wraps\nthe model")
    right.set_title("DDP: one process per device", fontsize=11)
    for ax in (left, right):
        ax.set_xlim(0, xs[-1] + 3.6)
        ax.set_ylim(1.5, 10)
        ax.axis("off")
    fig.suptitle("Schematic (drawn, not measured): where the data goes in one training step")
    fig.tight_layout()
    return fig


def shard_slices(world: int, method: str) -> list[dict[str, tuple[float, float]]]:
    """Rank by rank, what it keeps of each part of the training state (``sharding.PARTS``), as a slice
    ``(start, end)`` of the model's parameters in fractions: all of them, or its own 1/N where ``method``
    shards that part (``sharding.SHARDED``)."""
    from helpers import sharding

    return [
        {part: (r / world, (r + 1) / world) if part in sharding.SHARDED[method] else (0.0, 1.0) for part in sharding.PARTS}
        for r in range(world)
    ]


def plot_sharding(world: int = 4, methods=("ddp", "zero1", "zero2", "zero3", "fsdp2")):
    """A schematic, not a measurement: for each method, what each of ``world`` ranks keeps of the weights,
    the fp32 master copy, the gradients and Adam's moments (fp32 Adam; each bar as tall as its bytes per
    parameter, as wide as all the parameters; coloured where the rank holds it)."""
    from helpers import sharding

    colors = dict(zip(sharding.PARTS, PALETTE, strict=False))
    fig, axes = plt.subplots(len(methods), 1, figsize=(12, 1.5 * len(methods) + 1), sharex=True)
    gap = 0.25
    for ax, method in zip(axes, methods, strict=True):
        per_param = sharding.formula_bytes(1, 1, method)  # bytes per parameter of each part, unsharded
        for rank, slices in enumerate(shard_slices(world, method)):
            x0, y = rank * (1 + gap), 0.0
            for part in sharding.PARTS:
                height = per_param[part]
                if not height:
                    continue
                start, end = slices[part]
                ax.add_patch(Rectangle((x0, y), 1, height, fc="none", ec="lightgrey"))
                ax.add_patch(Rectangle((x0 + start, y), end - start, height, fc=colors[part], ec="none"))
                y += height
            held = sum(per_param[p] * (e - s) for p, (s, e) in slices.items())
            ax.text(x0 + 0.5, y + 0.6, f"rank {rank}: {held:g} B per parameter", ha="center", fontsize=8.5)
        ax.set_xlim(-0.05, world * (1 + gap))
        ax.set_ylim(0, 25)
        ax.set_yticks([])
        ax.set_xticks([])
        ax.set_ylabel(sharding.METHOD_NAMES[method], rotation=0, ha="right", va="center", fontsize=10)
        for side in ("top", "right", "left", "bottom"):
            ax.spines[side].set_visible(False)
    axes[0].legend(
        handles=[Rectangle((0, 0), 1, 1, fc=colors[p]) for p in sharding.PARTS],
        labels=list(sharding.PARTS),
        ncol=len(sharding.PARTS),
        loc="lower center",
        bbox_to_anchor=(0.5, 1.12),
        fontsize=8.5,
        frameon=False,
    )
    fig.suptitle(
        f"Schematic (drawn, not measured): what each of {world} ranks keeps, fp32 Adam (ZeRO: DeepSpeed's "
        "fp32 master copy too)\ngrey outline = the whole part, colour = the rank's own"
    )
    fig.tight_layout()
    return fig
