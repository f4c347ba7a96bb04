"""Beyond DDP (超越 DDP): device_map placement, DDP+device_map grouping, and ZeRO / FSDP memory and traffic per rank.

Four ways to spread training over several devices, each measured rather than described:

1. ``device_map`` (简易模型并行): whole layers go to different devices; accelerate's own planner
   decides where, on a model built on the meta device (nothing allocated).
2. DDP + device_map: SWIFT gives each DDP rank a group of GPUs; its own rules say which.
3. ZeRO-2 / ZeRO-3 (DeepSpeed) and FSDP2 (PyTorch): every rank keeps only a shard (分片) of some of
   the training state. The per-rank bytes are counted from the tensors each rank really holds and
   compared with the ZeRO formulas, whose bytes per parameter come from :mod:`helpers.parallelism`.
4. Communication: every collective a rank calls is counted, and compared with the ring formulas.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections import defaultdict
from unittest import mock

import torch
from torch import nn

from helpers import launching
from helpers.errors import CourseError
from helpers.parallelism import BF16_MIXED_ADAM, FP32_ADAM, Recipe

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

SWIFT_GROUP_RULE = "device_ids = list(range(local_rank, n_gpu, local_world_size))"


def swift_rule_in_source() -> bool:
    """True when the installed SWIFT still contains the grouping line this module reproduces."""
    import inspect

    import swift.model.patcher as patcher

    return SWIFT_GROUP_RULE in inspect.getsource(patcher)


# SWIFT's rule for how many GPUs NPROC_PER_NODE processes may share: swift/utils/env.py, is_mp():
#     assert n_gpu % local_world_size == 0, f'n_gpu: {n_gpu}, local_world_size: {local_world_size}'
#     if n_gpu // local_world_size >= 2: return True   # device_map over n_gpu // local_world_size GPUs
# (skipped only under SWIFT_SINGLE_DEVICE_MODE=1), and is_mp_ddp() in the same file adds DDP on top when
# there is more than one process. SWIFT calls is_mp() when it picks a CUDA model's device_map
# (swift/model/utils.py, get_default_device_map), so a count that does not divide stops every rank with an
# AssertionError before training.
SWIFT_LAYOUT_SOURCE = "swift/utils/env.py, is_mp() and is_mp_ddp()"


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def swift_layout_problem(n_gpu: int, nproc: int) -> str | None:
    """None when SWIFT accepts ``n_gpu`` visible GPUs for ``NPROC_PER_NODE=nproc``; else one sentence
    naming its rule (``SWIFT_LAYOUT_SOURCE``) and the nearest layouts it accepts."""
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
    """The GPUs SWIFT gives one rank under DDP + device_map (its rule, quoted in ``SWIFT_GROUP_RULE``).

    Stops with one sentence for a GPU count SWIFT refuses (see :func:`swift_layout_problem`).
    """
    problem = swift_layout_problem(n_gpu, local_world_size)
    if problem:
        raise CourseError(problem)
    return list(range(local_rank, n_gpu, local_world_size))


def mp_ddp_layout(n_gpu: int, nproc: int = 2) -> dict:
    """The nearest DDP + device_map layout SWIFT accepts for ``nproc`` ranks on ``n_gpu`` visible GPUs.

    SWIFT (``SWIFT_LAYOUT_SOURCE``) needs the GPU count to be a multiple of ``nproc``, and device_map
    needs at least 2 GPUs per rank. The layout uses the first ``n_gpu // nproc * nproc`` GPUs:
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


# --- 3. what each rank holds: the ZeRO formulas -------------------------------------------------------

PARTS = ("parameters", "fp32 master copy", "gradients", "Adam moments")

# DeepSpeed's ZeRO optimizers always keep their own fp32 partition of the weights (the "master" copy
# that mixed precision needs), even when the model itself is fp32: 4 bytes per parameter more.
DEEPSPEED_FP32 = Recipe(
    "deepspeed_fp32",
    "fp32 Adam under DeepSpeed ZeRO",
    weights=FP32_ADAM.weights,
    gradients=FP32_ADAM.gradients,
    master_weights=BF16_MIXED_ADAM.master_weights,
    adam_moments=FP32_ADAM.adam_moments,
)

