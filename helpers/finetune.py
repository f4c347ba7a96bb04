"""Fine-tuning with SWIFT (微调训练): the course's data, SWIFT's arguments, its logs as curves, adapter checks.

Data (all written by this project, under ``data/``):

- ``data/self-cognition/self_cognition.jsonl``: identity questions and answers in Chinese and English
  (columns ``query``, ``response``, ``tag`` zh|en) with ``{{NAME}}`` / ``{{AUTHOR}}`` placeholders. The
  folder is called exactly ``self-cognition``: SWIFT matches a local dataset folder to its registered
  dataset of the same name, so ``--model_name`` / ``--model_author`` fill the placeholders (the zh value
  for rows tagged zh, the en value for the others), as for the hub's ``swift/self-cognition``.
- ``data/general_questions.jsonl``: everyday questions. The base model answers them itself
  (:func:`general_answers`, cached under ``build/models/general-answers/``, keyed by model); mixing
  those answers into training keeps the model's general behaviour (against forgetting, 灾难性遗忘).
- ``data/heldout.jsonl``: questions that appear in no training data, for evaluation here and in
  notebook 07: identity paraphrases (``kind`` identity, ``tag`` zh|en) and general questions with the
  words a right answer contains (``kind`` general, ``expect``).

The adapter notebook 07 should use is recorded in ``build/outputs/latest-self-cognition.json``, one
record per profile (``{"cpu": {...}, "smoke": {...}}``: a smoke test never replaces the cpu adapter).
:func:`save_latest` writes it atomically under a lock; ``load_latest(profile.name)`` reads one record:

- ``checkpoint``: the LoRA checkpoint directory (adapter_config.json, adapter_model.safetensors)
- ``model``, ``model_type``, ``template``: the base model as SWIFT was given it (``--model`` ...), and
  ``hub_id`` when it came from ModelScope (``--model`` then names the id)
- ``model_name``, ``model_author``: the [zh, en] pairs used for the placeholders
- ``fingerprint``: :func:`fingerprint` of the checkpoint when it was written (to prove it unchanged)
- ``profile``, ``scores`` (held-out identity / general scores measured in notebook 06), ``written``

Importing this module sets ``OMP_WAIT_POLICY=PASSIVE`` unless it is set (see the comment below).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from helpers import launching, models, paths, report
from helpers.errors import CourseError

# Threads that wait for each other should sleep, not spin: this notebook runs a background Web-UI and
# training processes next to the kernel, and on a small CPU spinning OpenMP threads then slow a 2-thread
# torch by up to 10x (measured). Set before torch loads; launched processes inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DATA_DIR = paths.ROOT / "data"
SELF_COGNITION = DATA_DIR / "self-cognition"
GENERAL_QUESTIONS = DATA_DIR / "general_questions.jsonl"
HELDOUT = DATA_DIR / "heldout.jsonl"
LATEST_FILE = "latest-self-cognition.json"
_GENERAL_FORMAT = 2  # bump when the way general answers are made changes: old caches are then not reused


# --- reading and writing the data ------------------------------------------------------------------


def read_jsonl(path) -> list[dict]:
    """The rows of a JSON-lines file."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(path, rows) -> Path:
    """Write rows as JSON lines, atomically (a temporary file renamed into place)."""
    return paths.write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def self_cognition_rows(folder=SELF_COGNITION) -> list[dict]:
    """Every row of the self-cognition folder (all its .jsonl files, in name order)."""
    files = sorted(Path(folder).glob("*.jsonl"))
    if not files:
        raise CourseError(f"{folder} holds no .jsonl file; the self-cognition data is missing.")
    return [row for path in files for row in read_jsonl(path)]


def general_questions(path=GENERAL_QUESTIONS) -> list[str]:
    return [row["query"] for row in read_jsonl(path)]


def heldout(path=HELDOUT, kind: str | None = None) -> list[dict]:
    """The held-out rows, optionally only those of one ``kind`` (identity or general)."""
    rows = read_jsonl(path)
    return [r for r in rows if kind is None or r["kind"] == kind]


def pair(value, what: str = "value") -> tuple[str, str]:
    """A (zh, en) pair from a string or a list of one or two strings, as SWIFT reads --model_name."""
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, (list, tuple))
        or not 1 <= len(value) <= 2
        or not all(isinstance(v, str) and v.strip() for v in value)
    ):
        raise CourseError(
            f"{what} = {value!r} must be a name or a [中文, English] list of two non-empty names."
        )
    return (value[0], value[-1])


