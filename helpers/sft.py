"""Training with SWIFT (微调训练): one plan as `swift sft` flags or SftArguments, the original tutorial's recipe, SWIFT's logs.

Training with SWIFT (微调训练): one plan as `swift sft` flags or as SftArguments keywords, the original tutorial's recipe
for 1 to 8 GPUs, a run in a process of its own, and SWIFT's logs as curves."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from helpers import launching, models, paths, swiftcli
from helpers.errors import CourseError
from helpers.paths import read_jsonl
from helpers.selfcog import SYSTEM


def _parse_flags(args: list[str]) -> dict:
    """``["--model", "x", "--check_model", "false"]`` -> ``{"model": "x", "check_model": False}``."""
    out, key = {}, None
    for item in args:
        if item.startswith("--"):
            key = item[2:]
            out[key] = []
        elif key is not None:
            out[key].append({"true": True, "false": False}.get(item, item))
    return {k: (v[0] if len(v) == 1 else v) for k, v in out.items()}


def _flag_value(value) -> list[str]:
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    if isinstance(value, dict):
        return [json.dumps(value)]
    return [str(value)]


@dataclass(frozen=True)
class SftPlan:
    """One LoRA self-cognition training run: ``.cli()`` for ``swift sft``, ``.kwargs()`` for SftArguments."""

    model: models.ModelInfo
    datasets: tuple
    output_dir: Path
    model_name: tuple
    model_author: tuple
    steps: int | None  # optimizer steps (--max_steps); None: train ``epochs`` epochs instead
    per_device_batch: int
    grad_accum: int = 1
    nproc: int = 1
    learning_rate: float = 1e-3
    lora_rank: int = 8
    lora_alpha: int = 32
    max_length: int = 256
    device: str = "cpu"
    gradient_checkpointing: bool = False
    seed: int = 42
    dtype: str | None = None  # weights' dtype; None: float32 on the CPU, bfloat16 on a GPU
    system: str | None = None  # the system prompt; None: the template's own default
    epochs: int | None = None  # --num_train_epochs, used when ``steps`` is None
    warmup_ratio: float = 0.0  # share of the steps over which the learning rate ramps up
    gpu: bool = False  # the gpu profile's run: its environment names the CUDA devices (also in the gpu shape)
    inherit: bool = True  # those devices are this process's own (False: a command shown for another machine)
    extra: dict = field(default_factory=dict)

    @property
    def torch_dtype(self) -> str:
        return self.dtype or ("float32" if self.device == "cpu" else "bfloat16")

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: per-device batch x processes x gradient accumulation."""
        return self.per_device_batch * self.nproc * self.grad_accum

    def options(self) -> dict:
        """Every SWIFT option of this run, by name, with Python values."""
        opts = _parse_flags(self.model.swift_args())  # --model, and the offline flags for a local directory
        opts.update(
            tuner_type="lora",
            target_modules=["all-linear"],
            lora_rank=self.lora_rank,
            lora_alpha=self.lora_alpha,
            dataset=[str(d) for d in self.datasets],
            model_name=list(self.model_name),
            model_author=list(self.model_author),
            per_device_train_batch_size=self.per_device_batch,
            gradient_accumulation_steps=self.grad_accum,
            learning_rate=self.learning_rate,
            max_length=self.max_length,
            gradient_checkpointing=self.gradient_checkpointing,
            output_dir=str(self.output_dir),
            add_version=False,  # output_dir is already a fresh numbered folder
            logging_steps=1,
            save_only_model=True,
            report_to=["none"],
            dataloader_num_workers=0,
            disable_tqdm=True,
            seed=self.seed,
        )
        if self.steps is not None:
            opts["max_steps"] = self.steps
        elif self.epochs:
            opts["num_train_epochs"] = self.epochs
        else:
            raise CourseError(
                "an SftPlan needs steps (--max_steps) or epochs (--num_train_epochs); it has neither."
            )
        if self.warmup_ratio:
            opts["warmup_ratio"] = self.warmup_ratio
        if self.system is not None:
            opts["system"] = self.system  # the same prompt must be used when the model is asked later
        opts["torch_dtype"] = self.torch_dtype
        if self.device == "cpu":
            # use_cpu: without it, transformers sets up no DDP on a machine without a GPU, and every
            # rank trains alone on its share of the data, each believing it is rank 0
            opts["use_cpu"] = True
            if self.torch_dtype == "float32":  # no mixed precision switching itself on
                opts.update(fp16=False, bf16=False)
        if self.nproc > 1:
            opts["ddp_backend"] = "gloo" if self.device == "cpu" else "nccl"
            opts["ddp_find_unused_parameters"] = False  # LoRA uses every trainable parameter
            # no gradient_checkpointing_kwargs: under DDP SWIFT 4.6 picks use_reentrant=False itself
            # (swift/trainers/mixin.py; notebook 12, section 1)
        opts.update(self.extra)
        return opts

    def env(self) -> dict:
        """Environment variables the run needs: on GPUs, exactly ``nproc`` visible devices, the first of the
        ones this process may use (``launching.visible_gpus``; with more, a single SWIFT process would
        spread the model over all of them, device_map style)."""
        if not self.gpu and self.device == "cpu":
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(launching.visible_gpus(self.nproc, inherit=self.inherit))}

    def cli(self) -> list[str]:
        """The arguments after ``swift sft``."""
        out = []
        for key, value in self.options().items():
            out += [f"--{key}", *_flag_value(value)]
        return out

    def kwargs(self) -> dict:
        """Keywords for ``swift.SftArguments(**plan.kwargs())`` (the Python API)."""
        return dict(self.options())


