"""Schematic figures: pictures of a mechanism, computed from the algorithm they show, never from a measurement."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

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
