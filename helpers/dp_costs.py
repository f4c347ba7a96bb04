"""What DataParallel costs, measured: the main device's burden, step times against K devices, torch's own DataParallel."""

from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from helpers import compare
from helpers.dataparallel import (
    MAIN,
    ModelSpec,
    ThreadedDataParallel,
    make_batch,
    make_model,
    make_optimizer,
    single_device_step,
)


def burden(spec: ModelSpec, batch: int, k_max: int, repeats: int = 3) -> list[dict]:
    """For K = 1..k_max: what the main device moves, holds and spends against the average other device.

    Each K runs ``repeats`` steps; bytes come from the last step, CPU times are medians over the steps.
    CPU time (``time.thread_time``) counts the work itself; a lane's wall time would also count the
    time its thread waited for the GIL or for a free core.
    """
    rows = []
    x, y = make_batch(spec, batch)
    for k in range(1, k_max + 1):
        dp = ThreadedDataParallel(make_model(spec), k)
        traces = [dp.step(x, y) for _ in range(repeats)]
        last = traces[-1]
        cpu = [statistics.median(t.cpu()[d] for t in traces) for d in range(k)]
        moved, held = last.moved(), last.held_bytes()
        others = range(1, k)
        rows.append(
            {
                "K": k,
                "main MB moved": moved[MAIN] / 2**20,
                "other MB moved": _mean(moved, others) / 2**20,
                "main MB held": held[MAIN] / 2**20,
                "other MB held": _mean(held, others) / 2**20,
                "main CPU ms": cpu[MAIN] * 1e3,
                "other CPU ms": _mean(cpu, others) * 1e3,
                "main share of bytes moved": moved[MAIN] / sum(moved) if sum(moved) else 1.0,
                "main share of CPU time": cpu[MAIN] / sum(cpu),
            }
        )
    return rows


def _mean(values, indices) -> float:
    """Mean of ``values`` at ``indices`` (NaN when there are none)."""
    indices = list(indices)
    return sum(values[i] for i in indices) / len(indices) if indices else float("nan")


def spread_ms(seconds: list[float]) -> tuple[float, float, float]:
    """Median, lower and upper quartile of step times, in milliseconds: the middle half of the steps lies
    between the quartiles (one step: all three are that step)."""
    ms = sorted(s * 1e3 for s in seconds)
    if len(ms) < 2:
        return ms[0], ms[0], ms[0]
    q1, median, q3 = statistics.quantiles(ms, n=4, method="inclusive")
    return median, q1, q3


def verdict(a: str, a_ms: tuple[float, float, float], b: str, b_ms: tuple[float, float, float]) -> str:
    """Which of two timed runs was faster, as a finding only when their middle halves do not overlap.

    ``a_ms`` and ``b_ms`` are :func:`spread_ms` triples. Overlapping quartile ranges mean the medians'
    difference is smaller than how much single steps move: "within the spread: not a finding".
    """
    (ma, lo_a, hi_a), (mb, lo_b, hi_b) = a_ms, b_ms
    ratio = max(ma, mb) / min(ma, mb)
    if hi_a < lo_b or hi_b < lo_a:
        faster = a if ma < mb else b
        return f"{faster} faster by {ratio:.2f}x, outside the spread of single steps"
    return f"medians {ratio:.2f}x apart, within the spread of single steps: not a finding"


