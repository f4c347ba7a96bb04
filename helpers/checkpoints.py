"""Checkpoints that survive a killed worker: written atomically, resumed bit for bit, the story of a fault."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

TMP_MARK = ".tmp-"  # temporary checkpoint files are named .<name>.tmp-<pid>


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
