"""What is installed and what the machine offers: versions against the pins, devices, backends."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import re
import subprocess
import sys

from helpers import paths
from helpers.errors import CourseError

KEY_PACKAGES = ("torch", "ms-swift", "transformers", "peft", "trl", "accelerate", "deepspeed", "modelscope")
# Made by `make lock` (scripts/lock.py) from requirements.txt and requirements-nodeps.txt: every package,
# transitive ones included, pinned with the hashes of its files. The second is the same lock without torch
# and what only torch needs, for images that bring their own CUDA build of torch.
LOCK = "requirements-lock.txt"
LOCK_NO_TORCH = "requirements-lock-no-torch.txt"
# The torch releases the course supports where torch is not the locked one (a GPU image's own CUDA build):
# 2.6 is the first with FSDP2's public torch.distributed.fsdp.fully_shard (notebook 11; transformers 5
# itself asks for 2.5+), and 2.13 is the release the course is tested with (the lock's).
TORCH_SUPPORTED = ("2.6", "2.13")


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


def read_lock(name: str = LOCK) -> dict[str, dict]:
    """Package -> {"version", "hashes", "via", "block"} for each package of a lock file.

    ``via`` lists the packages that need it (``-r requirements.txt`` for a top-level pin); ``block`` is the
    package's lines as written, so a derived lock can copy them unchanged.
    """
    packages, current = {}, None
    for line in (paths.ROOT / name).read_text().splitlines():
        start = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if start:
            current = {"version": start.group(2), "hashes": [], "via": [], "block": [line]}
            packages[re.sub(r"[-_.]+", "-", start.group(1)).lower()] = current
        elif current is not None and line.startswith(" "):
            current["block"].append(line)
            current["hashes"] += re.findall(r"--hash=(sha256:[0-9a-f]{64})", line)
            via = re.match(r"\s+# (?:via )?\s*(\S.*)$", line)
            if via and via.group(1) != "via":
                current["via"].append(via.group(1).strip())
        else:
            current = None
    return packages


def without_torch(lock: dict[str, dict]) -> dict[str, dict]:
    """The lock less torch and every package that only torch (or what only torch needs) requires."""
    dropped = {"torch"}
    changed = True
    while changed:
        changed = False
        for name, entry in lock.items():
            users = {re.sub(r"[-_.]+", "-", v).lower() for v in entry["via"]}
            if name not in dropped and users and users <= dropped:
                dropped.add(name)
                changed = True
    return {name: entry for name, entry in lock.items() if name not in dropped}


def version_tuple(version: str) -> tuple[int, ...]:
    """The release numbers of a version, without a local build tag or a pre-release: 2.13.0+cpu -> (2, 13, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3])


def check_torch(version: str | None = None) -> str:
    """The installed torch, checked against the supported range: a sentence that says what to do if not.

    Older than the range (or missing) stops with a CourseError; newer than the tested release is allowed
    and the returned sentence says so. Inside the range it returns "".
    """
    version = version or installed("torch")
    low, high = TORCH_SUPPORTED
    supported = f"the course supports torch {low} to {high}.x (it is tested with {high})"
    if version is None:
        raise CourseError(
            f"torch is not installed; {supported}: run `make setup`, or install one for your CUDA."
        )
    release = version_tuple(version)[:2]
    if release < version_tuple(low)[:2]:
        raise CourseError(
            f"torch {version} is installed and {supported}: install a torch in that range built for this "
            f"machine's CUDA (then `pip install --no-deps --require-hashes -r {LOCK_NO_TORCH}`), or use `make setup`."
        )
    if release > version_tuple(high)[:2]:
        return f"Note: torch {version} is newer than the range the course supports ({low} to {high}.x); if a step fails, try a torch in that range."
    return ""


def uv_sources() -> list[str]:
    """Where pip is told to look for packages (its find-links and indexes), as arguments for uv.

    uv does not read pip's configuration; scripts/setup.sh and `make lock` pass these on, so both look
    where pip would (on the course machines: /opt/wheels for torch's CPU build, and local mirrors).
    """
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    args: list[str] = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        if option not in ("find-links", "index-url", "extra-index-url"):
            continue
        for place in value.strip().strip("'\"").split():
            pair = [f"--{option}", place]
            if all(args[i : i + 2] != pair for i in range(0, len(args), 2)):
                args += pair
    return args


def installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions(packages=KEY_PACKAGES) -> list[dict]:
    """One row per package: installed version, pinned version, and whether they agree."""
    pinned = pins()
    python = platform.python_version()
    rows = [
        {"package": "python", "installed": python, "pinned": "3.11", "matches": python.startswith("3.11.")}
    ]
    for package in packages:
        have, want = installed(package), pinned.get(package)
        # a local build tag such as torch's "+cpu" still matches its pin
        matches = want is None or (have is not None and have.split("+")[0] == want)
        if package == "torch" and have is not None and not matches:  # a GPU image's own CUDA build
            low, high = TORCH_SUPPORTED
            matches = (
                version_tuple(low)[:2] <= version_tuple(have)[:2]
            )  # newer: allowed, with check_torch's note
            want = f"{want} (or a CUDA build from {low} to {high})"
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
        "cpu cores": len(os.sched_getaffinity(0)),
        "CUDA available": cuda,
        "CUDA devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else [],
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available() and cuda,
        "mpi": dist.is_mpi_available(),
    }