def fill(row: dict, name, author) -> dict:
    """A row with {{NAME}} / {{AUTHOR}} replaced as SWIFT does: the zh value for tag zh, else the en value."""
    name, author = pair(name, "MODEL_NAME"), pair(author, "MODEL_AUTHOR")
    index = 0 if row.get("tag") == "zh" else 1
    out = dict(row)
    for key in ("query", "response"):
        out[key] = row[key].replace("{{NAME}}", name[index]).replace("{{AUTHOR}}", author[index])
    return out


def training_questions() -> set[str]:
    """Every question that appears in the project's training data."""
    return {row["query"] for row in self_cognition_rows()} | set(general_questions())


def _questions_of(rows) -> set[str]:
    """The user turns of dataset rows, in either layout SWIFT reads (``query`` or ``messages``)."""
    found = set()
    for row in rows:
        if row.get("query"):
            found.add(row["query"])
        for message in row.get("messages") or []:
            if message.get("role") == "user":
                found.add(message["content"])
    return found


def hub_questions(dataset: str, name, author) -> set[str]:
    """Every user question of a hub dataset (all its rows, whatever ``#N`` a command samples), loaded the way
    ``swift sft`` loads it (swift/dataset/loader.py, load_dataset), placeholders filled: from the hub, or
    from its cache."""
    from swift.dataset import load_dataset

    train, _ = load_dataset([dataset.split("#")[0]], model_name=list(name), model_author=list(author))
    return _questions_of(train)


def leaked_heldout(sources=None, name=("小课", "XiaoKe"), author=("并行训练营", "Parallel Training Camp")) -> list[str]:
    """Held-out questions that also appear in the data a run trains on (should be none). ``sources``: the
    ``--dataset`` values of that run (local folders or files of this project, hub ids); None: the course's
    own training data (self-cognition rows and the general questions)."""
    if sources is None:
        seen = training_questions()
    else:
        seen = set()
        for source in sources:
            path = Path(str(source).split("#")[0])
            if path.is_dir():
                seen |= {fill(row, name, author)["query"] for row in self_cognition_rows(path)}
            elif path.is_file():
                seen |= _questions_of(read_jsonl(path))
            else:
                seen |= hub_questions(str(source), name, author)
    return [row["query"] for row in heldout() if row["query"] in seen]


def identity_part(sources) -> tuple:
    """The self-cognition sources of a ``--dataset`` mix (the course's folder, or the hub's
    ``swift/self-cognition``): the same identity data, without the general data beside it."""
    part = tuple(s for s in sources if Path(str(s).split("#")[0]).name == "self-cognition")
    if not part:
        raise CourseError(f"no self-cognition data among {list(map(str, sources))}.")
    return part


# --- asking a model: SWIFT's inference engine, greedy, in batches --------------------------------------

_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*(?=\s|$)|[。！？][\"”’」』）]*")


def trim_to_sentence(text: str) -> str | None:
    """``text`` up to its last complete sentence; None when it holds no complete sentence."""
    text = text.strip()
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    return text[: ends[-1]].strip() if ends else None


def messages(question: str, system=None) -> list[dict]:
    """One question as chat messages, after the system prompt when there is one."""
    return [
        *([{"role": "system", "content": system}] if system is not None else []),
        {"role": "user", "content": question},
    ]


def pad_right(sequences) -> dict:
    """Token id lists as one batch, padded on the right with an attention mask: each sequence keeps the
    positions it has alone."""
    import torch

    width = max(len(ids) for ids in sequences)
    input_ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


class _EngineClosed(SystemExit):
    """Ends SWIFT's inference worker thread when its Chat is closed (see :meth:`Chat.close`)."""


@dataclass
class Answer:
    text: str
    finished: bool  # True: the model ended its turn itself; False: cut at the token limit