def step_times(spec: ModelSpec, batch: int, k_max: int, steps: int, warmup: int = 1) -> list[dict]:
    """Median wall time of one training step: one device (plain PyTorch), then K = 1..k_max threads.

    Every configuration gets the same global batch. The configurations take turns, one step each,
    so a machine that gets busier or quieter meanwhile affects them all alike. Each row carries the
    quartiles of its step times (``q1 ms``, ``q3 ms``: the middle half of the steps); each threaded row
    also the wall time of the forward and backward phases and the CPU time their threads used.
    """
    x, y = make_batch(spec, batch)
    model = make_model(spec)
    optimizer = make_optimizer(model)
    parallel = {k: ThreadedDataParallel(make_model(spec), k) for k in range(1, k_max + 1)}
    walls: dict[int, list[float]] = {k: [] for k in [0, *parallel]}
    phase_walls: dict[int, list[float]] = {k: [] for k in parallel}
    phase_cpus: dict[int, list[float]] = {k: [] for k in parallel}
    for i in range(warmup + steps):
        start = time.perf_counter()
        single_device_step(model, x, y, optimizer)
        if i >= warmup:
            walls[0].append(time.perf_counter() - start)
        for k, dp in parallel.items():
            start = time.perf_counter()
            trace = dp.step(x, y)
            wall = time.perf_counter() - start
            if i < warmup:
                continue
            walls[k].append(wall)
            work = [e for e in trace.events if e.step in ("parallel forward", "parallel backward")]
            phase_walls[k].append(
                sum(
                    max(e.end for e in work if e.step == s) - min(e.start for e in work if e.step == s)
                    for s in ("parallel forward", "parallel backward")
                )
            )
            phase_cpus[k].append(sum(e.cpu for e in work))
    rows = [
        {
            "config": "one device",
            "K": 0,
            "step ms": statistics.median(walls[0]) * 1e3,
            "q1 ms": spread_ms(walls[0])[1],
            "q3 ms": spread_ms(walls[0])[2],
            "fwd+bwd wall ms": "",
            "fwd+bwd thread CPU ms": "",
        }
    ]
    for k in parallel:
        rows.append(
            {
                "config": f"K={k} threads",
                "K": k,
                "step ms": statistics.median(walls[k]) * 1e3,
                "q1 ms": spread_ms(walls[k])[1],
                "q3 ms": spread_ms(walls[k])[2],
                "fwd+bwd wall ms": statistics.median(phase_walls[k]) * 1e3,
                "fwd+bwd thread CPU ms": statistics.median(phase_cpus[k]) * 1e3,
            }
        )
    return rows


def train_threaded(spec: ModelSpec, batch: int, steps: int, k: int, lr: float = 0.05, warmup: int = 1):
    """Train ``steps`` steps with :class:`ThreadedDataParallel` on K devices (batch seeds 1000 + step).

    Returns the trained model and the wall time of each step after ``warmup``; step ``i`` uses
    ``make_batch(spec, batch, seed=1000 + i)``, exactly as the DDP script in the lesson does.
    """
    model = make_model(spec)
    dp = ThreadedDataParallel(model, k, lr=lr)
    times = []
    for i in range(steps + warmup):
        x, y = make_batch(spec, batch, seed=1000 + i)
        start = time.perf_counter()
        dp.step(x, y)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return model, times


def train_single_device(spec: ModelSpec, batch: int, steps: int, lr: float = 0.05, warmup: int = 1):
    """The reference for :func:`train_threaded`: plain PyTorch on one device, same batches and steps."""
    model = make_model(spec)
    optimizer = make_optimizer(model, lr)
    times = []
    for i in range(steps + warmup):
        x, y = make_batch(spec, batch, seed=1000 + i)
        start = time.perf_counter()
        single_device_step(model, x, y, optimizer)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return model, times


@contextmanager
def count_thread_starts():
    """Count the threads started inside the block: ``with count_thread_starts() as started: ...``."""
    started = [0]
    original = threading.Thread.start

    def counting(self, *args, **kwargs):
        started[0] += 1
        return original(self, *args, **kwargs)

    threading.Thread.start = counting
    try:
        yield started
    finally:
        threading.Thread.start = original


def torch_dataparallel_on_cpu(spec: ModelSpec, batch: int) -> dict:
    """Wrap a model in the real nn.DataParallel where no GPU is visible, and watch what it does."""
    x, y = make_batch(spec, batch)
    plain, module = make_model(spec), make_model(spec)
    wrapped = nn.DataParallel(module)
    calls = dict.fromkeys(("module.forward", "scatter", "replicate", "parallel_apply", "gather"), 0)

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    for name in ("scatter", "replicate", "parallel_apply", "gather"):
        setattr(wrapped, name, counted(name, getattr(wrapped, name)))
    module.register_forward_hook(lambda *_: calls.__setitem__("module.forward", calls["module.forward"] + 1))
    with count_thread_starts() as started:
        out_wrapped = wrapped(x)
        F.cross_entropy(out_wrapped, y).backward()
    out_plain = plain(x)
    F.cross_entropy(out_plain, y).backward()
    return {
        "device_ids": list(wrapped.device_ids),
        "wraps the module itself": wrapped.module is module,
        "calls": calls,
        "threads started": started[0],
        "max output difference": (out_plain - out_wrapped).abs().max().item(),
        "max gradient difference": compare.largest_difference(
            compare.gradients(plain), compare.gradients(module)
        ),
    }


