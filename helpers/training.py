"""DDP training in practice (DDP 训练实战): toy data and model, sampler shards, atomic checkpoints, counted all-reduces.

The pieces a complete DDP training script needs besides DDP itself:

- :func:`toy_dataset` / :func:`toy_model`: deterministic, so every run (and every restart) sees the same
  numbers and two runs can be compared bit for bit;
- :func:`sampler_indices`: what DistributedSampler hands each rank, epoch by epoch, without processes;
- :func:`atomic_save` / :func:`load_checkpoint`: write a temporary file, fsync, ``os.replace``; a
  process killed mid-write leaves the previous checkpoint as the one that loads;
- :class:`CommCounter` + :func:`counting_allreduce`: a DDP communication hook that counts what it sends;
- :func:`init_distributed`: ``init_process_group`` that survives ``torchrun --max-restarts``;
- :class:`EventLog`: rank 0's append-only diary, which survives a SIGKILL;
- :func:`dp_and_plain_step_times`: a thread-based DataParallel step against a plain one, for the comparison.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from helpers.dataparallel import run_in_threads
from helpers.errors import CourseError

FEATURES, CLASSES = 32, 10
TMP_MARK = ".tmp-"  # temporary checkpoint files are named .<name>.tmp-<pid>


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
    """An MLP (features -> hidden -> hidden -> classes); the same seed gives the same weights in every process."""
    with torch.random.fork_rng(devices=[]):  # PyTorch's usual initialisation; the global RNG is left alone
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )
    return model


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
    """This lesson splits its ranks over two simulated nodes: it needs an even number of processes (on GPUs
    ``profiles.with_ranks`` has already made it one)."""
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
    may use (``launching.visible_gpus``: on a server that gave it GPUs 4-7, node 0 gets 4,5 and node 1 6,7)."""
    from helpers.launching import visible_gpus

    if profile.device != "cuda":
        return {}
    half = profile.nproc // 2
    return {"CUDA_VISIBLE_DEVICES": ",".join(visible_gpus(half, first=node_rank * half))}


def swift_launch_env() -> list[str]:
    """The environment variables the installed ms-swift CLI turns into torchrun flags (read from its source).

    ``swift.cli.main.get_torchrun_args`` passes each of them on as ``--<name in lower case>``; the
    source is read rather than imported, because importing swift takes seconds.
    """
    import importlib.util
    import re

    spec = importlib.util.find_spec("swift")
    if spec is None or not spec.submodule_search_locations:
        raise CourseError("ms-swift is not installed; run `make setup`.")
    source = (Path(next(iter(spec.submodule_search_locations))) / "cli" / "main.py").read_text()
    found = re.search(r"for env_key in \[([^\]]*)\]", source)
    if not found:
        raise CourseError(
            "this ms-swift version no longer lists its torchrun variables in swift/cli/main.py."
        )
    return re.findall(r"'([A-Z_]+)'", found.group(1))


def device_for(backend: str) -> torch.device:
    """In a launched script: this rank's device (cuda:LOCAL_RANK with nccl, else the CPU)."""
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_distributed(backend: str) -> None:
    """``dist.init_process_group`` for a script that torchrun may restart (``--max-restarts``).

    torchrun keeps one key-value store (a TCPStore) for the whole job, and a new process group
    publishes its members' network addresses in it. After a restart the dead workers' addresses are
    still there; with gloo the new workers may read them and fail to connect ("Connection refused").
    Each attempt therefore gets its own key prefix, ``attempt<TORCHELASTIC_RESTART_COUNT>/``.
    """
    import datetime

    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # not under torchrun: the usual way
        dist.init_process_group(backend)
        return
    timeout = datetime.timedelta(minutes=5)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"attempt{attempt}/", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )


# --- DistributedSampler, inspected without any processes ---------------------------------------------


def sampler_indices(samples: int, world: int, epochs: int, set_epoch: bool = True, seed: int = 0):
    """``[epoch][rank]`` -> the sample indices DistributedSampler gives that rank in that epoch.

    ``set_epoch=False`` reproduces the classic bug: the sampler is never told the epoch changed.
    """
    from torch.utils.data import DistributedSampler

    data = range(samples)
    samplers = [
        DistributedSampler(data, num_replicas=world, rank=r, shuffle=True, seed=seed) for r in range(world)
    ]
    out = []
    for epoch in range(epochs):
        if set_epoch:
            for s in samplers:
                s.set_epoch(epoch)
        out.append([list(s) for s in samplers])
    return out


