"""Simple model parallelism (简易模型并行) with device_map: placement planned and timed, SWIFT's DDP + device_map.

Simple model parallelism (简易模型并行) with ``device_map``: whole layers on different devices, planned by
accelerate on the meta device (nothing allocated), timed stage by stage; and DDP + device_map, where SWIFT gives
each DDP rank a group of GPUs by its own rules."""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from unittest import mock

import torch
from torch import nn

from helpers import launching
from helpers.errors import CourseError

# --- 1. device_map: accelerate's planner on the meta device -----------------------------------------


def empty_model(model_path: str) -> nn.Module:
    """The causal LM in ``model_path`` built under ``accelerate.init_empty_weights``: shapes only, no memory."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # a tied output layer shares the embedding's storage: count it once
    return model


def module_bytes(model: nn.Module) -> defaultdict:
    """Bytes of every submodule (accelerate's own count, tied weights once); ``""`` is the whole model.

    A module whose only weight is tied to an earlier one (a tied ``lm_head``) counts 0 bytes.
    """
    from accelerate.utils import compute_module_sizes

    return defaultdict(int, compute_module_sizes(model))


def plan_device_map(model: nn.Module, caps: dict, *, balanced: bool = True) -> dict:
    """The placement accelerate chooses for ``model`` on devices with memory ``caps`` (device -> bytes).

    ``balanced=True`` first spreads the caps evenly with ``get_balanced_memory``, which is what
    ``device_map="auto"`` does in transformers (and SWIFT through it); ``False`` fills device 0 first
    ("sequential"). Only sizes are used: the model may live on the meta device.
    """
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = getattr(model, "_no_split_modules", None) or []
    quiet = logging.getLogger("accelerate.utils.modeling")  # "device 0 is not available" on a CPU machine
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        memory = dict(caps)
        if balanced:
            memory = get_balanced_memory(model, max_memory=memory, no_split_module_classes=no_split)
        return dict(infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split))
    finally:
        quiet.setLevel(level)


def placement_rows(model: nn.Module, device_map: dict, caps: dict | None = None) -> list[dict]:
    """One row per device: which modules it holds (first .. last), how many, and their MiB."""
    sizes = module_bytes(model)
    rows: dict = {}
    for name, device in device_map.items():
        row = rows.setdefault(device, {"device": device, "modules": [], "bytes": 0})
        row["modules"].append(name)
        row["bytes"] += sizes[name]
    out = []
    for device, row in rows.items():
        names = row["modules"]
        out.append(
            {
                "device": device,
                "modules": f"{names[0]} .. {names[-1]}" if len(names) > 1 else names[0],
                "count": len(names),
                "MiB": round(row["bytes"] / 2**20, 1),
                "cap MiB": round(caps[device] / 2**20, 1) if caps and device in caps else "-",
            }
        )
    return out


def plan_fits(model: nn.Module, device_map: dict, caps: dict) -> bool:
    """True when every module sits on one of the capped devices and no device exceeds its cap."""
    sizes = module_bytes(model)
    used: dict = defaultdict(int)
    for name, device in device_map.items():
        if device not in caps:
            return False
        used[device] += sizes[name]
    return all(used[d] <= caps[d] for d in used)


def stage_spans(
    model: nn.Module, device_map: dict, inputs: dict, *, batches: int = 2, sync=None
) -> list[dict]:
    """Run ``batches`` forward passes and time every module of ``device_map``; one span per module call.

    Each span's lane is the device the module is placed on. On one CPU this is a *simulation*: the
    modules really run one after another here, and the timeline only says which device would be
    busy. On GPUs with the model really placed, ``sync=torch.cuda.synchronize`` makes it a measurement.
    """
    modules = dict(model.named_modules())
    placed = {}
    for name, device in device_map.items():  # a ModuleList is never called itself: time its children
        if isinstance(modules[name], nn.ModuleList):
            placed.update({f"{name}.{child}": device for child, _ in modules[name].named_children()})
        else:
            placed[name] = device
    spans: list[dict] = []
    starts: dict = {}
    handles = []
    batch = [0]

    def before(name):
        def hook(_module, _args):
            if sync:
                sync()
            starts[name] = time.perf_counter()

        return hook

    def after(name):
        def hook(_module, _args, _out):
            if sync:
                sync()
            spans.append(
                {
                    "lane": f"device {placed[name]}",
                    "start": starts.pop(name),
                    "end": time.perf_counter(),
                    "label": f"batch {batch[0] + 1}",
                    "module": name,
                }
            )

        return hook

    with torch.no_grad():
        model(**inputs)  # warm-up, not timed: the first call pays one-off costs
    for name in placed:
        handles.append(modules[name].register_forward_pre_hook(before(name)))
        handles.append(modules[name].register_forward_hook(after(name)))
    try:
        with torch.no_grad():
            for b in range(batches):
                batch[0] = b
                model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return spans


def back_to_back(spans: list[dict]) -> list[dict]:
    """The same spans, in the order they ran, each starting when the previous one ended.

    This is the simulation's layout: only the measured compute time of each module counts, the
    Python in between is left out, and each module sits on the lane of the device it was planned for.
    """
    out, clock = [], 0.0
    for s in sorted(spans, key=lambda s: s["start"]):
        length = s["end"] - s["start"]
        out.append({**s, "start": clock, "end": clock + length})
        clock += length
    return out


def busy_fractions(spans: list[dict]) -> dict[str, float]:
    """For every lane: the share of the whole timeline during which it was busy."""
    total = max(s["end"] for s in spans) - min(s["start"] for s in spans)
    busy: dict = defaultdict(float)
    for s in spans:
        busy[s["lane"]] += s["end"] - s["start"]
    return {lane: t / total for lane, t in busy.items()}


def overlapping(spans: list[dict]) -> int:
    """How many pairs of spans on *different* lanes overlap in time (0: only one device ever works)."""
    ordered = sorted(spans, key=lambda s: s["start"])
    count = 0
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if b["start"] >= a["end"]:
                break
            if b["lane"] != a["lane"]:
                count += 1
    return count


def sample_inputs(model_path: str, batch: int, tokens: int, device="cpu") -> dict:
    """A batch of ``batch`` identical rows of ``tokens`` token ids from the model's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    text = "Data parallelism copies the model; model parallelism splits it. " * tokens
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :tokens].repeat(batch, 1)
    return {"input_ids": ids.to(device)}