class Chat:
    """SWIFT's ``TransformersEngine``: the base model, or the base model with one LoRA adapter.

    ``Chat(info)`` answers with the base model, ``Chat(info, adapter=path)`` with the adapter in ``path``
    loaded through SWIFT (as ``swift infer --adapters path`` would). ``close()`` frees the model.
    """

    def __init__(
        self,
        info: models.ModelInfo,
        device: str = "cpu",
        adapter=None,
        max_batch_size: int = 32,
        system=None,
        dtype: str | None = None,
    ):
        import torch
        from swift import TransformersEngine

        adapters = None
        if adapter is not None:
            check_adapter(adapter)
            adapters = [str(Path(adapter).resolve())]
        self.info, self.adapter = info, adapter
        self.system = system  # the system prompt of every question: the one the model was trained with
        cuda = device.startswith("cuda")
        self.engine = TransformersEngine(
            info.path,
            adapters=adapters,
            model_type=info.model_type,
            template_type=info.template,
            torch_dtype=getattr(torch, dtype) if dtype else (torch.bfloat16 if cuda else torch.float32),
            max_batch_size=max_batch_size,
            # one GPU: left to itself, SWIFT spreads a model over every GPU this kernel sees (device_map
            # "auto" when there are more GPUs than processes: swift/model/utils.py, get_default_device_map)
            device_map="cuda:0" if cuda else None,
        )
        models.hold(self.engine.model)

    def ask(self, questions, max_tokens: int = 48) -> list[Answer]:
        """Greedy answers, one per question, each ended by the model or cut at ``max_tokens``."""
        from swift import InferRequest, RequestConfig

        if self.engine is None:
            raise CourseError("this Chat was closed; create a new one.")
        replies = self.engine.infer(
            [InferRequest(messages=messages(q, self.system)) for q in questions],
            RequestConfig(max_tokens=max_tokens, temperature=0),
            use_tqdm=False,
        )
        return [
            Answer(r.choices[0].message.content.strip(), r.choices[0].finish_reason == "stop")
            for r in replies
        ]

    def answer_loss(self, questions, answers, batch: int = 16) -> list[float]:
        """Mean negative log-likelihood per token (nats) of each given answer to its question: how
        likely this model still finds an answer. Forward passes only, ``batch`` answers at a time (padded
        on the right, so each answer's positions are the same as alone); an empty answer gives NaN."""
        import torch
        from swift import InferRequest

        if self.engine is None:
            raise CourseError("this Chat was closed; create a new one.")
        template, model = self.engine.template, self.engine.model
        pairs = []  # (prompt ids, answer ids)
        for question, answer in zip(questions, answers, strict=True):
            prompt = template.encode(InferRequest(messages=messages(question, self.system)))["input_ids"]
            pairs.append((prompt, template.tokenizer(_text(answer), add_special_tokens=False)["input_ids"]))
        losses = []
        with torch.inference_mode():
            for first in range(0, len(pairs), batch):
                chunk = pairs[first : first + batch]
                padded = {k: v.to(model.device) for k, v in pad_right([p + r for p, r in chunk]).items()}
                logits = model(**padded).logits.float()
                for row, (prompt, reply) in enumerate(chunk):
                    if not reply:  # an empty answer has no tokens to score
                        losses.append(float("nan"))
                        continue
                    predicted = logits[row, len(prompt) - 1 : len(prompt) + len(reply) - 1]
                    target = torch.tensor(reply, device=predicted.device)
                    losses.append(torch.nn.functional.cross_entropy(predicted, target).item())
        return losses

    @contextlib.contextmanager
    def adapter_on(self, adapter):
        """Within the block, the engine's model carries the LoRA ``adapter`` (loaded with peft, removed
        again after): one base model serves many adapters, without loading it again for each."""
        from peft import PeftModel

        check_adapter(adapter)
        base = self.engine.model
        self.engine.model = PeftModel.from_pretrained(base, str(adapter))
        try:
            yield self
        finally:
            self.engine.model = self.engine.model.unload()

    def close(self) -> None:
        """Free the model (a GPU needs the memory back before training). A streamed answer started SWIFT's
        worker thread (``TransformersEngine._start_infer_worker``), which loops for ever holding the engine
        and so the model: it is ended first, by making its next fetch raise :class:`_EngineClosed`, which
        the thread's exception hook drops without keeping its traceback."""
        worker = getattr(self.engine, "_task_thread", None)
        if worker is not None and worker.is_alive():
            import threading

            def stop():
                raise _EngineClosed

            def hook(args, previous=threading.excepthook):  # nothing to report, and no traceback kept
                if not issubclass(args.exc_type, _EngineClosed):  # that would hold the engine alive
                    previous(args)

            threading.excepthook, before = hook, threading.excepthook
            try:
                self.engine._fetch_infer_requests = stop
                worker.join(timeout=10)
            finally:
                threading.excepthook = before
        self.engine = None
        free_memory()

    def __enter__(self) -> Chat:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def quiet_repeats(expected=("dataset_sample:",)):
    """For in-process runs repeated many times: within the block, datasets' and transformers' progress
    bars are hidden, and SWIFT's log records that start with one of ``expected`` are dropped (warnings
    the lesson has explained, e.g. ``path#N`` repeating a file); every other warning still shows."""
    import logging

    import datasets
    import transformers

    def keep(record) -> bool:
        return not str(record.getMessage()).startswith(tuple(expected))

    swift = logging.getLogger("swift")
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    swift.addFilter(keep)
    try:
        yield
    finally:
        swift.removeFilter(keep)
        datasets.enable_progress_bars()
        transformers.utils.logging.enable_progress_bar()