def torch_pieces_on_gpus(spec: ModelSpec, batch: int, device_ids) -> dict:
    """Run torch.nn.parallel's scatter, replicate, parallel_apply and gather by hand on real GPUs and
    compare outputs and gradients with :class:`ThreadedDataParallel` on the CPU (same K, same batch)."""
    from torch.nn.parallel import gather, parallel_apply, replicate, scatter

    main = torch.device("cuda", device_ids[0])
    x, y = make_batch(spec, batch)
    model = make_model(spec).to(main)
    inputs = scatter(x.to(main), device_ids)  # 1. scatter inputs
    replicas = replicate(model, device_ids[: len(inputs)])  # 2. replicate model
    outputs = parallel_apply(replicas, list(inputs))  # 3. parallel forward, one thread per GPU
    gathered = gather(outputs, main)  # 4. gather outputs on the main GPU
    loss = F.cross_entropy(gathered, y.to(main))  # 5. loss on the main GPU
    loss.backward()  # 6.-8. loss gradient, backward on every GPU, gradients reduced onto `model`

    mine = make_model(spec)
    trace = ThreadedDataParallel(mine, len(device_ids)).step(x, y)  # .grad survives the update
    return {
        "replicas": len(replicas),
        "replica devices": [str(next(r.parameters()).device) for r in replicas],
        "chunk rows": [len(c) for c in inputs],
        "loss difference": abs(loss.item() - trace.loss),
        "max gradient difference": max(
            (p.grad.cpu() - q.grad).abs().max().item()
            for p, q in zip(model.parameters(), mine.parameters(), strict=True)
        ),
    }


def torch_stage_costs(spec: ModelSpec, batch: int, device_ids, repeats: int = 5) -> dict:
    """What torch's DataParallel costs every step on real GPUs: each of its stages timed (CUDA synchronised,
    median of ``repeats`` after one warm-up step), and each GPU's peak memory over those steps."""
    from torch.nn.parallel import gather, parallel_apply, replicate, scatter

    main = torch.device("cuda", device_ids[0])
    x, y = (t.to(main) for t in make_batch(spec, batch))
    model = make_model(spec).to(main)
    stages: dict[str, list[float]] = {}

    def timed(name, fn):
        for d in device_ids:
            torch.cuda.synchronize(d)
        start = time.perf_counter()
        out = fn()
        for d in device_ids:
            torch.cuda.synchronize(d)
        stages.setdefault(name, []).append(time.perf_counter() - start)
        return out

    for d in device_ids:
        torch.cuda.reset_peak_memory_stats(d)
    for _ in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        inputs = timed("scatter inputs", lambda: scatter(x, device_ids))
        replicas = timed("replicate model (every step)", lambda: replicate(model, device_ids[: len(inputs)]))  # noqa: B023
        outputs = timed("parallel forward", lambda: parallel_apply(replicas, list(inputs)))  # noqa: B023
        gathered = timed("gather outputs on GPU 0", lambda: gather(outputs, main))  # noqa: B023
        timed("loss on GPU 0, backward, reduce", lambda: F.cross_entropy(gathered, y).backward())  # noqa: B023
    return {
        "ms": {name: 1e3 * statistics.median(t[1:]) for name, t in stages.items()},
        "peak MiB": [torch.cuda.max_memory_allocated(d) / 2**20 for d in device_ids],
    }