def sync_devices(device_map: dict):
    """A function that waits for every GPU ``device_map`` places something on. ``torch.cuda.synchronize()``
    alone waits for the current device only, so work queued on the others (Qwen2.5-7B's untied ``lm_head`` on
    GPU 1, say) would be left out of a timeline that says it is measured."""
    used = sorted({d for d in device_map.values() if isinstance(d, int)})

    def sync():
        for device in used:
            torch.cuda.synchronize(device)

    return sync


def place_on_gpus(model_path: str, devices: int, dtype: str = "bfloat16"):
    """Load the model in ``dtype`` really split over this kernel's GPUs 0..devices-1 with ``device_map="auto"``."""
    from transformers import AutoModelForCausalLM

    from helpers import models

    caps = {i: torch.cuda.get_device_properties(i).total_memory * 9 // 10 for i in range(devices)}
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=getattr(torch, dtype), device_map="auto", max_memory=caps
    )
    return models.hold(model.eval()), dict(model.hf_device_map)


# --- 2. DDP + device_map: SWIFT's grouping ------------------------------------------------------------

# SWIFT's rule for how many GPUs NPROC_PER_NODE processes may share: swift/utils/env.py, is_mp():
#     assert n_gpu % local_world_size == 0, f'n_gpu: {n_gpu}, local_world_size: {local_world_size}'
#     if n_gpu // local_world_size >= 2: return True   # device_map over n_gpu // local_world_size GPUs
# (skipped only under SWIFT_SINGLE_DEVICE_MODE=1), and is_mp_ddp() in the same file adds DDP on top when
# there is more than one process. SWIFT calls is_mp() when it picks a CUDA model's device_map
# (swift/model/utils.py, get_default_device_map), so a count that does not divide stops every rank with an
# AssertionError before training.


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def swift_layout_problem(n_gpu: int, nproc: int) -> str | None:
    """None when SWIFT accepts ``n_gpu`` visible GPUs for ``NPROC_PER_NODE=nproc``; else one sentence
    naming its rule (swift/utils/env.py, is_mp()) and the nearest layouts it accepts."""
    if n_gpu % nproc == 0:
        return None
    fewer = max(n for n in range(1, min(nproc, n_gpu) + 1) if n_gpu % n == 0)
    subset = n_gpu // nproc * nproc
    visible = f" or make only {_gpus(subset)} visible (CUDA_VISIBLE_DEVICES)" if subset else ""
    return (
        f"SWIFT refuses {_gpus(n_gpu)} for {nproc} processes per node: its rule (swift/utils/env.py, is_mp) is "
        f"that the GPU count must be a multiple of NPROC_PER_NODE, so use NPROC_PER_NODE = {fewer}{visible}."
    )