# --- general data: the base model's own answers, made once and cached -------------------------------


def model_key(info: models.ModelInfo) -> str:
    """A short key naming one model build: its directory's files and sizes, and its config."""
    digest = hashlib.sha256(info.name.encode())
    folder = Path(info.path)
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if path.is_file():
                digest.update(f"{path.name}:{path.stat().st_size}".encode())
        if (folder / "config.json").is_file():
            digest.update((folder / "config.json").read_bytes())
    else:
        digest.update(info.path.encode())
    return digest.hexdigest()[:12]


def _build_once(target: Path, build) -> bool:
    """Make ``target`` with ``build(tmp)`` unless it is complete (it has stats.json, written last).

    The build writes into a temporary sibling renamed into place at the end, under a lock, so an
    interrupted build leaves nothing that looks finished. Returns True when it built.
    """
    if (target / "stats.json").is_file():
        return False
    with paths.locked(target):
        if (target / "stats.json").is_file():
            return False
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True


@dataclass
class GeneralData:
    path: Path  # the JSON-lines file SWIFT trains on (query, response)
    rows: list[dict]
    asked: int  # questions put to the model
    finished: int  # answers that ended at the end-of-turn token
    trimmed: int  # answers cut at the token limit, trimmed back to the last whole sentence
    dropped: int  # answers without one whole sentence: left out
    cached: bool  # True: read from the cache, nothing generated


def general_answers(chat: Chat, questions=None, max_tokens: int = 48) -> GeneralData:
    """The base model's greedy answers to ``questions``, generated once per model and cached.

    An answer is kept whole when the model ended its turn, trimmed to its last complete sentence when
    it was cut at ``max_tokens``, and left out when it has no complete sentence: training on answers
    that stop mid-sentence would teach the model to stop mid-sentence.
    """
    questions = list(questions if questions is not None else general_questions())
    recipe = json.dumps([_GENERAL_FORMAT, questions, max_tokens, chat.info.template], ensure_ascii=False)
    key = f"{model_key(chat.info)}-{hashlib.sha256(recipe.encode()).hexdigest()[:8]}"
    target = paths.models_dir() / "general-answers" / key
    made = []

    def build(out: Path) -> None:
        answers = chat.ask(questions, max_tokens=max_tokens)
        rows, stats = [], {"finished": 0, "trimmed": 0, "dropped": 0}
        for question, answer in zip(questions, answers, strict=True):
            text = answer.text if answer.finished else trim_to_sentence(answer.text)
            kind = "finished" if answer.finished else ("trimmed" if text else "dropped")
            stats[kind] += 1
            if text:
                rows.append({"query": question, "response": text})
        write_jsonl(out / "general.jsonl", rows)
        (out / "stats.json").write_text(
            json.dumps({"asked": len(questions), **stats, "model": chat.info.name})
        )
        made.append(True)

    _build_once(target, build)
    stats = json.loads((target / "stats.json").read_text())
    return GeneralData(
        path=target / "general.jsonl",
        rows=read_jsonl(target / "general.jsonl"),
        asked=stats["asked"],
        finished=stats["finished"],
        trimmed=stats["trimmed"],
        dropped=stats["dropped"],
        cached=not made,
    )


# --- SWIFT arguments: one plan, as CLI flags or as SftArguments keywords ----------------------------


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

    def but(self, **changes) -> SftPlan:
        """A copy with some fields changed (``plan.but(nproc=2, per_device_batch=2)``)."""
        return replace(self, **changes)

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
            # (swift/trainers/mixin.py; notebook 09, section 1)
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


# --- the seed's recipe: the gpu profile's run, on 1 to 8 GPUs ---------------------------------------

# SWIFT's self-cognition best practice for Qwen2.5-7B-Instruct on one 24 GB GPU (the seed links to it):
# hub data, one epoch, LoRA rank 8 / alpha 32 on every linear layer, lr 1e-4 with 5% warm-up,
# per-device batch 1 accumulated to a global batch of 16, sequences up to 2048 tokens, bf16 weights,
# gradient checkpointing on, an explicit system prompt.
HUB_DATASETS = (
    "AI-ModelScope/alpaca-gpt4-data-zh#500",
    "AI-ModelScope/alpaca-gpt4-data-en#500",
    "swift/self-cognition#500",
)
SYSTEM = "You are a helpful assistant."  # used in training and in every question asked afterwards
SEED_GLOBAL_BATCH = 16
DATASET_CHOICES = ("hub", "course")  # DATASETS = "hub": the seed's mix; "course": data/ in this repository


