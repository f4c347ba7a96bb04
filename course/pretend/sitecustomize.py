"""The pretend mode: torch in this process believes a named GPU is there (tests only).

``COURSE_PRETEND_GPU=rtx3090`` (or ``h100:2``, ``t4``) and this folder on ``PYTHONPATH``: once ``torch.cuda``
is imported, it reports that card (``is_available``, ``device_count``, capability, name, memory), honouring
``CUDA_VISIBLE_DEVICES`` as the CUDA runtime does (empty: no GPU; otherwise the listed devices up to the first
one that does not exist). Everything torch computes from those answers it computes itself: for instance
``torch.cuda.is_bf16_supported()`` from the capability. Anything that would really use CUDA (a tensor on
``cuda``, ``set_device``, ``synchronize``) fails at once with the stack that made it. The variable empty, or
unset, turns it off: processes meant for the GPU get it empty (``helpers.devices.launch_env``) and compute on
the CPU, as the gpu shape does.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import traceback
from types import SimpleNamespace

GiB = 1024**3
# name as torch reports it, compute capability, memory, streaming multiprocessors
CARDS = {
    "rtx3090": ("NVIDIA GeForce RTX 3090", (8, 6), 24 * GiB, 82),
    "h100": ("NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB, 132),
    "t4": ("Tesla T4", (7, 5), 15 * GiB, 40),
    "v100": ("Tesla V100-SXM2-32GB", (7, 0), 32 * GiB, 80),
}
ENV = "COURSE_PRETEND_GPU"


def parse(value: str) -> tuple[str, int]:
    """``'h100:2'`` -> ``('h100', 2)``; a wrong value stops the process with one sentence."""
    card, _, count = value.strip().partition(":")
    if card not in CARDS or not (count or "1").isdigit() or int(count or 1) < 1:
        raise SystemExit(
            f"{ENV}={value!r} is not a card to pretend; use one of {', '.join(CARDS)}, optionally with ':N' GPUs."
        )
    return card, int(count or 1)


def visible(count: int) -> int:
    """How many of ``count`` GPUs this process sees through CUDA_VISIBLE_DEVICES, as the CUDA runtime counts."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return count
    seen = 0
    for entry in listed.split(","):
        entry = entry.strip()
        if not entry.isdigit() or int(entry) >= count:
            break
        seen += 1
    return seen


class RealCudaCall(RuntimeError):
    """A process under the pretend mode asked for real CUDA work."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        stack = "".join(traceback.format_stack()[:-1])
        raise RealCudaCall(
            f"pretend mode ({ENV}={os.environ.get(ENV)}): {what} would use a real GPU, and there is none; a process "
            f"meant for the CPU must not see one (helpers/devices.py). It was called from:\n{stack}"
        )

    return refuse


def patch(cuda) -> None:
    """Make the module ``torch.cuda`` report the pretended card."""
    name, capability, memory, sms = CARDS[CARD]
    count = visible(COUNT)

    def check(device=None):
        index = 0 if device is None else getattr(device, "index", device)
        index = 0 if index is None else int(str(index).rpartition(":")[2] or 0)
        if not 0 <= index < count:
            raise RuntimeError(f"pretend mode: invalid device ordinal {index} ({count} GPU(s) visible)")
        return index

    props = SimpleNamespace(
        name=name, major=capability[0], minor=capability[1], total_memory=memory, multi_processor_count=sms,
        is_integrated=False, is_multi_gpu_board=False,
    )  # fmt: skip
    cuda.is_available = lambda: count > 0
    cuda.device_count = lambda: count
    cuda.current_device = lambda: check(0)
    cuda.get_device_capability = lambda device=None: (check(device), capability)[1]
    cuda.get_device_name = lambda device=None: (check(device), name)[1]
    cuda.get_device_properties = lambda device=None: (check(device), props)[1]
    cuda.mem_get_info = lambda device=None: (check(device), (memory, memory))[1]
    cuda.is_initialized = lambda: False
    cuda.get_arch_list = lambda: ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # PyPI's torch 2.13 (CUDA 13)
    # a real card makes a bfloat16 tensor even where it only emulates bf16 (T4, V100), so that
    # is_bf16_supported() says True there unless asked for native support (including_emulation=False)
    cuda._check_bf16_tensor_supported = lambda device: True
    # the memory statistics of a GPU on which this process has allocated nothing, as torch reports them before
    # CUDA is initialised: zeros, and nothing to reset or empty
    for stat in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(cuda, stat, lambda device=None: (check(device), 0)[1])
    cuda.reset_peak_memory_stats = lambda device=None: check(device) and None
    cuda.empty_cache = lambda: None
    for real in ("_lazy_init", "init", "set_device", "synchronize"):
        setattr(cuda, real, _refuse(f"torch.cuda.{real}"))
    for kind in ("Stream", "Event"):  # still classes, for the type annotations that name them
        setattr(cuda, kind, type(kind, (), {"__new__": _refuse(f"torch.cuda.{kind}()")}))


class _Finder(importlib.abc.MetaPathFinder):
    """Patches ``torch.cuda`` right after it is executed, before anything imports names from it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cuda":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get(ENV):
    CARD, COUNT = parse(os.environ[ENV])
    sys.meta_path.insert(0, _Finder())