def every_epoch_identical(indices) -> bool:
    """True when every epoch hands every rank exactly the order of epoch 0."""
    return all(epoch == indices[0] for epoch in indices)


def disjoint_cover(ranks: list[list[int]], samples: int) -> bool:
    """True when the ranks' shards share no sample and together hold every sample once."""
    flat = [i for shard in ranks for i in shard]
    return len(flat) == samples and sorted(flat) == list(range(samples))


def sample_table(indices, show: int = 8) -> list[dict]:
    """Rows for report.table: the first ``show`` indices of each rank in each epoch."""
    rows = []
    for epoch, ranks in enumerate(indices):
        row = {"epoch": epoch}
        for rank, shard in enumerate(ranks):
            row[f"rank {rank}"] = " ".join(map(str, shard[:show])) + (" …" if len(shard) > show else "")
        rows.append(row)
    return rows


def resume_point(step: int, steps_per_epoch: int, accum: int) -> tuple[int, int]:
    """Where a run restarted after ``step`` optimizer steps picks up: (epoch, micro-batches to skip in it)."""
    epoch, done = divmod(step, steps_per_epoch)
    return epoch, done * accum


# --- checkpoints: atomic on disk ------------------------------------------------------------------------


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj, path, wrap=None) -> Path:
    """``torch.save(obj)`` to ``path`` so that ``path`` is either the old file or the complete new one.

    Write ``.<name>.tmp-<pid>`` next to it, flush and fsync it, ``os.replace`` it over ``path`` (an
    atomic rename on POSIX) and fsync the folder so the rename itself is durable. ``wrap(file)`` may
    return a file-like object to write through instead (the lesson uses it to inject a crash).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    with open(tmp, "wb") as handle:
        torch.save(obj, wrap(handle) if wrap else handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


class KillAfterBytes:
    """A file wrapper that lets ``limit`` bytes through, then SIGKILLs its own process: a crash mid-write."""

    def __init__(self, handle, limit: int):
        self.handle, self.limit, self.written = handle, int(limit), 0

    def write(self, data) -> int:
        data = bytes(data)
        room = self.limit - self.written
        if len(data) >= room:
            self.handle.write(data[:room])
            self.handle.flush()  # the half-written file really is on disk when the process dies
            os.kill(os.getpid(), signal.SIGKILL)
        self.handle.write(data)
        self.written += len(data)
        return len(data)

    def flush(self) -> None:
        self.handle.flush()


def load_checkpoint(path, device="cpu"):
    """The checkpoint at ``path``, or None when there is none yet (a half-written temp file is never read)."""
    path = Path(path)
    if not path.is_file():
        return None
    return torch.load(path, map_location=device, weights_only=True)


def try_load(path) -> tuple[bool, str]:
    """(True, what it holds) if ``path`` loads as a checkpoint, else (False, why not)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated zip archive, an unpickling error, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return False, f"{type(exc).__name__}: {first.split('. ')[0][:120]}"
    return True, f"step {state.get('step')}" if isinstance(state, dict) and "step" in state else "loads"


def folder_listing(folder) -> list[dict]:
    """Every file in ``folder`` with its size and whether it loads as a checkpoint (for .pt files)."""
    rows = []
    for p in sorted(Path(folder).iterdir()):
        if not p.is_file():
            continue
        row = {"file": p.name, "bytes": p.stat().st_size, "loads?": "", "holds": ""}
        if p.suffix == ".pt" or TMP_MARK in p.name:
            ok, what = try_load(p)
            row["loads?"], row["holds"] = ok, what
        rows.append(row)
    return rows


def partial_files(folder) -> list[Path]:
    """Temporary checkpoint files left behind by a process that died while writing."""
    return sorted(p for p in Path(folder).iterdir() if TMP_MARK in p.name)