# The oldest Linux driver that runs each CUDA major release (NVIDIA's CUDA Compatibility guide, "Minor Version
# Compatibility": CUDA 13.x needs >= 580, 12.x >= 525, 11.x >= 450). PyPI's torch 2.13.0 for Linux is a CUDA
# 13.0 build; the PyTorch index's cu126 build of the same release runs on a 525 driver.
DRIVER_FOR_CUDA = {11: 450, 12: 525, 13: 580}
PROC_DRIVER = "/proc/driver/nvidia/version"


def nvidia_driver(proc: str = PROC_DRIVER) -> str | None:
    """The NVIDIA driver's version ("570.153.02"), from /proc/driver/nvidia/version or else nvidia-smi; None
    where neither names one (no driver, or a container that does not see it)."""
    try:
        with open(proc) as file:
            text = file.read()
    except OSError:
        text = ""
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  ..."
    # or "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  ..."
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    if found:
        return found.group(1)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = smi.stdout.strip().splitlines()[:1]
    version = first[0].strip() if smi.returncode == 0 and first else ""
    return version if re.fullmatch(r"\d+(\.\d+)+", version) else None


def why_cuda_unusable(
    torch_version: str,
    cuda: str | None,
    available: bool,
    driver: str | None = None,
    warning: str = "",
    capability: tuple[int, int] | None = None,
    arch_list: tuple[str, ...] | list[str] = (),
) -> str:
    """Why a CUDA build of torch cannot use this machine's GPU, in one sentence; "" when it can, or when it is
    a CPU build (``cuda`` None: no driver would help).

    ``cuda`` is ``torch.version.cuda``, ``available`` ``torch.cuda.is_available()``, ``driver`` the NVIDIA
    driver's version (:func:`nvidia_driver`), ``warning`` what torch warned while it looked for a GPU: with a
    driver too old for its CUDA, ``CUDA initialization: The NVIDIA driver on your system is too old (found
    version 12080). ...`` (c10/cuda/CUDAFunctions.cpp; the number is cudaDriverGetVersion's, the newest CUDA
    that driver runs: 12080 is 12.8). With a GPU found, ``capability`` (``get_device_capability()``) and
    ``arch_list`` (``get_arch_list()``) tell whether the build has kernels for it at all.
    """
    if cuda is None:
        return ""
    major = version_tuple(cuda)[0]
    need = DRIVER_FOR_CUDA.get(major)
    built = f"torch {torch_version} is built for CUDA {cuda}"
    cu126 = "install its CUDA 12.6 build (docs/gpu.md, Set-up)"
    if available:
        if capability is None or not arch_list:
            return ""
        device = capability[0] * 10 + capability[1]
        codes = [(m[1], int(m[2])) for a in arch_list if (m := re.fullmatch(r"(sm|compute)_(\d+)[a-z]?", a))]
        # torch.cuda's own rule (_code_compatible_with_device): sm_XY code runs on X.Y to X.9; PTX
        # (compute_XY) is compiled for any newer GPU
        if any(
            (kind == "sm" and device // 10 == code // 10 and device >= code)
            or (kind == "compute" and device >= code)
            for kind, code in codes
        ):
            return ""
        sms = sorted(code for kind, code in codes if kind == "sm") or [0]
        fix = (
            f"CUDA 13 builds leave out Maxwell, Pascal and Volta (sm_50 to sm_70); {cu126}"
            if major >= 13 and device < 75
            else "install a torch built for it (pytorch.org/get-started)"
        )
        return (
            f"{built}, which has no kernels for this GPU (sm_{device}; it has sm_{sms[0]} to sm_{sms[-1]}): "
            f"{fix}."
        )
    older = cu126 if major >= 13 else "install a torch built for this driver's CUDA (docs/gpu.md, Set-up)"
    needs = (
        f"which needs an NVIDIA driver >= {need} on Linux" if need else "which needs a newer NVIDIA driver"
    )
    if driver and need and version_tuple(driver)[0] < need:
        return f"{built}, {needs}, and this machine's driver is {driver}: update the driver, or {older}."
    supports = re.search(r"too old \(found version (\d+)\)", warning)
    if supports:
        found = int(supports.group(1))
        which = f"this machine's driver ({driver})" if driver else "the driver torch found"
        return (
            f"{built}, {needs}, and {which} runs CUDA {found // 1000}.{found % 1000 // 10} at most (torch: "
            f"found version {found}): update the driver, or {older}."
        )
    if driver is None:
        return (
            f"{built} and finds no NVIDIA driver (none in {PROC_DRIVER} or nvidia-smi): install one"
            f"{f' >= {need}' if need else ''}, or start the container with the GPU (docker run --gpus all)."
        )
    said = warning.replace("CUDA initialization: ", "").split(". ")[0].strip().rstrip(".")
    return (
        f"{built} and this machine's driver {driver} is new enough, yet it finds no GPU"
        f"{f' ({said})' if said else ''}: check nvidia-smi and CUDA_VISIBLE_DEVICES."
    )


def cuda_problem() -> str:
    """:func:`why_cuda_unusable` for this process's torch and this machine: "" when torch uses the GPU (or
    is a CPU build). Call it before anything else asks torch for a GPU: torch warns only the first time."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    warning = " ".join(str(w.message) for w in caught if "CUDA" in str(w.message))
    capability = torch.cuda.get_device_capability(0) if available else None
    arch_list = torch.cuda.get_arch_list() if available else []
    driver = nvidia_driver() if torch.version.cuda else None
    return why_cuda_unusable(
        torch.__version__, torch.version.cuda, available, driver, warning, capability, arch_list
    )
