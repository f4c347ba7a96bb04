"""Communication overlapped with backward: comm hooks that time each bucket, a simulated link, and the overlap measured."""

from __future__ import annotations

import contextlib
import queue
import statistics
import threading
import time
from dataclasses import dataclass, field

from helpers.bytecount import human_bytes
from helpers.worker import sync


class SimulatedLink:
    """A SIMULATED network: one wire, messages in order, each taking ``latency + bytes / bandwidth``.

    Nothing is sent: the future handed back to DDP completes, with the rank's own gradients unchanged,
    once the simulated wire time is over. A worker thread plays the wire, so a message waits for the one
    before it, as on a real link, and waiting costs no CPU, as with a real network card. Replicas are
    not kept in sync by it: use it to measure time, not to train.
    """

    def __init__(self, bandwidth: float, latency: float = 0.0):
        self.bandwidth, self.latency = float(bandwidth), float(latency)
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="simulated link", daemon=True)
        self._thread.start()

    def wire_seconds(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth

    def send(self, buffer):
        """Queue ``buffer`` on the wire; the returned Future completes when it has been "delivered"."""
        import torch

        done = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        self._queue.put((buffer, done))
        return done

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            buffer, done = item  # the wire is free now: this message starts
            time.sleep(self.wire_seconds(buffer.numel() * buffer.element_size()))
            done.set_result([buffer])

    def close(self):
        self._queue.put(None)
        self._thread.join(timeout=5)


@dataclass
class HookLog:
    """The state a timing comm hook writes into: one record per bucket all-reduce."""

    names: dict  # parameter -> its name
    world: int
    link: SimulatedLink | None = None
    records: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, module, world: int, link: SimulatedLink | None = None) -> HookLog:
        return cls({p: n for n, p in module.named_parameters()}, world, link)

    def reset(self) -> None:
        self.records = []

    def send(self, index: int, params: list[str], buffer):
        """Average ``buffer`` over the ranks (with a simulated link: only wait), logging when it was ready and done."""
        import torch.distributed as dist

        entry = {
            "bucket": index,
            "params": params,
            "bytes": buffer.numel() * buffer.element_size(),
            "ready": time.perf_counter(),
            "done": None,
        }
        with self._lock:
            self.records.append(entry)
        if self.link is not None:  # SIMULATED: nothing travels, only time passes
            fut = self.link.send(buffer)
        else:
            buffer.div_(self.world)  # sum of (g / n) over n ranks = the average gradient
            fut = dist.all_reduce(buffer, async_op=True).get_future()

        def finished(f):
            entry["done"] = time.perf_counter()
            return f.value()[0]

        return fut.then(finished)


def timed_allreduce_hook(state: HookLog, bucket):
    """A DDP comm hook: average the bucket like DDP's default hook, and log which parameters it held,
    how many bytes, when backward made it ready and when its all-reduce finished."""
    params = [state.names[p] for p in bucket.parameters()]
    return state.send(bucket.index(), params, bucket.buffer())


def allreduce_after_backward(log: HookLog, buckets: list[list]):
    """The no-overlap baseline: after backward has finished, average every gradient, bucket by bucket.

    ``buckets``: lists of parameters, the same grouping DDP used, so only the timing differs.
    """
    import torch

    pending = []
    for index, params in enumerate(buckets):
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        pending.append((params, flat, log.send(index, [log.names[p] for p in params], flat)))
    for params, flat, fut in pending:
        fut.wait()
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def buckets_from_log(log: HookLog, module) -> list[list]:
    """The parameters of each bucket, as the hook last saw them, in bucket order."""
    by_name = dict(module.named_parameters())
    return [[by_name[n] for n in r["params"]] for r in sorted(log.records, key=lambda r: r["bucket"])]


def make_batch(widths, batch: int, rank: int, device):
    """Random inputs and targets, different on every rank (each rank reads its own shard of data)."""
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(batch, widths[0], generator=g).to(device)
    y = torch.randn(batch, widths[-1], generator=g).to(device)
    return x, y


def timed_step(net, x, y, optimizer, log: HookLog, *, overlap: bool = True, buckets=None) -> dict:
    """One training step with timestamps: forward, backward (with or without overlap), optimizer step.

    overlap=True: DDP as usual, the hook starts each bucket's all-reduce while backward continues.
    overlap=False: backward under ``no_sync()`` (no communication), then every bucket is all-reduced.
    On a GPU the hook's clock readings are when the host queued the work, so the per-bucket times are
    approximate there; the step times are synchronised and exact.
    """
    import torch.nn.functional as F

    device = x.device
    log.reset()
    # no_sync() must cover the forward too: DDP decides in forward whether backward will communicate
    quiet = contextlib.nullcontext() if overlap else net.no_sync()
    sync(device)
    t0 = time.perf_counter()
    with quiet:
        loss = F.mse_loss(net(x), y)
        sync(device)
        t1 = time.perf_counter()
        loss.backward()  # with overlap, the hook fires bucket by bucket while this runs
        sync(device)
    if overlap:
        comm_end = time.perf_counter()
        backward_end = max(r["ready"] for r in log.records)  # the last gradient made its bucket ready
    else:
        backward_end = time.perf_counter()
        allreduce_after_backward(log, buckets)
        sync(device)
        comm_end = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad()
    sync(device)
    t3 = time.perf_counter()
    return {
        "overlap": overlap,
        "start": t0,
        "forward_end": t1,
        "backward_end": backward_end,
        "comm_end": comm_end,
        "end": t3,
        "seconds": t3 - t0,
        "backward_seconds": backward_end - t1,
        "buckets": [dict(r) for r in sorted(log.records, key=lambda r: r["bucket"])],
    }


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


def comm_during_backward(step: dict) -> float:
    """Seconds of backward during which at least one bucket's all-reduce was in flight."""
    lo, hi = step["forward_end"], step["backward_end"]
    spans = sorted((max(b["ready"], lo), min(b["done"], hi)) for b in step["buckets"])
    covered, reach = 0.0, lo
    for init_rank, end in spans:
        init_rank = max(init_rank, reach)
        if end > init_rank:
            covered += end - init_rank
            reach = end
    return covered


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
    """Step time against bucket_cap_mb, one line per network, the default 25 MB marked."""
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
        "DDP's default, 25",
        (25, 0.03),
        xycoords=("data", "axes fraction"),
        rotation=90,
        ha="right",
        fontsize=8,
    )
    return ax