def batch_split(global_batch: int, nproc: int, per_device_max: int = 4) -> tuple[int, int]:
    """(per-device batch, gradient accumulation) that give ``global_batch`` over ``nproc`` processes.

    Every process takes the same share, per-device batch x accumulation steps, so ``global_batch`` must be
    a multiple of ``nproc``. When it is not (16 on 3, 5, 6 or 7 GPUs), this stops with one sentence
    naming the rule and the nearest layouts that follow it: fewer processes, or a global batch one
    multiple below or above.
    """
    if global_batch % nproc:
        fewer = max(n for n in range(1, nproc + 1) if global_batch % n == 0)
        below = global_batch // nproc * nproc
        batches = " or ".join(str(b) for b in (below, below + nproc) if b > 0)
        raise CourseError(
            f"GLOBAL_BATCH = {global_batch} cannot be split evenly over {nproc} processes: every process "
            "takes the same share (per-device batch × accumulation steps), so the global batch must be a "
            f"multiple of the number of processes; set NPROC = {fewer} or GLOBAL_BATCH = {batches}."
        )
    per_process = global_batch // nproc
    per_device = max(d for d in range(1, min(per_device_max, per_process) + 1) if per_process % d == 0)
    return per_device, per_process // per_device


# SWIFT's self-cognition best practice for Qwen2.5-7B-Instruct on one 24 GB GPU (the original tutorial links to it):
# hub data, one epoch, LoRA rank 8 / alpha 32 on every linear layer, lr 1e-4 with 5% warm-up,
# per-device batch 1 accumulated to a global batch of 16, sequences up to 2048 tokens, bf16 weights,
# gradient checkpointing on, an explicit system prompt.
HUB_DATASETS = (
    "AI-ModelScope/alpaca-gpt4-data-zh#500",
    "AI-ModelScope/alpaca-gpt4-data-en#500",
    "swift/self-cognition#500",
)


def sampled(sources, rows: int) -> tuple:
    """``sources`` (paths or hub ids, with or without SWIFT's ``#N``) asking for ``rows`` rows in all, split
    evenly between them. ``"source#N"`` makes SWIFT draw N rows of it with its data seed (``--data_seed``, 42,
    apart from ``--seed``), so two runs listing the same sources first draw the same rows
    (``swift/dataset/loader.py``, ``load_dataset``; ``swift/dataset/utils.py``, ``sample_dataset``)."""
    bare = [str(source).split("#")[0] for source in sources]
    if not bare or rows < len(bare):
        raise CourseError(f"cannot take {rows} row(s) from {len(bare)} source(s): give at least one row each.")
    return tuple(f"{source}#{rows // len(bare) + (i < rows % len(bare))}" for i, source in enumerate(bare))


SEED_GLOBAL_BATCH = 16


DATASET_CHOICES = ("hub", "course")  # DATASETS = "hub": the original tutorial's mix; "course": data/ in this repository


def choose_datasets(value, profile) -> str:
    """``DATASETS``: "hub" (the original tutorial's mix, downloaded) or "course" (data/ here); None: hub on gpu only."""
    from helpers.profiles import check_choice

    chosen = value if value is not None else ("hub" if profile.name == "gpu" else "course")
    check_choice("DATASETS", chosen, DATASET_CHOICES)
    if chosen == "hub" and profile.name != "gpu":
        raise CourseError(
            f"DATASETS = 'hub' downloads the original tutorial's 1,500 rows, which only the gpu profile trains on; "
            f"on {profile.name} choose 'course' or None."
        )
    return chosen


