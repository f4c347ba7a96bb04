"""Disk space for the gpu route: the ModelScope cache, free space checked before a download or a large write."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from contextlib import contextmanager
from pathlib import Path

from helpers.errors import CourseError

# Disk the gpu profile's route takes, in GB: the original tutorial's model, 12's base model, 10's merged copy (each about
# 15.2 GB in bf16), plus adapters, checkpoints and hub data (a few GB).
HUB_SIZES_GB = {"Qwen/Qwen2.5-7B-Instruct": 15.3, "Qwen/Qwen2.5-7B": 15.3}

GPU_ROUTE_GB = 50


def modelscope_cache() -> Path:
    """Where the modelscope client keeps downloads: ``$MODELSCOPE_CACHE``, else ~/.cache/modelscope (since
    modelscope 1.38, whose downloads modelscope_hub makes). Read from modelscope_hub's ``HubConfig``, the
    default a fresh config takes, at each call (so a changed ``MODELSCOPE_CACHE`` counts)."""
    from modelscope_hub import HubConfig

    field = next(f for f in dataclasses.fields(HubConfig) if f.name == "cache_dir")
    return Path(field.default_factory())


def _existing(folder) -> Path:
    """``folder``, or its nearest existing parent."""
    folder = Path(folder).resolve()
    while not folder.exists():
        folder = folder.parent
    return folder


def free_gb(folder) -> float:
    """Free space, in GB, on the disk that holds ``folder`` (or its nearest existing parent)."""
    return shutil.disk_usage(_existing(folder)).free / 1e9


def _device(folder) -> int:
    """The file system that holds ``folder`` (or its nearest existing parent), as its device number."""
    return _existing(folder).stat().st_dev


def check_space(folder, need_gb: float, what: str) -> None:
    """Stop with one sentence when the disk under ``folder`` has less than ``need_gb`` GB free for ``what``."""
    free = free_gb(folder)
    if free < need_gb:
        raise CourseError(
            f"{what} needs about {need_gb:.0f} GB of disk and {folder} has {free:.1f} GB free; free some space, "
            "or point MODELSCOPE_CACHE (downloads) and COURSE_OUTPUTS_DIR (trained models) at a larger volume."
        )


@contextmanager
def _quiet(*names: str):
    """The loggers ``names`` say nothing below ERROR inside the block (a look-up is not news)."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def _cached(model_id: str) -> Path | None:
    """The model's folder when a complete download is in the modelscope cache (its config.json), else None.

    Asked of modelscope itself, without the network: ``snapshot_download(model_id, revision="master",
    local_files_only=True)`` finds the folder the course's download (no revision, so "master") would reuse,
    in the layout modelscope 1.38+ writes (``<cache>/models/<org>--<name>/snapshots/master``) or in the older
    ones it still reuses (``<cache>/models/<org>/<name with . as ___>``, ``<cache>/hub/models/...`` and more).
    """
    from modelscope.hub.snapshot_download import snapshot_download
    from modelscope_hub.errors import HubError

    try:
        with _quiet("modelscope", "modelscope_hub", "modelscope_hub.download"):
            folder = Path(
                snapshot_download(
                    model_id, revision="master", cache_dir=str(modelscope_cache()), local_files_only=True
                )
            )
    except HubError:  # CacheNotFound: not there (or an id modelscope cannot look up)
        return None
    return folder if (folder / "config.json").is_file() else None


def gpu_route_space(outputs) -> str:
    """Before the gpu profile's first download: what the route through 08-12 downloads and writes, checked
    against the free space (one sentence when short). The downloads go to the modelscope cache, what 09 and
    10 write to ``outputs``; on one disk the two are checked together, as their sum. A model already in the
    cache counts as downloaded."""
    from helpers.profiles import GPU_DEFAULT_MODEL

    cache = modelscope_cache()
    to_fetch = {m: gb for m, gb in HUB_SIZES_GB.items() if _cached(m) is None}
    written = HUB_SIZES_GB[GPU_DEFAULT_MODEL] + 2  # 10's merged copy, and 09's adapters and checkpoints
    fetch = sum(to_fetch.values())
    downloading = f"downloading {' and '.join(to_fetch)}"
    writing = "what notebooks 09 and 10 write (adapters, checkpoints, a merged 7B model)"
    if to_fetch and _device(cache) == _device(outputs):  # one disk: the downloads and the outputs together
        check_space(
            cache, fetch + 1 + written, f"{downloading} ({fetch:.1f} GB) plus {writing} on the same disk"
        )
    else:
        if to_fetch:
            check_space(cache, fetch + 1, downloading)
        check_space(outputs, written, writing)
    hours = ", ".join(f"{fetch * 1e3 / rate / 3600:.1f} h at {rate} MB/s" for rate in (10, 50))
    return (
        f"The gpu route needs about {GPU_ROUTE_GB} GB of disk: {' and '.join(HUB_SIZES_GB)} "
        f"({' + '.join(f'{gb:.1f}' for gb in HUB_SIZES_GB.values())} GB in {cache}), then a merged "
        f"copy and adapters (about {written:.0f} GB in {outputs}). "
        + (
            f"Still to download: {fetch:.1f} GB ({hours})."
            if to_fetch
            else "Both models are in the cache already."
        )
    )
