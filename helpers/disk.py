"""Disk space for the gpu route: the ModelScope cache, free space checked before a download or a large write."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from helpers.errors import CourseError

# Disk the gpu profile's route takes, in GB: the seed's model, 12's base model, 10's merged copy (each about
# 15.2 GB in bf16), plus adapters, checkpoints and hub data (a few GB).
HUB_SIZES_GB = {"Qwen/Qwen2.5-7B-Instruct": 15.3, "Qwen/Qwen2.5-7B": 15.3}

GPU_ROUTE_GB = 50


def modelscope_cache() -> Path:
    """Where the modelscope client keeps downloads: ``$MODELSCOPE_CACHE``, else ~/.cache/modelscope/hub."""
    return Path(
        os.environ.get("MODELSCOPE_CACHE") or Path.home() / ".cache" / "modelscope" / "hub"
    ).expanduser()


def free_gb(folder) -> float:
    """Free space, in GB, on the disk that holds ``folder`` (or its nearest existing parent)."""
    folder = Path(folder).resolve()
    while not folder.exists():
        folder = folder.parent
    return shutil.disk_usage(folder).free / 1e9


def check_space(folder, need_gb: float, what: str) -> None:
    """Stop with one sentence when the disk under ``folder`` has less than ``need_gb`` GB free for ``what``."""
    free = free_gb(folder)
    if free < need_gb:
        raise CourseError(
            f"{what} needs about {need_gb:.0f} GB of disk and {folder} has {free:.1f} GB free; free some space, "
            "or point MODELSCOPE_CACHE (downloads) and COURSE_OUTPUTS_DIR (trained models) at a larger volume."
        )


def _cached(model_id: str) -> Path | None:
    """The model's folder in the modelscope cache when a complete download is there (its config.json)."""
    masked = model_id.replace(".", "___")  # the client stores Qwen2.5 as Qwen2___5
    for name in (masked, model_id):
        for folder in (modelscope_cache() / "models" / name, modelscope_cache() / name):
            if (folder / "config.json").is_file():
                return folder
    return None


def gpu_route_space(outputs) -> str:
    """Before the gpu profile's first download: what the route through 08-12 downloads and writes, checked
    against the free space (one sentence when short). The downloads go to the modelscope cache, what 09 and
    10 write to ``outputs``; a model already in the cache counts as downloaded."""
    from helpers.profiles import GPU_DEFAULT_MODEL

    to_fetch = {m: gb for m, gb in HUB_SIZES_GB.items() if _cached(m) is None}
    written = HUB_SIZES_GB[GPU_DEFAULT_MODEL] + 2  # 10's merged copy, and 09's adapters and checkpoints
    if to_fetch:
        check_space(modelscope_cache(), sum(to_fetch.values()) + 1, f"downloading {' and '.join(to_fetch)}")
    check_space(outputs, written, "what notebooks 09 and 10 write (adapters, checkpoints, a merged 7B model)")
    fetch = sum(to_fetch.values())
    hours = ", ".join(f"{fetch * 1e3 / rate / 3600:.1f} h at {rate} MB/s" for rate in (10, 50))
    return (
        f"The gpu route needs about {GPU_ROUTE_GB} GB of disk: {' and '.join(HUB_SIZES_GB)} "
        f"({' + '.join(f'{gb:.1f}' for gb in HUB_SIZES_GB.values())} GB in {modelscope_cache()}), then a merged "
        f"copy and adapters (about {written:.0f} GB in {outputs}). "
        + (
            f"Still to download: {fetch:.1f} GB ({hours})."
            if to_fetch
            else "Both models are in the cache already."
        )
    )
