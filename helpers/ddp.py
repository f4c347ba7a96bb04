"""DistributedDataParallel (分布式数据并行) from the inside: collectives, a hand-written ring all-reduce, the
Reducer's buckets, and communication hooks (通信钩子) that time every bucket's all-reduce.

The pieces used *inside* launched scripts (``start``, ``mlp``, ``ring_all_reduce``, the hooks and the
timed training step) need ``torch.distributed`` to be initialised; the rest (bucket packing, bandwidth
maths, tables, ``on_ranks`` for the exercises) is plain Python and is what the notebook and the unit tests
call.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import statistics
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from helpers.errors import CourseError
from helpers.exercises import NotAnswered, Wrong

MiB = 2**20  # DDP's bucket_cap_mb counts in these units
TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
# a model with layers of clearly different sizes, small enough to read its buckets one by one
ANATOMY_WIDTHS = (256, 1024, 512, 512, 128, 10)


# --- inside a launched script ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rank:
    """Who this process is: its rank, the world size, and the device it computes on."""

    rank: int
    world: int
    device: object  # torch.device


def start(backend: str = "gloo") -> Rank:
    """Join the process group torchrun prepared (env:// rendezvous) and pick this rank's device.

    On CPU each rank keeps one compute thread: two ranks already fill two cores, and more threads
    would make them fight for the same cores instead of computing.
    """
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend)
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    return Rank(dist.get_rank(), dist.get_world_size(), device)


def sync(device) -> None:
    """Wait for queued GPU work before reading a clock (nothing to wait for on CPU)."""
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(device)


def mlp(widths, seed: int | None = None):
    """Linear layers ``widths[0] -> widths[1] -> ...`` with ReLU between, named fc1, fc2, ..."""
    import torch
    from torch import nn

    if seed is not None:
        torch.manual_seed(seed)
    layers = OrderedDict()
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True), 1):
        layers[f"fc{i}"] = nn.Linear(a, b)
        if i < len(widths) - 1:
            layers[f"relu{i}"] = nn.ReLU()
    return nn.Sequential(layers)


def timing_widths(width: int, depth: int) -> list[int]:
    """The timing model: a wide input layer, ``depth`` square layers, a narrowing head."""
    return [width // 2, 2 * width] + [width] * depth + [width // 4, 10]


def fingerprint(module) -> str:
    """A short hash of every parameter's exact bytes: equal fingerprints mean bit-identical replicas."""
    digest = hashlib.sha256()
    for p in module.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def parameter_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def everyone(value) -> list:
    """Every rank's ``value`` (a small picklable object), gathered on every rank."""
    import torch.distributed as dist

    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


# --- a ring all-reduce by hand --------------------------------------------------------------------


def ring_all_reduce(tensor, group=None):
    """Sum ``tensor`` over all ranks in place, the ring way, with point-to-point sends only.

    The tensor is cut into n chunks. Reduce-scatter: in n - 1 steps every rank passes one chunk to
    its right-hand neighbour and adds the chunk arriving from its left; afterwards rank r holds the
    complete sum of chunk (r + 1) mod n. All-gather: n - 1 more steps pass those finished chunks on
    around the ring until every rank has all of them. Each rank sends 2(n - 1)/n of the tensor in
    total, however many ranks there are.
    """
    import torch
    import torch.distributed as dist

    n, r = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return tensor
    right, left = (r + 1) % n, (r - 1) % n
    if group is not None:  # point-to-point ops take global ranks
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
    flat = tensor.view(-1)
    chunks = list(torch.tensor_split(flat, n))
    inbox = torch.empty_like(chunks[0])

    def exchange(send_index, recv_index):
        incoming = inbox[: chunks[recv_index].numel()]
        ops = [
            dist.P2POp(dist.isend, chunks[send_index], right, group),
            dist.P2POp(dist.irecv, incoming, left, group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return incoming

    for step in range(n - 1):  # reduce-scatter
        chunks[(r - step - 1) % n].add_(exchange((r - step) % n, (r - step - 1) % n))
    for step in range(n - 1):  # all-gather
        chunks[(r - step) % n].copy_(exchange((r - step + 1) % n, (r - step) % n))
    return tensor


# --- bandwidth maths and measurements -------------------------------------------------------------


def bus_factor(n: int) -> float:
    """busbw / algbw for all-reduce: the share of the data each rank must send, 2(n - 1)/n."""
    return 2 * (n - 1) / n


def bandwidths(nbytes: float, seconds: float, n: int) -> dict:
    """algbw = bytes / time (what the caller sees); busbw = algbw x 2(n-1)/n (what each link carries)."""
    algbw = nbytes / seconds
    return {"algbw": algbw, "busbw": algbw * bus_factor(n)}


def time_collective(fn, tensor, repeats: int = 5) -> float:
    """Median seconds of ``fn(tensor)`` after one warm-up call; ranks start each repeat together."""
    import torch.distributed as dist

    fn(tensor)
    times = []
    for _ in range(repeats):
        dist.barrier()
        sync(tensor.device)
        t = time.perf_counter()
        fn(tensor)
        sync(tensor.device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def copy_bandwidth(nbytes: int, device, repeats: int = 5) -> float:
    """This machine's memory-copy speed (bytes/s): copy one large buffer into another, median of repeats."""
    import torch

    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times)


def message_sizes(smallest: int, largest: int, factor: int = 4) -> list[int]:
    sizes, size = [], smallest
    while size <= largest:
        sizes.append(size)
        size *= factor
    return sizes


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


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value >= 10 or value == int(value) else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


# --- buckets ----------------------------------------------------------------------------------------


def expected_buckets(sizes, cap_bytes: int, first_cap_bytes: int | None = None) -> list[list[int]]:
    """DDP's packing rule, for parameter byte sizes listed in the order their gradients become ready.

    Parameters go into the current bucket in that order; a bucket closes as soon as it holds at least
    its cap (the first bucket may have its own, smaller cap). Returns the indices in each bucket.
    """
    buckets, current, filled = [], [], 0
    for i, size in enumerate(sizes):
        current.append(i)
        filled += size
        cap = first_cap_bytes if (first_cap_bytes is not None and not buckets) else cap_bytes
        if filled >= cap:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def parse_index_groups(text: str) -> list[list[int]]:
    """DDP's logging data writes bucket contents as ``"7 6 5, 4 3"``; this gives [[7, 6, 5], [4, 3]]."""
    return [[int(i) for i in group.split()] for group in text.split(",") if group.strip()]


def ddp_buckets(net) -> dict:
    """What DDP itself says about its buckets (from ``net._get_ddp_logging_data()``)."""
    data = net._get_ddp_logging_data()
    rebuilt = data.get("rebuilt_per_bucket_param_indices", "")
    return {
        "rebuilt": bool(data.get("has_rebuilt_buckets")),
        "bucket_cap_bytes": int(data.get("bucket_cap_bytes", 0)),
        "param_indices": parse_index_groups(rebuilt) if rebuilt else [],
        "bucket_bytes": [int(s) for s in str(data.get("rebuilt_bucket_sizes", "")).split(",") if s.strip()],
        "grad_ready_order": [
            int(i)
            for i in str(data.get("prev_iteration_grad_ready_order_indices", "")).replace(",", " ").split()
        ],
        "total_parameter_bytes": int(data.get("total_parameter_size_bytes", 0)),
    }


def bucket_summary(log) -> list[dict]:
    """What a logging comm hook saw in one backward: bucket index, parameter names, bytes."""
    return [
        {k: r[k] for k in ("bucket", "params", "bytes")}
        for r in sorted(log.records, key=lambda r: r["bucket"])
    ]


def predict_buckets(sizes: list[int], ready_order: list[int], cap_bytes: int) -> list[list[int]]:
    """Parameter indices per bucket that :func:`expected_buckets` predicts, given the ready order."""
    packed = expected_buckets([sizes[i] for i in ready_order], cap_bytes)
    return [[ready_order[i] for i in bucket] for bucket in packed]


def layouts(found: dict, sizes: dict) -> dict:
    """Bucket contents as ``{row label: [[(name, bytes), ...] per bucket]}`` for ``plots.bucket_map``."""
    rows = {}
    first = next(iter(found.values()))["first"]
    rows[f"first step, any cap ({len(first)} bucket{'s' * (len(first) > 1)})"] = [
        [(n, sizes[n]) for n in b["params"]] for b in first
    ]
    for cap, entry in found.items():
        later = entry["later"]
        rows[f"bucket_cap_mb={float(cap):g} ({len(later)} bucket{'s' * (len(later) > 1)})"] = [
            [(n, sizes[n]) for n in b["params"]] for b in later
        ]
    return rows


def bucket_rows(records: list[dict], sizes: dict[str, int]) -> list[dict]:
    """A table of what the comm hook saw: one row per bucket, in the order the hook was called."""
    rows = []
    for r in sorted(records, key=lambda r: r["bucket"]):
        names = r["params"]
        rows.append(
            {
                "bucket": r["bucket"],
                "parameters (in bucket order)": ", ".join(names),
                "tensors": len(names),
                "MiB": round(r["bytes"] / MiB, 3),
                "params' own bytes": sum(sizes[n] for n in names),
            }
        )
    return rows


# --- communication hooks that keep time -------------------------------------------------------------


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
        self._thread = threading.Thread(target=self._run, daemon=True)
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
    for start, end in spans:
        start = max(start, reach)
        if end > start:
            covered += end - start
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


# --- figures of what was measured -------------------------------------------------------------------

COLORS = {
    "forward": "#8172B3",
    "backward": "#4C72B0",
    "optimizer step": "#937860",
    "all-reduce": "#DD8452",
    "queued for the wire": "#D9D9D9",
    "on the wire (SIMULATED)": "#DD8452",
}


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


def plot_buckets(found: dict, sizes: dict):
    """The buckets the comm hook saw, one row per bucket_cap_mb, the first step on top."""
    from helpers import plots

    fig = plots.bucket_map(layouts(found, sizes), title="DDP's buckets, read from the comm hook (measured)")
    fig.axes[0].set_xlabel("gradient bytes (MiB), in bucket order: bucket 0 first")
    return fig


# --- showing code in the notebook -----------------------------------------------------------------


# --- exercises --------------------------------------------------------------------------------------


def on_ranks(fn, world: int = 2, timeout: float = 60) -> list:
    """Run ``fn(rank, world)`` on ``world`` ranks of a gloo process group and return each rank's result.

    For exercises: the ranks are processes *forked* from this one, so a function written in a notebook
    cell runs on real ranks without being saved to a file first. A failure on any rank stops all of them
    and comes back as one sentence naming the rank; so does a rank still waiting after ``timeout`` seconds.
    """
    import multiprocessing
    import traceback
    from datetime import timedelta

    from helpers.launching import free_port

    context = multiprocessing.get_context("fork")
    results, port = context.Queue(), free_port()

    def rank_main(rank):
        try:
            import torch
            import torch.distributed as dist

            torch.set_num_threads(1)  # the fork copies no thread pool: stay single-threaded in the child
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                timeout=timedelta(seconds=timeout),
            )  # fmt: skip
            try:
                results.put((rank, True, fn(rank, world)))
            finally:
                dist.destroy_process_group()
        except NotAnswered as none:
            results.put((rank, None, str(none)))
        except Wrong as wrong:  # the checker's own verdict on this rank, already one sentence
            results.put((rank, "wrong", str(wrong)))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, whatever it was
            frames = traceback.extract_tb(exc.__traceback__)
            mine = [f for f in frames if "site-packages" not in f.filename and "/helpers/" not in f.filename]
            where = (mine or frames)[-1]  # the deepest line of the learner's own code, when there is one
            results.put((rank, False, f"{type(exc).__name__}: {exc} (line {where.lineno}, in {where.name})"))
        finally:
            results.close()
            results.join_thread()  # the result is in the pipe before the process ends
            os._exit(0)  # leave at once: the kernel's exit handlers belong to the parent

    ranks = [context.Process(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    for process in ranks:
        process.start()
    found, deadline = {}, time.monotonic() + timeout
    try:
        while len(found) < world:
            try:
                rank, ok, value = results.get(timeout=max(0.01, min(0.5, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise CourseError(
                        f"the {world} ranks did not all finish within {timeout:g} s: is one rank waiting in a "
                        "collective that another never calls?"
                    ) from None
                continue
            if ok is None:
                raise NotAnswered(value)
            if ok == "wrong":
                raise Wrong(value)
            if not ok:
                raise CourseError(f"rank {rank} failed: {value}")
            found[rank] = value
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)
    return [found[r] for r in range(world)]
