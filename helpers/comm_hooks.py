"""Communication overlapped with backward, measured: the timed steps of 04's inside_overlap.py as timelines, tables and sweeps."""

from __future__ import annotations

import statistics

from helpers.bytecount import human_bytes


def step_spans(step: dict, wire_seconds=None) -> list[dict]:
    """A timed step as bars for ``helpers.plots.timeline``: compute on one lane, each bucket on its own.

    A bucket's bar runs from the moment backward made it ready to the moment its all-reduce finished.
    With ``wire_seconds`` (bytes -> seconds, the simulated wire's rule) it is split into the time spent
    queued for the wire and the time on it.
    """
    spans = [
        {"lane": "compute", "start": step["start"], "end": step["forward_end"], "label": "forward"},
        {"lane": "compute", "start": step["forward_end"], "end": step["backward_end"], "label": "backward"},
        {"lane": "compute", "start": step["comm_end"], "end": step["end"], "label": "optimizer step"},
    ]
    for b in step["buckets"]:
        lane = f"bucket {b['bucket']} ({human_bytes(b['bytes'])})"
        if wire_seconds is None:
            spans.append({"lane": lane, "start": b["ready"], "end": b["done"], "label": "all-reduce"})
            continue
        on_wire = max(b["ready"], b["done"] - wire_seconds(b["bytes"]))
        if on_wire > b["ready"]:
            spans.append({"lane": lane, "start": b["ready"], "end": on_wire, "label": "queued for the wire"})
        spans.append({"lane": lane, "start": on_wire, "end": b["done"], "label": "on the wire (SIMULATED)"})
    return spans


def typical_step(steps: list[dict], overlap: bool) -> dict:
    """The step whose time is closest to the median of its kind: the one worth drawing."""
    chosen = [s for s in steps if s["overlap"] == overlap]
    middle = statistics.median(s["seconds"] for s in chosen)
    return min(chosen, key=lambda s: abs(s["seconds"] - middle))


def link_finish_times(ready, wire) -> list[float]:
    """When each message is delivered on one serial link: it starts once it is ready and the wire is free."""
    done, free = [], float("-inf")
    for r, w in zip(ready, wire, strict=True):
        free = max(r, free) + w
        done.append(free)
    return done


def overlap_table(settings: dict) -> list[dict]:
    """One row per network: backward alone, step time without and with overlap (medians), speedup."""
    rows = []
    for name, steps in settings.items():
        with_, without = median_seconds(steps, True), median_seconds(steps, False)
        backward = statistics.median(s["backward_seconds"] for s in steps if not s["overlap"])
        rows.append(
            {
                "network": name,
                "backward alone (ms)": 1e3 * backward,
                "no overlap (ms/step)": 1e3 * without,
                "overlap (ms/step)": 1e3 * with_,
                "speedup": without / with_,
            }
        )
    return rows


def best_caps(sweep: list[dict]) -> dict:
    """network -> the bucket_cap_mb with the shortest median step."""
    best = {}
    for r in sweep:
        if r["network"] not in best or r["seconds"] < best[r["network"]]["seconds"]:
            best[r["network"]] = r
    return {network: r["cap_mb"] for network, r in best.items()}


def clearly_faster(fast: list[float], slow: list[float]) -> bool:
    """True when the spread supports "faster": every quartile apart, ``fast``'s upper quartile below
    ``slow``'s lower quartile. Timings on a shared machine move by tens of percent; medians alone do not."""
    import statistics

    if len(fast) < 2 or len(slow) < 2:
        return False
    return statistics.quantiles(fast, n=4)[2] < statistics.quantiles(slow, n=4)[0]