def choose_datasets(value, profile) -> str:
    """``DATASETS``: "hub" (the seed's mix, downloaded) or "course" (data/ here); None: hub on gpu only."""
    from helpers.profiles import check_choice

    chosen = value if value is not None else ("hub" if profile.name == "gpu" else "course")
    check_choice("DATASETS", chosen, DATASET_CHOICES)
    if chosen == "hub" and profile.name != "gpu":
        raise CourseError(
            f"DATASETS = 'hub' downloads the seed's 1,500 rows, which only the gpu profile trains on; "
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


def seed_recipe(
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
    """The seed's ``swift sft`` on ``nproc`` GPUs (one epoch unless ``steps`` is given), and the sentence
    :func:`nearest_accumulation` says when the global batch had to change. The defaults are the seed's;
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


def sft_process(plan: SftPlan, script, timeout: float = 3600, env=None) -> dict:
    """``sft_main(SftArguments(**plan.kwargs()))`` in a process of its own: ``script`` (notebook 06 writes
    it) reads the keywords from a JSON file and writes what sft_main returned. When the process ends the GPU
    has every byte of the run back, which a run inside the kernel, freed by garbage collection, does not
    promise (SWIFT documents a 22 GB peak for a 7B LoRA). Returns the script's result."""
    import sys

    folder = paths.run_dir("sft-from-python", f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}")
    kwargs_file, result_file = folder / "kwargs.json", folder / "result.json"
    kwargs_file.write_text(json.dumps(plan.kwargs(), ensure_ascii=False, indent=1))
    launch = launching.Launch(
        [sys.executable, script, kwargs_file, result_file], env={**plan.env(), **(env or {})},
        label=f"sft_main {Path(plan.output_dir).parent.name}", timeout=timeout,
    )  # fmt: skip
    launching.run(launch, show=False)
    return json.loads(result_file.read_text())


def shell_command(plan: SftPlan, subcommand: str = "sft", env=None) -> str:
    """The run as a shell command to type: its environment (``env`` first), ``swift sft``, one option per
    line; ``launching.swift_shell`` runs exactly this text."""
    env = {**(env or {}), **plan.env()}
    if plan.nproc > 1:
        env["NPROC_PER_NODE"] = str(plan.nproc)
    return launching.swift_text(subcommand, plan.cli(), env)


# --- SWIFT's logs: logging.jsonl (and trainer_state.json) as curves -----------------------------------


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
    )


# --- adapters: exist, load, untouched -----------------------------------------------------------------


def check_adapter(checkpoint) -> dict:
    """Stop unless ``checkpoint`` is a complete LoRA adapter; returns its config."""
    checkpoint = Path(checkpoint)
    config_file = checkpoint / "adapter_config.json"
    weights = checkpoint / "adapter_model.safetensors"
    if not config_file.is_file() or not weights.is_file():
        raise CourseError(
            f"{checkpoint} is not a complete LoRA adapter (adapter_config.json + adapter_model.safetensors)."
        )
    config = json.loads(config_file.read_text())
    if config.get("peft_type") != "LORA":
        raise CourseError(f"{checkpoint} holds a {config.get('peft_type')} adapter, not LoRA.")
    return config


def adapter_tensors(checkpoint) -> int:
    """How many tensors the adapter file holds (read with safetensors, without loading a model)."""
    from safetensors import safe_open

    with safe_open(str(Path(checkpoint) / "adapter_model.safetensors"), "pt") as handle:
        return len(list(handle.keys()))


def fingerprint(folder) -> str:
    """A hash of every file's name and content in ``folder``: equal fingerprints, untouched folder."""
    digest = hashlib.sha256()
    folder = Path(folder)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def latest_path() -> Path:
    return paths.outputs_dir() / LATEST_FILE


def save_latest(profile: str, checkpoint, info: models.ModelInfo, name, author, **extra) -> Path:
    """Record the adapter notebook 07 should use under ``profile``, atomically (keys: module docstring)."""
    check_adapter(checkpoint)
    record = {
        "checkpoint": str(Path(checkpoint).resolve()),
        "model": info.path,
        "model_type": info.model_type,
        "hub_id": info.hub_id,
        "template": info.template,
        "model_name": list(pair(name, "MODEL_NAME")),
        "model_author": list(pair(author, "MODEL_AUTHOR")),
        "fingerprint": fingerprint(checkpoint),
        "profile": profile,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **extra,
    }
    path = latest_path()
    with paths.locked(path):
        records = json.loads(path.read_text()) if path.is_file() else {}
        records[profile] = record
        paths.write_atomic(path, json.dumps(records, indent=1, ensure_ascii=False))
    return path


def load_latest(profile: str) -> dict | None:
    """The record :func:`save_latest` wrote for ``profile``, or None when there is none yet."""
    path = latest_path()
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get(profile)


def untouched(record: dict | None) -> bool:
    """True unless the adapter ``record`` describes still exists and has changed since it was recorded."""
    if record is None or not Path(record["checkpoint"]).is_dir():
        return True
    return fingerprint(record["checkpoint"]) == record["fingerprint"]


def free_memory() -> None:
    """Collect what Python no longer references and hand cached GPU memory back to the driver, so that the
    next model (or a ``swift`` process) can have it: PyTorch's allocator keeps freed blocks otherwise."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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


def short(text, limit: int = 90) -> str:
    """One line, at most ``limit`` characters (for tables)."""
    text = " ".join(_text(text).replace("\ufffd", "").split())  # no half characters cut at a token limit
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- scoring answers on the held-out questions ---------------------------------------------------------


def names_in(text: str, names) -> bool:
    """True when ``text`` contains any of ``names`` (case-insensitive)."""
    folded = text.casefold()
    return any(n.casefold() in folded for n in names)


def contains_expected(text: str, expected) -> bool:
    """True when ``text`` holds one of the expected words (whole words for Latin letters and digits)."""
    for word in expected:
        if re.fullmatch(r"[\w ]+", word, re.ASCII):
            if re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", text, re.IGNORECASE | re.ASCII):
                return True
        elif word in text:
            return True
    return False


# Identities a self-cognition answer must not claim: the base models' own and other assistants'.
OTHER_IDENTITIES = (
    "SmolLM", "Hugging Face", "HuggingFace", "Qwen", "通义", "千问", "阿里", "Alibaba",
    "ChatGPT", "OpenAI", "GPT-4", "Llama", "Meta AI", "Claude", "Anthropic",
)  # fmt: skip


def right_answer(text: str, row: dict) -> bool:
    """A general answer is right when it holds an expected word and none of the row's wrong words."""
    return contains_expected(text, row["expect"]) and not contains_expected(text, row.get("wrong", ()))


def score(identity_rows, identity_answers, general_rows, general_answers, base_general, name, author) -> dict:
    """Held-out scores of one model, per language (zh, en), as fractions:

    - ``name_zh`` / ``name_en``: identity answers holding the name in the question's language;
    - ``author_zh`` / ``author_en``: answers to "who made/trained you" questions holding the author in
      the question's language ("XiaoKe Training Camp" is not "Parallel Training Camp");
    - ``no_false_claim_zh`` / ``_en``: identity answers claiming none of :data:`OTHER_IDENTITIES`;
    - ``general_kept``: of the general questions the base model answered right (expected word, no
      wrong word), the share the model still answers right without naming itself; per language too
      (``general_kept_zh`` / ``_en``, NaN where the base model got none right).
    """
    names, authors = pair(name, "MODEL_NAME"), pair(author, "MODEL_AUTHOR")
    out: dict = {}
    for k, tag in enumerate(("zh", "en")):
        mine = [
            (r, _text(a)) for r, a in zip(identity_rows, identity_answers, strict=True) if r["tag"] == tag
        ]
        about_author = [a for r, a in mine if r.get("asks") == "author"]
        out[f"name_{tag}"] = _share(names_in(a, [names[k]]) for _, a in mine)
        # the author as written: "a parallel training camp" is no author
        out[f"author_{tag}"] = _share(authors[k] in a for a in about_author)
        out[f"no_false_claim_{tag}"] = _share(not names_in(a, OTHER_IDENTITIES) for _, a in mine)
    right = [
        i
        for i, (r, base) in enumerate(zip(general_rows, base_general, strict=True))
        if right_answer(_text(base), r)
    ]
    kept = {i for i in right if right_answer(_text(general_answers[i]), general_rows[i])
            and not names_in(_text(general_answers[i]), names)}  # fmt: skip
    for tag in ("zh", "en", None):
        mine = [i for i in right if tag is None or general_rows[i].get("tag", "en") == tag]
        key = "general" if tag is None else f"general_{tag}"
        out[f"{key}_base_right"], out[f"{key}_kept_count"] = len(mine), sum(i in kept for i in mine)
        out[f"{key}_kept"] = _share(i in kept for i in mine)
    out["general_naming_itself"] = sum(names_in(_text(a), names) for a in general_answers)
    return out


def _share(hits) -> float:
    hits = list(hits)
    return sum(hits) / len(hits) if hits else float("nan")


SCORE_COLUMNS = {  # table heading: key in score()
    "name (zh)": "name_zh", "name (en)": "name_en", "author (zh)": "author_zh", "author (en)": "author_en",
    "no false claim (zh)": "no_false_claim_zh", "no false claim (en)": "no_false_claim_en",
}  # fmt: skip


def score_rows(by_model: dict) -> list[dict]:
    """One table row per model (``{label: score(...)}``): fractions as percentages, kept as counts."""
    rows = []
    for label, s in by_model.items():
        row = {"model": label, **{h: _percent(s[k]) for h, k in SCORE_COLUMNS.items()}}
        for key, heading in (("general", "general kept"), ("general_zh", "(zh)"), ("general_en", "(en)")):
            row[heading] = f"{s[key + '_kept_count']}/{s[key + '_base_right']}"
        row["general answers naming itself"] = s["general_naming_itself"]
        rows.append(row)
    return rows


def forgetting_summary(runs, key: str = "extra loss (nats/token)") -> dict:
    """``{data: {"each": [value per seed], "mean": ..., "spread": max - min}}`` from one row per run."""
    out: dict = {}
    for row in runs:
        out.setdefault(row["data"], {"each": []})["each"].append(row[key])
    for s in out.values():
        s["mean"] = sum(s["each"]) / len(s["each"])
        s["spread"] = max(s["each"]) - min(s["each"])
    return out


# What the cpu profile's fine-tune must reach on the held-out questions (notebooks 06 and 07 assert it).
GOALS = {"name_zh": 0.95, "name_en": 0.95, "author_zh": 0.9, "author_en": 0.9, "general_kept": 0.85}


def missed_goals(scores: dict, goals=None) -> list[str]:
    """The goals a model's :func:`score` misses, one readable line each (a NaN score misses its goal)."""
    return [
        f"{key} = {scores[key]:.2f}, below the goal {goal}"
        for key, goal in (goals or GOALS).items()
        if not scores[key] >= goal
    ]


def record_scores(scores: dict, prefix: str = "", note: str = "") -> None:
    """Put a model's per-language scores into the run report (fractions; general kept with its counts)."""
    for key in (*SCORE_COLUMNS.values(), "general_kept"):
        extra = (
            f"{scores['general_kept_count']}/{scores['general_base_right']} the base model got right"
            if key == "general_kept"
            else note
        )
        report.record(prefix + key, scores[key], note=extra)


def _percent(x: float) -> str:
    return "n/a" if x != x else f"{x:.0%}"


def _text(answer) -> str:
    return answer.text if isinstance(answer, Answer) else str(answer)


# --- the Web-UI: started in the background, checked, stopped -------------------------------------------


def http_status(url: str, timeout: float = 3.0) -> int | None:
    """The HTTP status ``url`` answers with, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 (localhost only)
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


GRADIO_GAVE_UP = "When localhost is not accessible"  # what Gradio raises when its check of its own page fails


class WebUI:
    """``swift web-ui`` on localhost in the background: ``start()``, ``wait()`` for HTTP 200, ``stop()``."""

    def __init__(self, port: int | None = None, lang: str = "en", host: str = "127.0.0.1", proxied: bool = False):
        self.host, self.port, self.lang = host, port or launching.free_port(), lang
        self.proxied = proxied  # served through a hosted notebook's port proxy: Gradio's links carry its path
        self.launch = None
        self.pids: set[int] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def proxy_path(self) -> str:
        """The page's path behind a hosted notebook's port proxy (jupyter-server-proxy): the server's base
        path (JupyterHub's ``JUPYTERHUB_SERVICE_PREFIX``, e.g. ``/user/ann/``), then ``proxy/<port>/``."""
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
        return f"/{prefix.strip('/')}/proxy/{self.port}/".replace("//", "/")

    def start(self) -> WebUI:
        argv = [
            "swift",
            "web-ui",
            "--lang",
            self.lang,
            "--server_name",
            self.host,
            "--server_port",
            self.port,
        ]
        # no usage statistics sent; BROWSER=true: gradio's "open a browser tab" does nothing
        env = {"GRADIO_ANALYTICS_ENABLED": "False", "BROWSER": "true"}
        if self.proxied:  # Gradio reads it (gradio/blocks.py), not SWIFT: the page's links then work behind the proxy
            env["GRADIO_ROOT_PATH"] = self.proxy_path
        self.launch = launching.Launch(argv, env=env, label="swift web-ui", cwd=paths.run_dir("webui"))
        self.launch.start()
        atexit.register(self.stop)  # never outlive the kernel, even if a later cell fails
        return self

    def _remember_processes(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.launch.proc.pid)
            self.pids |= {root.pid} | {p.pid for p in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def wait(self, timeout: float = 120) -> tuple[int, float]:
        """Poll until the page answers HTTP 200; returns (status, seconds). Stops everything on failure."""
        start, started_again = time.monotonic(), False
        while time.monotonic() - start < timeout:
            self._remember_processes()
            self.launch.drain(False, "")
            if self.launch.proc.poll() is not None:
                tail = "\n    ".join(self.launch.lines[-12:])
                self.stop()
                if GRADIO_GAVE_UP in tail and not started_again:
                    # Gradio asks its own page once it serves, and gives up after one 3-second timeout
                    # (gradio/networking.py, url_ok): a busy machine, not a broken set-up
                    print("swift web-ui: Gradio's check of its own page timed out (a busy machine); starting it once more.")
                    started_again = True
                    self.start()
                    continue
                raise launching.LaunchError(
                    f"swift web-ui exited with code {self.launch.proc.returncode}:\n    {tail}"
                )
            status = http_status(self.url)
            if status == 200:
                return status, time.monotonic() - start
            time.sleep(1)
        self.stop()
        raise launching.LaunchTimeout(
            f"swift web-ui did not answer {self.url} within {timeout:g} s; it was stopped."
        )

    def stop(self) -> int:
        """Stop the Web-UI and everything it started; returns how many of its processes are still alive (0)."""
        import psutil

        if self.launch is None or self.launch.proc is None:
            return 0
        self._remember_processes()
        launching.kill_tree(self.launch.proc.pid)
        self.launch.proc.wait(timeout=30)
        alive = []
        for pid in self.pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return len(alive)

    def __enter__(self) -> WebUI:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def chromium() -> str | None:
    """The headless browser used for screenshots, or None where none is installed."""
    from .browser import chromium

    return chromium()


def browse(url: str, *extra, timeout: float = 240) -> str:
    """Open ``url`` in headless Chromium, wait until its scripts have built the page, then do what
    ``extra`` asks: ``--dump-dom`` returns the page's HTML, ``--screenshot=PATH`` writes a 1280x900 PNG."""
    from .browser import Browser

    if chromium() is None:
        raise CourseError("no Chromium is installed; on Debian or Ubuntu: apt-get install -y chromium.")
    browser = Browser(timeout=timeout)
    try:
        loaded = browser.open(url)
        if loaded["status"] != 200:
            raise CourseError(f"Chromium could not open {url}: HTTP status {loaded['status']}.")
        browser.settle()
        shown = ""
        for flag in extra:
            if flag == "--dump-dom":
                shown = browser.html()
            elif flag.startswith("--screenshot="):
                browser.screenshot(flag.split("=", 1)[1])
            else:
                raise CourseError(f"browse() knows --dump-dom and --screenshot=PATH, not {flag}.")
        return shown
    finally:
        browser.close()


def webui_fields(flags) -> list[dict]:
    """The Web-UI training page's field for each of ``flags`` (names without ``--``), as SWIFT labels it
    in English and Chinese: read from the ``locale_dict`` tables in swift/ui/llm_train/*.py (parsed, not
    imported: importing would load gradio), where each field's id is the CLI argument it sets. Flags the
    page has no field for are left out."""
    import ast
    import importlib.util

    folder = Path(importlib.util.find_spec("swift").origin).parent / "ui" / "llm_train"
    labels: dict = {}
    for source in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
                "locale_dict"
            ]:
                try:
                    table = ast.literal_eval(node.value)
                except ValueError:  # a table built by code, not written out: not a page of fields
                    continue
                for key, entry in table.items():
                    if isinstance(entry, dict) and isinstance(entry.get("label"), dict):
                        labels.setdefault(key, entry["label"])
    return [
        {"flag": f"--{f}", "field (en)": labels[f]["en"], "字段 (zh)": labels[f]["zh"]}
        for f in flags
        if f in labels
    ]
