"""Inside a launched worker: join the process group torchrun prepared, gather small values, save a result, leave together."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from helpers import paths
from helpers.launching import RESULTS_ENV

TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass(frozen=True)
class Rank:
    """Who this process is: its rank, the world size, and the device it computes on."""

    rank: int
    world: int
    device: object  # torch.device


def init_rank(backend: str = "gloo") -> Rank:
    """Join the process group torchrun prepared (:func:`join_group`) and pick this rank's device.

    On CPU each rank keeps one compute thread: two ranks already fill two cores, and more threads
    would make them fight for the same cores instead of computing.
    """
    import torch.distributed as dist

    join_group(backend)
    device = device_for(backend)
    if device.type == "cpu":
        torch.set_num_threads(1)
    return Rank(dist.get_rank(), dist.get_world_size(), device)


def sync(device) -> None:
    """Wait for queued GPU work before reading a clock (nothing to wait for on CPU)."""
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(device)


def gather_objects(value) -> list:
    """Every rank's ``value`` (a small picklable object), gathered on every rank."""
    import torch.distributed as dist

    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def save_result(data) -> Path | None:
    """In a launched script: save this rank's JSON-serialisable result for the notebook to read."""
    folder = os.environ.get(RESULTS_ENV)
    if not folder:
        return None
    rank = int(os.environ.get("RANK", "0"))
    return paths.write_atomic(Path(folder) / f"rank{rank}.json", json.dumps(data))


def exit_together() -> None:
    """In a launched script, the last line: every rank leaves together, then the process ends.

    All ranks meet at a barrier and close the process group; then the process exits at once,
    skipping the interpreter's teardown, where a gloo background thread can still abort it
    ("terminate called without an active exception") after all the work is done and saved.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def device_for(backend: str) -> torch.device:
    """In a launched script: this rank's device (cuda:LOCAL_RANK with nccl, else the CPU)."""
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def join_group(backend: str) -> None:
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
