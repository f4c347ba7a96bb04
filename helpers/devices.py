"""Which devices a process sees: the one place that decides it for the kernel and for every launch.

A launch is meant for the GPU only when it is given GPUs (:func:`gpu_env`: ``CUDA_VISIBLE_DEVICES`` naming
the first of this process's own). Every other launch is meant for the CPU, and where GPUs exist it must not
see them: :func:`launch_env` gives it ``CUDA_VISIBLE_DEVICES=`` (torch then reports no GPU) and
``DS_ACCELERATOR=cpu`` (DeepSpeed otherwise picks CUDA whenever ``torch.cuda.is_available()``,
deepspeed/accelerator/real_accelerator.py, and calls ``torch.cuda.set_device(LOCAL_RANK)``). The kernel's own
choices (how many GPUs, which dtype) are made here too.
"""

from __future__ import annotations

import os

from helpers.errors import CourseError

# The pretend mode (tests only, course/pretend/): with this variable set, torch in a process believes the
# named card is there (``h100:2``); processes meant for the GPU are given it empty, since they compute on
# the CPU in the gpu shape.
PRETEND_ENV = "COURSE_PRETEND_GPU"
HIDE_GPUS = {"CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}


def count_gpus() -> int:
    """CUDA devices visible to this process (0 without torch's CUDA build)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def bf16_supported() -> bool:
    """True where bfloat16 is computed natively: a GPU of the Ampere generation or later (A100, RTX 30xx,
    H100...). T4 and V100 only emulate it, slowly, and torch's ``is_bf16_supported()`` counts emulation unless
    told not to (torch/cuda/__init__.py). The CPU has it (the gpu shape on the CPU)."""
    import torch

    return torch.cuda.is_bf16_supported(including_emulation=False) if torch.cuda.is_available() else True


def gpu_dtype() -> tuple[str, str]:
    """The gpu profile's dtype, and why: bfloat16 where the GPU has it, else float16."""
    if bf16_supported():
        return "bfloat16", "this device computes in bfloat16, the dtype Qwen2.5's weights are saved in"
    return "float16", (
        "this GPU has no bfloat16 (T4 and V100 do not; Ampere and later do), so weights, training, merging "
        "and inference use float16"
    )


def visible_gpus(count: int, first: int = 0, inherit: bool = True) -> list[str]:
    """The CUDA devices a launch of ``count`` GPUs should see, from the ``first`` of this machine's own.

    A process started with ``CUDA_VISIBLE_DEVICES`` set (a shared server giving this learner GPUs 4 and 5)
    may use only those: the launch gets entries ``first .. first + count - 1`` of that list, never the
    machine's GPUs 0..n-1. Without the variable they are 0..count-1 (offset by ``first``). ``inherit=False``
    ignores the variable: for commands printed for another machine, with ``count`` GPUs of its own.
    """
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() if inherit else ""
    if not inherited:
        return [str(i) for i in range(first, first + count)]
    own = [d.strip() for d in inherited.split(",") if d.strip()]
    if first + count > len(own):
        raise CourseError(
            f"a launch on {count} GPU{'s' if count > 1 else ''} (from the {first + 1}. on) needs more than the "
            f"{len(own)} this process may use (CUDA_VISIBLE_DEVICES={inherited}); ask for fewer (NPROC), or start "
            "JupyterLab with more GPUs visible."
        )
    return own[first : first + count]


def gpu_env(gpus: int, torchrun: bool = False, inherit: bool = True) -> dict:
    """The environment of a ``swift`` command with one process per GPU on ``gpus`` GPUs: exactly those
    devices visible (:func:`visible_gpus`: the first of this process's own), and ``NPROC_PER_NODE`` where
    SWIFT must start torchrun (several processes, or ``torchrun``: DeepSpeed needs it even for one, see
    :func:`helpers.swiftcli.prepare_swift`). ``inherit=False``: the command for another machine."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(visible_gpus(gpus, inherit=inherit))}
    return {**env, "NPROC_PER_NODE": str(gpus)} if gpus > 1 or torchrun else env


def cpu_env() -> dict:
    """What a process meant for the CPU needs in its environment: nothing on a machine without a GPU; where
    this process sees GPUs, ``CUDA_VISIBLE_DEVICES=`` and ``DS_ACCELERATOR=cpu`` (:data:`HIDE_GPUS`)."""
    return dict(HIDE_GPUS) if count_gpus() else {}


def meant_for_gpu(env: dict) -> bool:
    """A launch is meant for the GPU when it was given GPUs: ``CUDA_VISIBLE_DEVICES`` naming at least one."""
    return bool(str(env.get("CUDA_VISIBLE_DEVICES", "")).strip())


def launch_env(env: dict) -> dict:
    """The environment a launch runs with, from the one it was given: a launch given GPUs keeps them; every
    other launch gets :func:`cpu_env`, so that a process meant for the CPU never sees a GPU. In the pretend
    mode a launch given GPUs is told to pretend nothing: it computes on the CPU, as the gpu shape does."""
    env = dict(env)
    if meant_for_gpu(env):
        if os.environ.get(PRETEND_ENV):
            env[PRETEND_ENV] = ""
        return env
    return {**cpu_env(), **env}
