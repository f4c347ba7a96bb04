"""What is installed and what the machine offers: versions against the pins, devices, backends."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform

from helpers import paths
from helpers.exercises import checker

KEY_PACKAGES = ("torch", "ms-swift", "transformers", "peft", "trl", "accelerate", "deepspeed", "modelscope")


def pins() -> dict[str, str]:
    """Package -> pinned version, from requirements.txt and requirements-nodeps.txt."""
    pinned = {}
    for name in ("requirements.txt", "requirements-nodeps.txt"):
        for line in (paths.ROOT / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if "==" in line:
                package, version = line.split("==", 1)
                pinned[package.strip().lower()] = version.strip()
    return pinned


def installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions(packages=KEY_PACKAGES) -> list[dict]:
    """One row per package: installed version, pinned version, and whether they agree."""
    pinned = pins()
    rows = [{"package": "python", "installed": platform.python_version(), "pinned": "3.10+", "matches": True}]
    for package in packages:
        have, want = installed(package), pinned.get(package)
        # a local build tag such as torch's "+cpu" still matches its pin
        matches = want is None or (have is not None and have.split("+")[0] == want)
        rows.append(
            {"package": package, "installed": have or "missing", "pinned": want or "-", "matches": matches}
        )
    return rows


def accelerators() -> dict:
    """CUDA devices and the torch.distributed backends this build of torch offers."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    return {
        "cpu cores": os.cpu_count(),
        "CUDA available": cuda,
        "CUDA devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else [],
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available() and cuda,
        "mpi": dist.is_mpi_available(),
    }


@checker("05.1")
def _gpu_profile_on_four_gpus(answer):
    """Which backend and how many processes does the gpu profile use on a 4-GPU machine?"""
    backend, nproc = answer
    if str(backend).lower() != "nccl":
        return False, "GPUs talk through NCCL; gloo is the CPU backend."
    if nproc != 4:
        return False, "The gpu profile starts one process per visible GPU."
    return True, "One process per GPU, talking NCCL: the DDP layout SWIFT uses with NPROC_PER_NODE=4."


@checker("05.2")
def _all_reduce_sum(expected_sum):
    """A function n -> the value every rank holds after all-reducing (rank + 1) over n ranks."""
    for n in range(1, 65):
        want = n * (n + 1) / 2
        got = expected_sum(n)
        if abs(got - want) > 1e-9:
            return False, f"for {n} ranks every rank holds {want:g}, your function gives {got}."
    return True, "All-reduce leaves the same sum, 1 + 2 + ... + n = n(n+1)/2, on every rank."