def swift_devices(local_rank: int, n_gpu: int, local_world_size: int) -> list[int]:
    """The GPUs SWIFT gives one rank under DDP + device_map: its own line (swift/model/patcher.py) is
    ``device_ids = list(range(local_rank, n_gpu, local_world_size))``.

    Stops with one sentence for a GPU count SWIFT refuses (see :func:`swift_layout_problem`).
    """
    problem = swift_layout_problem(n_gpu, local_world_size)
    if problem:
        raise CourseError(problem)
    return list(range(local_rank, n_gpu, local_world_size))


def mp_ddp_layout(n_gpu: int, nproc: int = 2) -> dict:
    """The nearest DDP + device_map layout SWIFT accepts for ``nproc`` ranks on ``n_gpu`` visible GPUs.

    SWIFT (swift/utils/env.py, is_mp() and is_mp_ddp()) needs the GPU count to be a multiple of ``nproc``,
    and device_map needs at least 2 GPUs per rank. The layout uses the first ``n_gpu // nproc * nproc`` GPUs:
    ``CUDA_VISIBLE_DEVICES`` for the launch, ``GPUs per rank`` as SWIFT will group them, and ``note``,
    one sentence saying which GPUs stay idle (None when all are used). Too few GPUs or processes stop with
    one sentence naming the rule.
    """
    if nproc < 2:
        raise CourseError(
            f"DDP + device_map needs at least 2 processes (SWIFT's is_mp_ddp in swift/utils/env.py), "
            f"not NPROC_PER_NODE = {nproc}; with one process SWIFT uses device_map alone."
        )
    per_rank = n_gpu // nproc
    if per_rank < 2:
        raise CourseError(
            f"DDP + device_map with {nproc} processes needs at least {2 * nproc} GPUs (2 per process, and "
            f"SWIFT needs a multiple of NPROC_PER_NODE), and {_gpus(n_gpu)} {'is' if n_gpu == 1 else 'are'} visible."
        )
    used = per_rank * nproc
    note = None
    if used != n_gpu:
        note = (
            f"{n_gpu} GPUs are not a multiple of NPROC_PER_NODE = {nproc} (SWIFT's rule in swift/utils/env.py, "
            f"is_mp), so DDP + device_map uses the first {used}: {per_rank} per process, {n_gpu - used} idle."
        )
    return {
        "GPUs": used,
        "CUDA_VISIBLE_DEVICES": ",".join(launching.visible_gpus(used)),  # the first of this process's own
        "GPUs per rank": [swift_devices(r, used, nproc) for r in range(nproc)],
        "note": note,
    }


def swift_grouping(n_gpu: int, nproc: int) -> dict:
    """What SWIFT decides for ``n_gpu`` visible GPUs and ``NPROC_PER_NODE=nproc``.

    ``is_mp`` and ``is_mp_ddp`` are SWIFT's own functions (swift/utils/env.py), called with the
    environment torchrun would set for local rank 0 and with SWIFT's GPU count replaced by ``n_gpu``.
    """
    import swift.utils
    from swift.utils import env as swift_env

    environ = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
    }
    row = {"GPUs": n_gpu, "NPROC_PER_NODE": nproc}
    with (
        mock.patch.dict(os.environ, environ),
        mock.patch.object(swift.utils, "get_device_count", lambda: n_gpu),
    ):
        os.environ.pop("SWIFT_SINGLE_DEVICE_MODE", None)
        os.environ.pop("DISABLE_MP_DDP", None)
        try:
            row["device_map (is_mp)"] = swift_env.is_mp()
            row["DDP + device_map (is_mp_ddp)"] = swift_env.is_mp_ddp() if nproc > 1 else False
        except AssertionError as exc:
            row["device_map (is_mp)"] = row["DDP + device_map (is_mp_ddp)"] = False
            row["GPUs per rank"] = [f"refused: {exc}"]
            return row
    if row["device_map (is_mp)"]:
        row["GPUs per rank"] = [swift_devices(r, n_gpu, nproc) for r in range(nproc)]
    else:
        row["GPUs per rank"] = [[r] if r < n_gpu else [] for r in range(nproc)]
    return row
