"""Collectives measured: algbw and busbw from the slowest rank's times, and the alpha-beta model of a link."""

from __future__ import annotations

from helpers.bytecount import human_bytes
from helpers.errors import CourseError


def bus_factor(n: int) -> float:
    """busbw / algbw for all-reduce: the share of the data each rank must send, 2(n - 1)/n."""
    return 2 * (n - 1) / n


def bandwidths(nbytes: float, seconds: float, n: int) -> dict:
    """algbw = bytes / time (what the caller sees); busbw = algbw x 2(n-1)/n (what each link carries)."""
    algbw = nbytes / seconds
    return {"algbw": algbw, "busbw": algbw * bus_factor(n)}


def bandwidth_table(results: list[dict]) -> list[dict]:
    """One row per (implementation, size): the slowest rank's time, algbw and busbw in GB/s."""
    n = len(results)
    rows = []
    for name in results[0]["bandwidth"]:
        sizes = results[0]["bandwidth"][name]
        for i, entry in enumerate(sizes):
            seconds = max(r["bandwidth"][name][i]["seconds"] for r in results)
            bw = bandwidths(entry["bytes"], seconds, n)
            rows.append(
                {
                    "implementation": name,
                    "bytes": entry["bytes"],
                    "ms": seconds * 1e3,
                    "algbw GB/s": bw["algbw"] / 1e9,
                    "busbw GB/s": bw["busbw"] / 1e9,
                }
            )
    return rows


def peak_busbw(rows: list[dict]) -> dict:
    """implementation -> its highest busbw (GB/s) over all message sizes."""
    peaks = {}
    for r in rows:
        peaks[r["implementation"]] = max(peaks.get(r["implementation"], 0.0), r["busbw GB/s"])
    return peaks


def fit_alpha_beta(nbytes: list[float], seconds: list[float]) -> tuple[float, float]:
    """The latency-bandwidth (alpha-beta) cost model ``t = alpha + beta * bytes``, fitted to measurements.

    alpha is the fixed cost of one message (s), beta the time per byte (s/B), so 1/beta is the bandwidth
    the messages saw. Least squares on the *relative* error, so a 1 ms message counts as much as a 1 s
    one; alpha is kept >= 0 (a latency below what the sizes can resolve is fitted as 0). Raises
    CourseError on fewer than two distinct sizes or times that do not grow with size.
    """
    if len(nbytes) != len(seconds) or len(set(nbytes)) < 2 or min(seconds) <= 0:
        raise CourseError(
            f"an alpha-beta fit needs two or more distinct message sizes and positive times, got {nbytes!r}, {seconds!r}."
        )
    # weighted least squares, weight 1/t^2: solve the 2x2 normal equations
    w = [1 / t**2 for t in seconds]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, nbytes, strict=True))
    sxx = sum(wi * x * x for wi, x in zip(w, nbytes, strict=True))
    sy = sum(wi * y for wi, y in zip(w, seconds, strict=True))
    sxy = sum(wi * x * y for wi, x, y in zip(w, nbytes, seconds, strict=True))
    beta = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    alpha = (sy - beta * sx) / sw
    if alpha < 0:  # no latency the data can see: the best line through the origin
        alpha, beta = 0.0, sxy / sxx
    if not beta > 0:
        raise CourseError(
            f"the times {seconds!r} do not grow with the message size, so they fit no bandwidth."
        )
    return alpha, beta


def plot_bandwidth(rows: list[dict], copy_gbps: float):
    """algbw and busbw against message size, one line per implementation, memory copy as the ceiling."""
    import matplotlib.pyplot as plt

    from helpers import plots

    names = list(dict.fromkeys(r["implementation"] for r in rows))
    sizes = [r["bytes"] for r in rows if r["implementation"] == names[0]]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.3), sharey=True)
    for ax, kind in zip(axes, ("algbw GB/s", "busbw GB/s"), strict=True):
        series = {name: [r[kind] for r in rows if r["implementation"] == name] for name in names}
        plots.measured_curves(
            sizes,
            series,
            ax=ax,
            logx=True,
            logy=True,
            refs={f"memory copy, {copy_gbps:.1f} GB/s (local ceiling)": copy_gbps},
            xlabel="message size (measured per size)",
            ylabel=f"{kind} (measured)",
            title=kind.split()[0],
        )
        ax.set_xticks(sizes, [human_bytes(s) for s in sizes], rotation=45)
        ax.minorticks_off()
    fig.suptitle("All-reduce bandwidth on this machine, slowest rank of each size")
    fig.tight_layout()
    return fig


def plot_link(links: dict, fits: dict):
    """All-reduce time against message size on each lab link (the fastest repeat, a bar up to the
    slowest) with the fitted alpha-beta line: what was measured beside what the cost model predicts."""
    import matplotlib.pyplot as plt

    from helpers import plots

    fig, ax = plt.subplots(figsize=(7.5, 4.3))
    for i, (rate, rows) in enumerate(links.items()):
        color = plots.PALETTE[i % len(plots.PALETTE)]
        sizes = [r["bytes"] for r in rows]
        fastest = [min(r["samples"]) * 1e3 for r in rows]
        slower = [max(r["samples"]) * 1e3 - f for f, r in zip(fastest, rows, strict=True)]
        ax.errorbar(sizes, fastest, yerr=[[0] * len(rows), slower], fmt="o", color=color, capsize=3,
                    label=f"{rate:g} Mbit/s link, measured (fastest, bar to slowest)")  # fmt: skip
        alpha, beta = fits[rate]
        ax.plot(sizes, [(alpha + beta * x) * 1e3 for x in sizes], ls="--", color=color,
                label=f"alpha-beta fit: {alpha * 1e3:.2f} ms + bytes / ({1 / beta * 8 / 1e6:.0f} Mbit/s)")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sizes, [human_bytes(x) for x in sizes])
    ax.minorticks_off()
    ax.set_xlabel("message size (2 nodes: each node sends this many bytes)")
    ax.set_ylabel("all-reduce time (ms), measured")
    ax.set_title("A real rate-limited link: measured against the alpha-beta model")
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
