"""Beyond DDP (超越 DDP): ZeRO-2 / ZeRO-3 (DeepSpeed) and FSDP2 (PyTorch) memory and traffic per rank.

Every rank keeps only a shard (分片) of some of the training state. Notebook 11's script
(``sharded_train.py``) counts the bytes each rank really holds and every collective it calls; this module
holds what they are compared with: the ZeRO formulas, whose bytes per parameter come from
:mod:`helpers.parallelism`, and the ring formulas.
device_map and DDP + device_map are in :mod:`helpers.devicemap`.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from helpers.parallelism import BF16_MIXED_ADAM, FP32_ADAM, Recipe
from helpers.toys import mlp

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
METHOD_NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp2": "FSDP2"}
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


# --- 4. communication: what the ring algorithms send ---------------------------------------------------

# bytes one rank sends over a ring for a collective whose full (unsharded) payload is B bytes
WIRE_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


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
    """Notebook 11's float32 model: ``layers`` hidden Linear+Tanh blocks; the same weights for a given seed."""
    return mlp([features] + [hidden] * layers + [classes], activation=nn.Tanh, seed=seed)


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