def load_weights(path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("model", state)


def bit_equal(a: dict, b: dict) -> bool:
    """Every tensor identical, bit for bit."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- an append-only event log that survives SIGKILL -------------------------------------------------------


class EventLog:
    """JSON lines appended and flushed one by one: what was written before a SIGKILL stays on disk."""

    def __init__(self, path, enabled: bool = True):
        self.path, self.enabled = Path(path), enabled

    def write(self, **event) -> None:
        """Append one event; everything but per-step events is also printed."""
        if not self.enabled:
            return
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"time": time.time(), **event}) + "\n")
        if event.get("event") != "step":
            details = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("event", "attempt"))
            print(f"attempt {event.get('attempt', '?')}: {event.get('event')} {details}", flush=True)


def read_events(path) -> list[dict]:
    path = Path(path)
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def fault_story(events: list[dict]) -> list[dict]:
    """One row per attempt: where it started, the last step it finished, checkpoints saved, how it ended."""
    rows: dict[int, dict] = {}
    for e in events:
        row = rows.setdefault(
            e["attempt"],
            {"attempt": e["attempt"], "started at step": None, "last step": None, "saved": [], "ended": ""},
        )
        if e["event"] == "start":
            row["started at step"] = e["step"]
        elif e["event"] == "step":
            row["last step"] = e["step"]
        elif e["event"] == "saved":
            row["saved"].append(e["step"])
        elif e["event"] == "crash":
            row["ended"] = f"SIGKILL while writing the step {e['step']} checkpoint"
        elif e["event"] == "done":
            row["ended"] = "finished"
    return list(rows.values())


# --- counting what DDP sends ---------------------------------------------------------------------------------


class CommCounter:
    """State for :func:`counting_allreduce`: all-reduce calls and bytes, per bucket."""

    def __init__(self, process_group=None):
        self.process_group = process_group
        self.calls = 0
        self.bytes = 0
        self.bucket_bytes: dict[int, int] = {}

    def reset(self) -> None:
        self.calls, self.bytes, self.bucket_bytes = 0, 0, {}

    @property
    def buckets(self) -> int:
        return len(self.bucket_bytes)

    def summary(self) -> dict:
        return {"calls": self.calls, "bytes": self.bytes, "buckets": self.buckets}


def counting_allreduce(state: CommCounter, bucket):
    """A DDP communication hook: count the bucket, then do exactly what DDP's default all-reduce does."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    size = bucket.buffer().numel() * bucket.buffer().element_size()
    state.calls += 1
    state.bytes += size
    state.bucket_bytes[bucket.index()] = size
    return default_hooks.allreduce_hook(state.process_group, bucket)


def allreduce_bytes(steps: int, accum: int, grad_bytes: int, no_sync: bool) -> int:
    """Bytes each rank hands to all-reduce for ``steps`` optimizer steps of ``accum`` micro-batches each.

    Every synchronised backward all-reduces every gradient once; no_sync leaves all but the last
    micro-batch of a step unsynchronised.
    """
    return steps * grad_bytes * (1 if no_sync else accum)


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


def _dp_step(main: nn.Module, replicas: list, optimizer, x, y) -> None:
    """One DataParallel-style step: replicate, scatter, threaded forward, gather, loss, threaded backward, reduce."""
    k = len(replicas)
    with torch.no_grad():
        for replica in replicas[1:]:  # replicate: the main weights go out to every other replica
            for mine, theirs in zip(replica.parameters(), main.parameters(), strict=True):
                mine.copy_(theirs)
    xs = x.tensor_split(k)  # scatter the inputs
    outputs: list = [None] * k

    def forward(d):
        outputs[d] = replicas[d](xs[d])

    run_in_threads(k, forward)
    gathered = torch.cat([o.detach() for o in outputs]).requires_grad_()  # gather on the main replica
    loss = F.cross_entropy(gathered, y)
    (grad,) = torch.autograd.grad(loss, gathered)
    grads = grad.tensor_split(k)

    def backward(d):
        outputs[d].backward(grads[d])

    run_in_threads(k, backward)
    for replica in replicas[1:]:  # reduce every replica's gradients into the main one
        for mine, theirs in zip(main.parameters(), replica.parameters(), strict=True):
            mine.grad.add_(theirs.grad)
    optimizer.step()
    for replica in replicas:
        replica.zero_grad(set_to_none=True)


def plain_stepper(model: nn.Module, x, y, lr: float = 1e-3):
    """A function that does one ordinary training step of ``model`` (DDP-wrapped or not) on ``(x, y)``."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def step():
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def dataparallel_stepper(hidden: int, k: int, x, y, lr: float = 1e-3):
    """A function that does one DataParallel-style step with ``k`` threads on the global batch ``(x, y)``.

    Each step: copy the main weights into the k-1 replicas, split the batch, forward in k threads,
    gather the outputs and compute the loss on the main replica, backward in k threads, add every
    replica's gradients into the main one, update (the CPU stand-in of notebook 02's nine steps).
    """
    main = toy_model(hidden)
    replicas = [main] + [toy_model(hidden) for _ in range(k - 1)]
    optimizer = torch.optim.Adam(main.parameters(), lr=lr)
    return lambda: _dp_step(main, replicas, optimizer, x, y)


def machine_load() -> dict:
    """CPU cores and the 1-minute load average: how busy the machine was while we measured."""
    return {"cores": os.cpu_count(), "load average (1 min)": round(os.getloadavg()[0], 2)}


# --- plots of what was measured ---------------------------------------------------------------------------


def plot_sampler(with_epoch, without_epoch, samples: int):
    """Which rank gets each sample in each epoch, with and without ``set_epoch`` (from the sampler itself)."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    from helpers.plots import PALETTE

    world = len(with_epoch[0])
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(with_epoch) + 1.9), sharey=True)
    for ax, indices, title in (
        (axes[0], with_epoch, "with sampler.set_epoch(epoch)"),
        (axes[1], without_epoch, "without set_epoch"),
    ):
        owner = np.full((len(indices), samples), -1)
        order = np.zeros((len(indices), samples))
        for e, ranks in enumerate(indices):
            for r, shard in enumerate(ranks):
                owner[e, shard] = r
                order[e, shard] = np.arange(len(shard))
        ax.imshow(owner, aspect="auto", cmap=ListedColormap(PALETTE[:world]), interpolation="nearest")
        ax.set_title(title)
        ax.set_xlabel("sample index (colour: the rank that trains on it)")
        ax.set_yticks(range(len(indices)), [f"epoch {e}" for e in range(len(indices))])
        ax.grid(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=PALETTE[r]) for r in range(world)]
    axes[1].legend(
        handles,
        [f"rank {r}" for r in range(world)],
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        frameon=False,
    )
    fig.suptitle("DistributedSampler's shards, per epoch")
    fig.tight_layout()
    return fig


