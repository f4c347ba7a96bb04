"""Asking a model (模型推理): SWIFT's inference engine in the kernel, and the base model's own general answers.

Asking a model (模型推理): SWIFT's inference engine, greedy, in batches, on one device; and the base model's
own answers to the general questions, made once and cached, that training mixes in against forgetting."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from helpers import models, paths
from helpers.errors import CourseError
from helpers.lora import check_adapter
from helpers.models import free_memory
from helpers.paths import read_jsonl, write_jsonl
from helpers.selfcog import general_questions

_GENERAL_FORMAT = 2  # bump when the way general answers are made changes: old caches are then not reused


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


def _with_adapter(model, adapter, load=None):
    """``model`` with the LoRA ``adapter`` loaded onto the model's own device. Left to itself peft puts the
    adapter's weights on cuda wherever a GPU is visible (peft/utils/other.py, infer_device), even for a model on
    the CPU, and so does SWIFT's engine given ``adapters=`` (swift/tuners/base.py, Swift.from_pretrained).
    ``load``: peft's ``PeftModel.from_pretrained`` (a model to unload again); by default SWIFT's loader."""
    if load is None:
        from swift import Swift

        load = Swift.from_pretrained
    return load(model, str(adapter), torch_device=str(next(model.parameters()).device))


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
        max_batch_size: int = 64,  # 60 identity questions in one batch: on 2 CPU cores, 10% faster than 32
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
            model_type=info.model_type,
            template_type=info.template,
            torch_dtype=getattr(torch, dtype) if dtype else (torch.bfloat16 if cuda else torch.float32),
            max_batch_size=max_batch_size,
            # one GPU, or none: left to itself (None), SWIFT spreads a model over every GPU this kernel sees (device_map
            # "auto" when there are more GPUs than processes: swift/model/utils.py, get_default_device_map), even
            # on the cpu profile of a machine that has GPUs
            device_map="cuda:0" if cuda else "cpu",
        )
        if adapters:  # given to the engine, SWIFT loads it with peft's own device choice: see _with_adapter
            self.engine.model = _with_adapter(self.engine.model, adapters[0])
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
            pairs.append(
                (prompt, template.tokenizer(answer_text(answer), add_special_tokens=False)["input_ids"])
            )
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
        self.engine.model = _with_adapter(base, adapter, PeftModel.from_pretrained)
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

    paths.build_folder(
        target, build, problem=lambda folder: None if (folder / "stats.json").is_file() else "unfinished"
    )
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


def one_line(text, limit: int = 90) -> str:
    """One line, at most ``limit`` characters (for tables)."""
    text = " ".join(
        answer_text(text).replace("\ufffd", "").split()
    )  # no half characters cut at a token limit
    return text if len(text) <= limit else text[: limit - 1] + "…"


def answer_text(answer) -> str:
    return answer.text if isinstance(answer, Answer) else str(answer)