def plot_burden(rows: list[dict]):
    """Bytes moved, bytes held and busy time per step: the main device against the average other one."""
    import matplotlib.pyplot as plt

    from helpers.plots import PALETTE

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    ks = [r["K"] for r in rows]
    panels = (
        ("MB moved", "MB copied in or out per step"),
        ("MB held", "MB held at the end of a step"),
        ("CPU ms", "CPU ms of work per step (median)"),
    )
    for ax, (what, ylabel) in zip(axes, panels, strict=True):
        main = [r[f"main {what}"] for r in rows]
        other = [r[f"other {what}"] for r in rows]
        ax.bar([k - 0.2 for k in ks], main, width=0.4, color=PALETTE[3], label="dev0 (main)")
        ax.bar([k + 0.2 for k in ks], other, width=0.4, color=PALETTE[0], label="other devices (mean)")
        ax.set_xticks(ks)
        ax.set_xlabel("K virtual devices")
        ax.set_ylabel(ylabel)
        ax.set_title({"CPU ms": "CPU time used"}.get(what, what))
    axes[0].legend(frameon=False, loc="upper left")
    fig.suptitle("The main device's burden, measured from the trace (one process, CPU)")
    fig.tight_layout()
    return fig


def plot_step_times(results: dict[str, list[dict]]):
    """Step time against K for each model: milliseconds (median and quartiles), speed-up over one device, and how many
    threads were computing at once (their CPU time over the wall time of forward + backward)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 3.8))
    for name, rows in results.items():
        one, threaded = rows[0]["step ms"], rows[1:]
        ks = [r["K"] for r in threaded]
        ms = [r["step ms"] for r in threaded]
        quartiles = [
            [m - r["q1 ms"] for m, r in zip(ms, threaded, strict=True)],
            [r["q3 ms"] - m for m, r in zip(ms, threaded, strict=True)],
        ]
        line = left.errorbar(ks, ms, yerr=quartiles, marker="o", capsize=3, label=name).lines[0]
        left.axhline(one, ls=":", lw=1, color=line.get_color())
        left.axhspan(rows[0]["q1 ms"], rows[0]["q3 ms"], color=line.get_color(), alpha=0.12, lw=0)
        middle.plot(ks, [one / r["step ms"] for r in threaded], marker="o", label=name)
        ratio = [r["fwd+bwd thread CPU ms"] / r["fwd+bwd wall ms"] for r in threaded]
        right.plot(ks, ratio, marker="o", label=name)
    left.set_yscale("log")
    left.yaxis.set_major_formatter(ScalarFormatter())
    left.yaxis.set_minor_formatter(NullFormatter())
    left.set_ylabel("ms per step (median; bars: middle half)")
    left.set_title("dotted line and band: one device", fontsize=10)
    middle.axhline(1, color="black", lw=1)
    middle.set_ylabel("speed-up over one device (>1 is faster)")
    right.set_ylabel("threads' CPU time / wall time")
    right.set_title("fwd + bwd: threads computing at once", fontsize=10)
    right.set_ylim(bottom=0)
    for ax in (left, middle, right):
        ax.set_xticks(ks)
        ax.set_xlabel("K threads (virtual devices)")
    middle.legend(frameon=False)
    fig.suptitle("One process, K threads, the same global batch: measured step time")
    fig.tight_layout()
    return fig


def plot_dp_vs_ddp(times: dict[str, list[float]]):
    """Every measured step time of each approach (dots) and its median (bar), one row each."""
    import matplotlib.pyplot as plt

    from helpers.plots import PALETTE

    fig, ax = plt.subplots(figsize=(8, 0.8 * len(times) + 1.4))
    labels = []
    for i, (name, seconds) in enumerate(times.items()):
        ms = [s * 1e3 for s in seconds]
        ax.barh(i, statistics.median(ms), color=PALETTE[i], alpha=0.45, height=0.6)
        ax.plot(ms, [i] * len(ms), "o", color=PALETTE[i], ms=4)
        labels.append(f"{name}\nmedian {statistics.median(ms):.1f} ms")
    ax.set_yticks(range(len(times)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms per training step (measured; bar: median, dots: every step)")
    ax.set_xlim(left=0)
    ax.set_title("Same model, same global batch, same steps")
    fig.tight_layout()
    return fig
