"""DDP training in practice (DDP 训练实战): notebook 06's toys, run-layout checks, all-reduce volume, scaling.

DDP training in practice (DDP 训练实战): notebook 06's toy data and model, the checks of a run's layout,
nodes on one machine, all-reduce volume, scaling, and their pictures.

A complete DDP training script needs more than DDP: deterministic toys (:func:`toy_dataset`,
:func:`toy_model`: two runs compare bit for bit), sampler shards (:mod:`helpers.sampling`), checkpoints that
survive a killed worker (:mod:`helpers.checkpoints`), and a process group that survives ``torchrun
--max-restarts`` (06's script: a fresh key prefix in torchrun's store for each attempt).
"""

from __future__ import annotations

import contextlib
import os
import statistics

import torch
from torch import nn

from helpers.errors import CourseError
from helpers.toys import mlp

FEATURES, CLASSES = 32, 10


# --- a deterministic toy problem ------------------------------------------------------------------


def toy_dataset(samples: int, features: int = FEATURES, classes: int = CLASSES, seed: int = 0):
    """A classification data set whose labels come from a fixed random "teacher": same seed, same data."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    teacher = torch.randn(features, classes, generator=generator)
    y = (x @ teacher).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def toy_model(
    hidden: int = 256, features: int = FEATURES, classes: int = CLASSES, seed: int = 0
) -> nn.Module:
    """Notebook 06's MLP (features -> hidden -> hidden -> classes); the same seed, the same weights everywhere."""
    return mlp([features, hidden, hidden, classes], seed=seed)


def check_layout(samples: int, world: int, batch: int, accum: int) -> int:
    """Optimizer steps per epoch; stops unless the data splits into whole steps on every rank."""
    per_step = world * batch * accum
    if samples % per_step:
        raise CourseError(
            f"{samples} samples do not split into whole steps of {world} ranks x BATCH {batch} x ACCUM {accum} "
            f"= {per_step} samples; use a multiple of {per_step}."
        )
    return samples // per_step


def check_world(nproc: int) -> None:
    """This lesson splits its ranks over two simulated nodes: it needs an even number of processes."""
    if nproc < 2 or nproc % 2:
        raise CourseError(
            f"NPROC = {nproc} does not work here; this lesson needs an even number of processes, at least 2, "
            "so that they split over two simulated nodes: set NPROC = 2 (or None)."
        )


def check_kill_at(kill_at: int, save_every: int, total_steps: int) -> None:
    """KILL_AT must be a checkpoint step after the first checkpoint, within the run."""
    if kill_at % save_every or not 2 * save_every <= kill_at <= total_steps:
        raise CourseError(
            f"KILL_AT = {kill_at} must be a multiple of SAVE_EVERY = {save_every} from {2 * save_every} "
            f"to {total_steps} (the run has {total_steps} steps), so that an earlier checkpoint exists."
        )


def node_env(profile, node_rank: int) -> dict:
    """Environment for one simulated node: on GPUs each node sees its own half of the devices this process
    may use (``devices.visible_gpus``: on a server that gave it GPUs 4-7, node 0 gets 4,5 and node 1 6,7)."""
    from helpers import devices

    if profile.name != "gpu":  # the gpu shape on the CPU gets the gpu profile's, as a GPU machine would
        return devices.cpu_env()
    half = profile.nproc // 2
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices.visible_gpus(half, first=node_rank * half))}


# --- timing -------------------------------------------------------------------------------------------------


def samples_per_second(step_seconds: list[float], batch_per_rank: int, world: int) -> float:
    """Throughput from the median step time: every rank handles ``batch_per_rank`` samples a step."""
    return world * batch_per_rank / statistics.median(step_seconds)


def slowest_rank_steps(per_rank: list[list[float]]) -> list[float]:
    """Per step, the slowest rank's time: a synchronous step is as slow as its slowest rank."""
    return [max(times) for times in zip(*per_rank, strict=True)]


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with ``n`` intra-op threads, then restore the previous setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def machine_load() -> dict:
    """CPU cores and the 1-minute load average: how busy the machine was while we measured."""
    return {"cores": len(os.sched_getaffinity(0)), "load average (1 min)": round(os.getloadavg()[0], 2)}


# --- plots of what was measured ---------------------------------------------------------------------------


def plot_comm(rows: list[dict]):
    """All-reduce calls and megabytes per optimizer step, with and without no_sync (counted by the hook)."""
    import matplotlib.pyplot as plt

    from helpers.plots import PALETTE

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    labels = [r["accumulation"] for r in rows]
    for ax, key, ylabel in ((axes[0], "all-reduce calls", "calls"), (axes[1], "MB all-reduced", "MB")):
        values = [r[key] for r in rows]
        bars = ax.bar(labels, values, color=[PALETTE[0], PALETTE[1]][: len(rows)], width=0.55)
        ax.bar_label(bars, [f"{v:.3g}" for v in values])
        ax.set_ylabel(f"{ylabel} per optimizer step")
        ax.set_ylim(0, max(values) * 1.2)
        ax.grid(axis="x", visible=False)
    fig.suptitle("Gradient accumulation: what the counting comm hook saw (per rank)")
    fig.tight_layout()
    return fig


def plot_scaling(rows: list[dict], ideal: float, nproc: int, note: str = ""):
    """Samples per second measured for each configuration, against ideal linear scaling."""
    import matplotlib.pyplot as plt

    from helpers.plots import PALETTE

    fig, ax = plt.subplots(figsize=(7, 3.6))
    labels = [r["configuration"] for r in rows]
    values = [r["samples/s"] for r in rows]
    bars = ax.bar(labels, values, color=PALETTE[: len(rows)], width=0.55)
    ax.bar_label(bars, [f"{v:,.0f}" for v in values])
    ax.axhline(ideal, color="black", ls="--", lw=1, label=f"ideal: {nproc} x one process = {ideal:,.0f}")
    ax.set_ylabel("samples per second (measured)")
    ax.set_ylim(0, max(max(values), ideal) * 1.25)
    ax.legend(frameon=False, loc="upper left")
    ax.grid(axis="x", visible=False)
    ax.set_title("DDP throughput, one CPU thread per process" + (f"\n{note}" if note else ""))
    fig.tight_layout()
    return fig