def best_cap_is_clear(sweep: list[dict]) -> dict:
    """network -> whether its best bucket_cap_mb (by median) is :func:`clearly_faster` than the runner-up
    (rows need the step times in ``samples``)."""
    clear = {}
    for network in dict.fromkeys(r["network"] for r in sweep):
        rows = sorted((r for r in sweep if r["network"] == network), key=lambda r: r["seconds"])
        clear[network] = len(rows) > 1 and clearly_faster(rows[0]["samples"], rows[1]["samples"])
    return clear


def paired_speedups(steps: list[dict]) -> list[float]:
    """no-overlap time / overlap time for each pair of neighbouring steps (they alternate, so a machine
    that gets busier slows both halves of a pair alike)."""
    with_ = [s["seconds"] for s in steps if s["overlap"]]
    without = [s["seconds"] for s in steps if not s["overlap"]]
    return [b / a for a, b in zip(with_, without, strict=True)]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """Lower quartile, median, upper quartile (the median three times for a single value)."""
    if len(values) < 2:
        return (values[0],) * 3
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def median_seconds(steps: list[dict], overlap: bool) -> float:
    return statistics.median(s["seconds"] for s in steps if s["overlap"] == overlap)


COLORS = {
    "forward": "#8172B3",
    "backward": "#4C72B0",
    "optimizer step": "#937860",
    "all-reduce": "#DD8452",
    "queued for the wire": "#D9D9D9",
    "on the wire (SIMULATED)": "#DD8452",
}


def plot_overlap(steps: list[dict], title: str, wire_seconds=None):
    """Two measured timelines of one step, with and without overlap, on the same time axis."""
    import matplotlib.pyplot as plt

    from helpers import plots

    chosen = [typical_step(steps, True), typical_step(steps, False)]
    lanes = 1 + len(chosen[0]["buckets"])
    fig, axes = plt.subplots(2, 1, figsize=(10, 2 * (0.32 * lanes + 1.2)), sharex=True)
    for ax, step, name in zip(
        axes, chosen, ("overlap (DDP as usual)", "no overlap (no_sync, then all-reduce)"), strict=True
    ):
        spans = step_spans(step, wire_seconds)
        plots.timeline(spans, ax=ax, colors=COLORS, title=f"{name}: {step['seconds'] * 1e3:.0f} ms")
    axes[0].set_xlabel("")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_sweep(sweep: list[dict], refs: dict):
    """Step time against bucket_cap_mb, one line per network; 25 marked, set explicitly: DDP's default (None) has
    25 MiB buckets too, but closes its first one at 1 MiB."""
    from helpers import plots

    networks = list(dict.fromkeys(r["network"] for r in sweep))
    caps = [r["cap_mb"] for r in sweep if r["network"] == networks[0]]
    series = {
        ("simulated wire (SIMULATED)" if n == "simulated" else f"{n} (real)"): [
            r["seconds"] * 1e3 for r in sweep if r["network"] == n
        ]
        for n in networks
    }
    ax = plots.measured_curves(
        caps,
        series,
        logx=True,
        refs=refs,
        xlabel="bucket_cap_mb (MiB)",
        ylabel="ms per training step (median and quartiles)",
        title="Bucket size against step time",
    )
    for i, n in enumerate(networks):  # the spread: the middle half of the timed steps at each cap
        rows = [r for r in sweep if r["network"] == n and r.get("samples")]
        if len(rows) == len(caps):
            import statistics

            quartiles = [statistics.quantiles(r["samples"], n=4) for r in rows]
            ax.fill_between(caps, [q[0] * 1e3 for q in quartiles], [q[2] * 1e3 for q in quartiles],
                            color=plots.PALETTE[i % len(plots.PALETTE)], alpha=0.15, lw=0)  # fmt: skip
    ax.set_xticks(caps, [f"{c:g}" for c in caps])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.axvline(25, ls="--", lw=1, color="#555555")
    ax.annotate(
        "25, set: not the default (1 MiB first bucket)",
        (25, 0.03),
        xycoords=("data", "axes fraction"),
        rotation=90,
        ha="right",
        fontsize=8,
    )
    return ax