def plot_fault_recovery(reference_losses: list[float], events: list[dict], kill_at: int):
    """Loss per step: the uninterrupted run, the attempt that was killed, and the restarted attempt."""
    import matplotlib.pyplot as plt

    from helpers.plots import PALETTE

    fig, ax = plt.subplots(figsize=(9, 4))
    steps = range(1, len(reference_losses) + 1)
    ax.plot(steps, reference_losses, "-", lw=6, alpha=0.25, color="black", label="uninterrupted run")
    markers = ("o", "x", "s", "^")
    for attempt in sorted({e["attempt"] for e in events}):
        mine = [e for e in events if e["attempt"] == attempt and e["event"] == "step"]
        ax.plot(
            [e["step"] for e in mine],
            [e["loss"] for e in mine],
            markers[attempt % 4],
            ms=8 - 2 * attempt,
            color=PALETTE[attempt],
            label=f"attempt {attempt} (TORCHELASTIC_RESTART_COUNT={attempt})",
        )
    for e in events:
        if e["event"] == "saved":
            ax.axvline(e["step"], color=PALETTE[2], lw=1, ls=":", alpha=0.8)
    ax.axvline(kill_at, color=PALETTE[3], lw=2, label=f"SIGKILL while saving step {kill_at}")
    starts = [e["step"] for e in events if e["event"] == "start" and e["attempt"] > 0]
    for s in starts:
        ax.axvspan(s + 0.5, kill_at + 0.5, color=PALETTE[3], alpha=0.08, label="steps done twice")
    ax.plot([], [], ls=":", color=PALETTE[2], label="checkpoint saved")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (rank 0)")
    ax.set_title("A worker killed mid-checkpoint, restarted by torchrun, resumed from the last checkpoint")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


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