def nearest_accumulation(global_batch: int, nproc: int, per_device: int = 1) -> tuple[int, str | None]:
    """Accumulation steps that bring ``nproc`` processes closest to ``global_batch``, and a sentence when
    the global batch had to change (16 does not divide over 3, 5, 6 or 7 GPUs)."""
    share = per_device * nproc
    low = max(1, global_batch // share)
    accum = min((low, low + 1), key=lambda a: (abs(a * share - global_batch), a))
    got = accum * share
    if got == global_batch:
        return accum, None
    return accum, (
        f"a global batch of {global_batch} does not divide over {nproc} processes × {per_device} per device, "
        f"so each process accumulates {accum} steps: a global batch of {got}, the nearest possible."
    )


def tutorial_recipe(
    model,
    nproc: int,
    *,
    output_dir,
    model_name,
    model_author,
    datasets=HUB_DATASETS,
    device: str = "cuda",
    steps: int | None = None,
    global_batch: int = SEED_GLOBAL_BATCH,
    learning_rate: float = 1e-4,
    max_length: int = 2048,
    gradient_checkpointing: bool = True,
    dtype: str = "bfloat16",
    inherit: bool = True,
) -> tuple[SftPlan, str | None]:
    """The original tutorial's ``swift sft`` on ``nproc`` GPUs (one epoch unless ``steps`` is given), and the sentence
    :func:`nearest_accumulation` says when the global batch had to change. The defaults are the original tutorial's;
    a notebook passes its own knobs (``GLOBAL_BATCH``, ``LEARNING_RATE``, ...) and the profile's dtype
    (float16 on a GPU without bf16). ``inherit=False``: the command for another machine's GPUs."""
    accum, note = nearest_accumulation(global_batch, nproc)
    plan = SftPlan(
        model=model,
        datasets=tuple(datasets),
        output_dir=Path(output_dir),
        model_name=tuple(model_name),
        model_author=tuple(model_author),
        steps=steps,
        epochs=1,
        per_device_batch=1,
        grad_accum=accum,
        nproc=nproc,
        learning_rate=learning_rate,
        lora_rank=8,
        lora_alpha=32,
        max_length=max_length,
        device=device,
        dtype=dtype,
        gradient_checkpointing=gradient_checkpointing,
        system=SYSTEM,
        warmup_ratio=0.05,
        gpu=True,
        inherit=inherit,
    )
    return plan, note


def sft_process(arguments: dict, script, gpus: int = 0, timeout: float = 3600, env=None) -> dict:
    """``sft_main(SftArguments(**arguments))`` in a process of its own, on the first ``gpus`` of this
    process's GPUs: ``script`` (notebook 09 writes it) reads the keywords from a JSON file and writes what
    sft_main returned. When the process ends the GPU has every byte of the run back, which a run inside the
    kernel, freed by garbage collection, does not promise (SWIFT documents a 22 GB peak for a 7B LoRA).
    Returns the script's result."""
    import sys

    folder = paths.run_dir("sft-from-python", f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}")
    kwargs_file, result_file = folder / "kwargs.json", folder / "result.json"
    kwargs_file.write_text(json.dumps(arguments, ensure_ascii=False, indent=1, default=str))
    launch = launching.Launch(
        [sys.executable, script, kwargs_file, result_file], env={**(launching.gpu_env(gpus) if gpus else {}), **(env or {})},
        label=f"sft_main {Path(arguments['output_dir']).parent.name}", timeout=timeout,
    )  # fmt: skip
    launching.run(launch, show=False)
    return json.loads(result_file.read_text())


def model_arguments(info: models.ModelInfo) -> dict:
    """SftArguments' fields that point at ``info`` (``model``, ``model_type``, ``template``, and a local
    folder's ``check_model`` / ``external_plugins``): the keyword form of ``info.swift_args()``."""
    return _parse_flags(info.swift_args())


def flags(command: str) -> dict:
    """The options of a typed ``swift`` command, by name (``"--lora_rank 8"`` -> ``{"lora_rank": "8"}``;
    true/false as booleans)."""
    return _parse_flags(swiftcli.parse_swift_text(command)[2])


def shell_command(plan: SftPlan, subcommand: str = "sft", env=None) -> str:
    """The run as a shell command to type: its environment (``env`` first), ``swift sft``, one option per
    line; ``swiftcli.swift_shell`` runs exactly this text."""
    env = {**(env or {}), **plan.env()}
    if plan.nproc > 1:
        env["NPROC_PER_NODE"] = str(plan.nproc)
    return swiftcli.swift_text(subcommand, plan.cli(), env)


@dataclass
class RunLog:
    """What one ``swift sft`` run logged: a curve per metric and its end-of-training summary."""

    output_dir: Path
    steps: list[int]
    loss: list[float]
    token_acc: list[float]
    learning_rate: list[float]
    summary: dict  # train_runtime, train_samples_per_second, train_steps_per_second, train_loss
    last_checkpoint: Path | None
    elapsed: list[float] = field(default_factory=list)  # seconds since training began, at each logged step
    grad_norm: list[float] = field(default_factory=list)  # the gradients' norm at each logged step, before clipping

    def step_seconds(self, last: int) -> list[float]:
        """How long each of steps 2 to ``last`` took (logged every step). Step 1 is left out: it holds the
        start-up. SWIFT logs ``train_speed(s/it)``, the seconds since training began over the steps done
        (``add_train_message`` in swift/trainers/patcher.py), to six decimals; its ``elapsed_time`` is whole
        seconds."""
        ends = dict(zip(self.steps, self.elapsed, strict=True))
        missing = [k for k in range(1, last + 1) if k not in ends]
        if missing or last < 2:
            raise CourseError(f"{self.output_dir} did not log every step up to {last} (missing {missing[:5]}); "
                              "time steps from a run with --logging_steps 1 and at least 2 steps.")
        return [ends[k] - ends[k - 1] for k in range(2, last + 1)]

    @property
    def final_loss(self) -> float:
        return self.loss[-1]

    @property
    def final_token_acc(self) -> float:
        return self.token_acc[-1]

    def row(self, label: str, global_batch: int, nproc: int, wall: float | None = None) -> dict:
        """One row of a comparison table."""
        return {
            "run": label,
            "processes": nproc,
            "global batch": global_batch,
            "steps": self.steps[-1],
            "samples/s": round(self.summary.get("train_samples_per_second", float("nan")), 3),
            "train s": round(self.summary.get("train_runtime", float("nan")), 1),
            "wall s": round(wall, 1) if wall is not None else "",
            "final loss": round(self.final_loss, 4),
            "final token acc": round(self.final_token_acc, 4),
        }


_STEP_LINE = re.compile(r"^\[rank(\d+)\]:.*'global_step/max_steps'")


def logging_ranks(lines) -> list[int]:
    """The ranks that printed training-step lines in a launch's output. Under DDP only rank 0 logs;
    if every rank logs, each one believes it is rank 0: they are training alone, not together."""
    return sorted({int(m.group(1)) for m in map(_STEP_LINE.match, lines) if m})


def _step_of(entry: dict) -> int | None:
    if "step" in entry:
        return int(entry["step"])
    progress = entry.get("global_step/max_steps")
    return int(str(progress).split("/")[0]) if progress else None


def read_log(output_dir) -> RunLog:
    """Read ``logging.jsonl`` in a SWIFT output folder (``trainer_state.json`` of the checkpoint as a fallback)."""
    output_dir = Path(output_dir)
    entries, last = [], None
    jsonl = output_dir / "logging.jsonl"
    if jsonl.is_file():
        for row in read_jsonl(jsonl):
            if "log_history" in row:  # the closing message: checkpoint paths and the whole history
                last = row.get("last_model_checkpoint") or last
                continue
            entries.append(row)
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    if not entries and checkpoints and (checkpoints[-1] / "trainer_state.json").is_file():
        entries = json.loads((checkpoints[-1] / "trainer_state.json").read_text())["log_history"]
    if not entries:
        raise CourseError(f"{output_dir} has no SWIFT training log (logging.jsonl); did the run finish?")
    curve = {}  # step -> entry, later entries win
    summary = {}
    for entry in entries:
        if "train_runtime" in entry:
            summary = {k: float(v) for k, v in entry.items() if k.startswith("train_")}
        elif "loss" in entry and _step_of(entry) is not None:
            curve[_step_of(entry)] = entry
    steps = sorted(curve)
    last = Path(last) if last else (checkpoints[-1] if checkpoints else None)
    return RunLog(
        output_dir=output_dir,
        steps=steps,
        loss=[float(curve[s]["loss"]) for s in steps],
        token_acc=[float(curve[s].get("token_acc", float("nan"))) for s in steps],
        learning_rate=[float(curve[s].get("learning_rate", float("nan"))) for s in steps],
        summary=summary,
        last_checkpoint=last,
        elapsed=[s * float(curve[s].get("train_speed(s/it)", float("nan"))) for s in steps],
        grad_norm=[float(curve[s].get("grad_norm", float("nan"))) for s in steps],
    )


def swift_log_level(level: str = "WARNING") -> None:
    """In this process, show SWIFT's log lines from ``level`` up, as ``LOG_LEVEL`` does for the CLI. Call it
    before SWIFT is first imported: SWIFT gives its console handler the level of ``LOG_LEVEL`` when it
    creates it."""
    import logging

    previous = os.environ.get("LOG_LEVEL")
    os.environ["LOG_LEVEL"] = level  # for this process only: the swift commands it launches keep their own
    try:
        from swift.utils import logger as swift_logger  # creates SWIFT's logger and handler at this level
    finally:
        if previous is None:
            del os.environ["LOG_LEVEL"]
        else:
            os.environ["LOG_LEVEL"] = previous

    swift = logging.getLogger("swift")
    for logger_or_handler in [swift, *swift.handlers]:
        logger_or_handler.setLevel(getattr(logging, level))
    del swift_logger