METHODS = ("ddp", "zero2", "zero3", "fsdp2")
METHOD_NAMES = {"ddp": "DDP", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp2": "FSDP2"}
RECIPE = {
    "ddp": FP32_ADAM,
    "zero1": DEEPSPEED_FP32,
    "zero2": DEEPSPEED_FP32,
    "zero3": DEEPSPEED_FP32,
    "fsdp2": FP32_ADAM,
}
# which parts each method divides by N (ZeRO paper: stage 1 = optimizer states, 2 = + gradients, 3 = + parameters)
SHARDED = {
    "ddp": set(),
    "zero1": {"fp32 master copy", "Adam moments"},
    "zero2": {"fp32 master copy", "Adam moments", "gradients"},
    "zero3": set(PARTS),
    "fsdp2": set(PARTS),
}


def formula_bytes(n_params: int, world: int, method: str, recipe: Recipe | None = None) -> dict[str, float]:
    """Bytes one rank holds for each part of the training state: bytes per parameter x P, / N where sharded."""
    recipe = recipe or RECIPE[method]
    per_param = {
        "parameters": recipe.weights,
        "fp32 master copy": recipe.master_weights,
        "gradients": recipe.gradients,
        "Adam moments": recipe.adam_moments,
    }
    return {part: n_params * b / (world if part in SHARDED[method] else 1) for part, b in per_param.items()}


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 DTensor: this rank's shard only
        key = (t.data_ptr(), t.numel())
        if t.numel() and key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def _moments(optimizer) -> list:
    return [s[k] for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq") if k in s]


def held_bytes_torch(model: nn.Module, optimizer) -> dict[str, int]:
    """Bytes this rank holds for a plain or FSDP2 model (call between backward and step)."""
    params = list(model.parameters())
    return {
        "parameters": _nbytes(params),
        "fp32 master copy": 0,
        "gradients": _nbytes(p.grad for p in params),
        "Adam moments": _nbytes(_moments(optimizer)),
    }


def held_bytes_deepspeed(engine) -> dict[str, int]:
    """Bytes this rank holds under a DeepSpeed ZeRO engine (call between backward and step).

    ZeRO-2: full weights (``bit16_groups_flat``), this rank's fp32 partition
    (``single_partition_of_fp32_groups``) and gradient partition (``averaged_gradients``).
    ZeRO-3: only a partition of the weights (``fp16_partitioned_groups_flat``), plus any parameter
    still gathered, the fp32 partition (``fp32_partitioned_groups_flat``) and the gradient partition
    buffer (``grad_partitions_flat_buffer``). Adam's moments live in the wrapped torch optimizer.
    """
    opt = engine.optimizer
    if engine.zero_optimization_stage() == 3:
        weights = list(opt.fp16_partitioned_groups_flat) + [p.data for p in engine.module.parameters()]
        master = opt.fp32_partitioned_groups_flat
        grads = [opt.grad_partitions_flat_buffer]
    else:
        weights = opt.bit16_groups_flat
        master = opt.single_partition_of_fp32_groups
        averaged = opt.averaged_gradients
        grads = [
            g
            for group in (averaged.values() if isinstance(averaged, dict) else averaged)
            for g in group or []
        ]
    return {
        "parameters": _nbytes(weights),
        "fp32 master copy": _nbytes(master),
        "gradients": _nbytes(grads),
        "Adam moments": _nbytes(_moments(opt.optimizer)),
    }


# --- 4. communication: count every collective ----------------------------------------------------------

COLLECTIVES = (
    "all_reduce",
    "reduce_scatter_single",  # torch 2.13's names; FSDP2 calls these
    "all_gather_single",
    "reduce_scatter_tensor",  # the older names DeepSpeed calls (they call the two above)
    "all_gather_into_tensor",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "reduce",
)
# bytes one rank sends over a ring for a collective whose full (unsharded) payload is B bytes
WIRE_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def _kind(name: str) -> str:
    """all_gather_into_tensor, all_gather_single -> all_gather; reduce_scatter_tensor -> reduce_scatter."""
    for suffix in ("_into_tensor", "_tensor", "_single"):
        name = name.removesuffix(suffix)
    return name


def _payload(name: str, args, kwargs) -> int:
    """Full payload of one call: the unsharded size (output of an all-gather, input of a reduce-scatter)."""
    first = args[0] if args else next(iter(kwargs.values()))
    if name.startswith("reduce_scatter_"):
        first = args[1] if len(args) > 1 else kwargs.get("input")
    if isinstance(first, (list, tuple)):
        return sum(t.numel() * t.element_size() for t in first)
    return first.numel() * first.element_size()


class CollectiveCounter:
    """Wraps the ``torch.distributed`` collectives and counts calls and payload bytes per kind.

    DeepSpeed (through ``deepspeed.comm``) and FSDP2 call these Python functions; DDP's reducer calls
    C++ directly, so DDP needs a Python comm hook (``allreduce_hook``) for its traffic to be seen.
    """

    def __init__(self):
        self.calls: dict = defaultdict(int)
        self.payload: dict = defaultdict(int)
        self.counting = False
        self._depth = 0  # a deprecated collective calls its new name: count the outer call only
        self._saved = []

    def install(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name in COLLECTIVES:
            for module in (dist, c10d):
                original = getattr(module, name, None)
                if original is None or getattr(original, "_counted", False):
                    continue
                self._saved.append((module, name, original))
                setattr(module, name, self._wrap(name, original))
        return self

    def _wrap(self, name, original):
        def counted(*args, **kwargs):
            if self.counting and not self._depth:
                self.calls[_kind(name)] += 1
                self.payload[_kind(name)] += _payload(name, args, kwargs)
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        counted._counted = True
        return counted

    def uninstall(self):
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()

    @contextlib.contextmanager
    def count(self):
        """Count only inside this block."""
        self.counting = True
        try:
            yield self
        finally:
            self.counting = False

    def reset(self):
        self.calls.clear()
        self.payload.clear()


def wire_bytes(payload: dict, world: int) -> float:
    """Bytes one rank sends for the collectives in ``payload`` (kind -> bytes), with ring algorithms."""
    return sum(WIRE_FACTOR[kind](world) * b for kind, b in payload.items())


def theory_traffic(n_params: int, world: int, method: str, bytes_per_value: int = 4) -> dict[str, float]:
    """Payload per step by collective (the ZeRO paper's accounting, Φ = parameter bytes).

    DDP all-reduces the gradients (Φ); ZeRO-2 reduce-scatters the gradients and all-gathers the
    updated weights (Φ + Φ); ZeRO-3 and FSDP2 gather the weights twice (forward, backward) and
    reduce-scatter the gradients (2Φ + Φ).
    """
    phi = n_params * bytes_per_value
    return {
        "ddp": {"all_reduce": phi},
        "zero1": {"reduce_scatter": phi, "all_gather": phi},
        "zero2": {"reduce_scatter": phi, "all_gather": phi},
        "zero3": {"all_gather": 2 * phi, "reduce_scatter": phi},
        "fsdp2": {"all_gather": 2 * phi, "reduce_scatter": phi},
    }[method]


# --- 5. the small model the four methods train --------------------------------------------------------


def fsdp2_padded_params(model: nn.Module, world: int) -> int:
    """Values FSDP2 gathers and reduce-scatters for ``model`` on ``world`` ranks: each parameter is cut along
    dim 0 into ``world`` chunks of ceil(dim0 / world) rows, the last ones padded with zeros
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, ``FSDPParam._init_sharded_param``: every shard is
    ``chunks[0]``'s size). Equal to the parameter count when ``world`` divides every dim 0."""
    return sum(-(-p.shape[0] // world) * world * (p.numel() // p.shape[0]) for p in model.parameters())


def small_model(features: int = 32, hidden: int = 128, layers: int = 3, classes: int = 8, seed: int = 0):
    """A float32 MLP: ``layers`` hidden Linear+Tanh blocks; the same weights for a given seed."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        blocks: list[nn.Module] = [nn.Linear(features, hidden), nn.Tanh()]
        for _ in range(layers - 1):
            blocks += [nn.Linear(hidden, hidden), nn.Tanh()]
        blocks.append(nn.Linear(hidden, classes))
        return nn.Sequential(*blocks)


def dataset(samples: int, features: int = 32, classes: int = 8, seed: int = 0):
    """A synthetic classification set (x float32, y class ids): the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    centres = torch.randn(classes, features, generator=gen)
    y = (x @ centres.T + 0.5 * torch.randn(samples, classes, generator=gen)).argmax(1)
    return x, y


def curves_agree(curves: dict, tol: float) -> tuple[bool, float]:
    """True when every curve stays within ``tol`` (absolute) of the first one; also the largest gap."""
    names = list(curves)
    ref = curves[names[0]]
    gap = (
        max(abs(a - b) for n in names[1:] for a, b in zip(ref, curves[n], strict=True))
        if len(names) > 1
        else 0.0
    )
    return gap <= tol, gap


WHEN = {
    "device_map": "one process; the model does not fit one GPU and speed matters less (inference, quick tests)",
    "ddp": "the whole training state fits on every GPU: simplest and fastest",
    "zero2": "weights fit, but gradients + optimizer states do not; DeepSpeed users",
    "zero3": "not even the weights fit on one GPU; more traffic per step",
    "fsdp2": "same memory as ZeRO-3 in plain PyTorch (no DeepSpeed); composes with other torch parallelism",
}


# LoRA on Qwen2.5-7B-Instruct as SWIFT publishes it: the memory each example script states in its first
# line (modelscope/ms-swift, examples/train/multi-gpu/, file at the commit given), bf16 weights, LoRA rank 8,
# swift/self-cognition#1000, per-device batch 1. Recorded by SWIFT on its GPUs, at different times and with
# slightly different flags (the FSDP2 example turns gradient checkpointing off); not measured by this course.
SWIFT_LORA_7B = [
    {"method": "DDP", "processes": 2, "gpus": 2, "gib_per_gpu": 27.5, "sharded": "nothing",
     "source": "ddp/train.sh @ 4d8ab34"},
    {"method": "DDP + device_map", "processes": 2, "gpus": 4, "gib_per_gpu": 14.0, "sharded": "layers over 2 GPUs a process",
     "source": "ddp_device_map/train.sh @ 1459bfc"},
    {"method": "ZeRO-2", "processes": 2, "gpus": 2, "gib_per_gpu": 18.0, "sharded": "LoRA gradients + optimizer states",
     "source": "deepspeed/train_zero2.sh @ 6488cba"},
    {"method": "ZeRO-3", "processes": 2, "gpus": 2, "gib_per_gpu": 16.0, "sharded": "+ the frozen weights",
     "source": "deepspeed/train_zero3.sh @ 3017915"},
    {"method": "FSDP2", "processes": 2, "gpus": 2, "gib_per_gpu": 14.7, "sharded": "weights, gradients, optimizer states",
     "source": "fsdp2_lora/train.sh @ 61997b4"},
]  # fmt: skip
_WEIGHT_SPLIT = {
    "DDP": 1,
    "DDP + device_map": 2,
    "ZeRO-2": 1,
    "ZeRO-3": 2,
    "FSDP2": 2,
}  # GPUs sharing one copy


def lora_7b_rows(n_params: int, lora_params: int) -> list[dict]:
    """SWIFT's published memory per GPU for LoRA on Qwen2.5-7B (:data:`SWIFT_LORA_7B`), next to what the
    formula says each GPU holds before activations: the frozen bf16 weights (2 bytes each, divided where
    the method splits them) plus the LoRA parameters' fp32 weights, gradients and Adam moments (16 bytes
    each, divided by the processes where ZeRO-2/3 or FSDP2 shard them)."""
    rows = []
    for example in SWIFT_LORA_7B:
        split = _WEIGHT_SPLIT[example["method"]]
        lora_split = example["processes"] if example["method"] in ("ZeRO-2", "ZeRO-3", "FSDP2") else 1
        formula = (2 * n_params / split + 16 * lora_params / lora_split) / 2**30
        rows.append({
            "method": example["method"],
            "GPUs (processes)": f"{example['gpus']} ({example['processes']})",
            "sharded": example["sharded"],
            "weights + LoRA state, GiB/GPU (formula)": round(formula, 1),
            "GiB/GPU (SWIFT's example)": example["gib_per_gpu"],
            "source": "SWIFT examples/train/multi-gpu/" + example["source"],
        })  # fmt: skip
    return rows


def decision_rows(per_rank: dict, traffic: dict, seconds: dict) -> list[dict]:
    """The decision table: measured per-rank bytes, traffic and step time per method, with when to use it."""
    rows = []
    for m in per_rank:
        rows.append(
            {
                "method": METHOD_NAMES.get(m, m),
                "bytes per rank": sum(per_rank[m].values()),
                "vs DDP": round(sum(per_rank[m].values()) / sum(per_rank["ddp"].values()), 3),
                "wire bytes per step": round(traffic[m]),
                "ms per step (2 CPU ranks)": round(1e3 * seconds[m], 1),
                "when to use": WHEN[m],
            }
        )
    return rows


# --- plumbing for the launched script ------------------------------------------------------------------


def import_deepspeed():
    """``import deepspeed``, minus a kernel this lesson never uses.

    On a CPU, DeepSpeed's communication backend compiles a shared-memory all-reduce kernel the first
    time it starts (about two minutes on two cores); only its inference all-reduce uses it, training
    goes through ``torch.distributed``. Skipping the build changes nothing that is measured here.
    """
    import sys

    import deepspeed

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    return deepspeed


nothing = contextlib.nullcontext


# --- SWIFT runs ----------------------------------------------------------------------------------------


def arithmetic_dataset(folder, rows: int = 16) -> str:
    """A tiny chat dataset written by this course (``messages`` rows): "What is a plus b?"."""
    import json
    from pathlib import Path

    path = Path(folder) / "arithmetic.jsonl"
    pairs = [(a, b) for a in range(8) for b in range(8)][:rows]
    lines = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"What is {a} plus {b}?"},
                    {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
                ]
            }
        )
        for a, b in pairs
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def swift_summary(result) -> dict:
    """From a finished ``swift sft`` launch: its final train_loss, and how many ranks printed the summary."""
    summaries = [ln for ln in result.lines if "'train_runtime'" in ln]
    losses = [
        float(m.group(1)) for ln in summaries for m in [re.search(r"'train_loss': '?([0-9.]+)", ln)] if m
    ]
    return {
        "train_loss": losses[-1] if losses else None,
        "ranks printing the summary": len(summaries),
        "seconds": round(result.seconds, 1),
    }


# Rank 0's ZeRO optimizer states, as DeepSpeed names them: deepspeed/runtime/engine.py,
# DeepSpeedEngine._get_zero_ckpt_name -> _get_rank_zero_ckpt_name -> _get_zero_ckpt_prefix gives
# f'{"bf16_" if bf16_mode else ""}zero_pp_rank_{dp_rank}' + f"_mp_rank_{mp_rank:02d}_optim_states.pt", so a bf16
# run writes bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt. DeepSpeed's own reader
# (deepspeed/checkpoint/reshape_utils.py, get_zero_files) also accepts the fp16_ prefix.
ZERO_RANK0 = re.compile(r"(?:bf16_|fp16_)?zero_pp_rank_0_mp_rank_\d+_optim_states\.pt")


def saved_shards(output_dir) -> dict:
    """What the last checkpoint under ``output_dir`` proves about sharding.

    DeepSpeed: ``partition_count`` stored with rank 0's ZeRO optimizer states (one entry per param
    group: the ranks the states were split over). FSDP2: the number of per-rank ``.distcp`` shards.
    """
    from pathlib import Path

    checkpoints = sorted(Path(output_dir).rglob("checkpoint-*"), key=lambda p: p.stat().st_mtime)
    if not checkpoints:
        return {"checkpoint": None}
    last = checkpoints[-1]
    zero = sorted(
        p for p in last.rglob("*zero_pp_rank_0_mp_rank_*_optim_states.pt") if ZERO_RANK0.fullmatch(p.name)
    )
    if zero:
        state = torch.load(zero[0], map_location="cpu", weights_only=False)["optimizer_state_dict"]
        counts = state.get("partition_count")
        counts = counts if isinstance(counts, (list, tuple)) else [counts]
        return {"checkpoint": last.name, "kind": "DeepSpeed ZeRO", "ranks sharded over": max(counts)}
    distcp = sorted(last.rglob("*.distcp"))
    if distcp:
        folders = {p.parent for p in distcp}
        per_folder = max(sum(1 for p in distcp if p.parent == f) for f in folders)
        return {"checkpoint": last.name, "kind": "FSDP sharded state dict", "ranks sharded over": per_folder}
    return {"checkpoint": last.name, "kind": "unsharded"}


def swift_preset_without_batch_size(name: str, folder) -> str:
    """SWIFT's DeepSpeed preset ``name`` (e.g. "zero3") saved to ``folder`` without its ``train_batch_size``.

    DeepSpeed then derives the global batch itself (micro batch x accumulation x its world size) each
    time it builds a config. Needed for ZeRO-3 on CPUs: ``deepspeed.zero.Init`` reads the config
    before ``deepspeed.comm`` is initialised, so it sees a world size of 1, while transformers filled
    ``"auto"`` for 2 ranks (deepspeed/runtime/zero/partition_parameters.py, ``Init.__init__``).
    """
    import json
    from pathlib import Path

    import swift

    preset = Path(swift.__file__).parent / "config" / f"{name}.json"
    config = json.loads(preset.read_text())
    config.pop("train_batch_size", None)
    path = Path(folder) / f"{name}_no_train_batch_size.json"
    path.write_text(json.dumps(config, indent=1))
    return str(path)
