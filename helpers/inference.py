"""Merging and inference (模型合并 / 模型推理): the recorded adapter, swift export / infer, logits, sizes.

Notebook 10 takes the adapter notebook 09 recorded (:func:`recorded_adapter`), merges it into the base
model with ``swift export --merge_lora true`` (typed in its cell; :func:`model_text` fills in the model,
:func:`export_flags` keeps a copy of the flags for the gpu profile's commands), checks that the merged weights give
the logits the base model plus the adapter gives (:func:`prompt_batch`, :func:`logits`, :func:`largest_gap`),
asks questions with ``swift infer`` on a question file (:func:`write_questions`, typed in its cell with
:func:`infer_flags` as its copy, :func:`read_answers`) and with SWIFT's Python engine (``answering.Chat``, :func:`stream`), and compares
the answers (:func:`same_answers`); ``scoring.score`` scores them on the held-out questions.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import answering, launching, lora, models, paths, swiftcli
from helpers.errors import CourseError

QUESTIONS_FILE = "questions.jsonl"
ANSWERS_FILE = "answers.jsonl"


# --- the adapter notebook 09 recorded ---------------------------------------------------------------


def recorded_adapter(profile: str) -> dict:
    """The record notebook 09 wrote for ``profile``, checked: the adapter exists, is LoRA, is unchanged."""
    record = lora.load_latest(profile)
    if record is None:
        raise CourseError(
            f"no adapter is recorded for the {profile} profile in {lora.latest_path()}; "
            f"run notebook 09 first (make run PROFILE={profile} ONLY=09)."
        )
    checkpoint = Path(record["checkpoint"])
    if not checkpoint.is_dir():
        raise CourseError(
            f"the adapter notebook 09 recorded, {checkpoint}, is gone; "
            f"run notebook 09 again (make run PROFILE={profile} ONLY=09)."
        )
    lora.check_adapter(checkpoint)
    if not lora.untouched(record):
        raise CourseError(
            f"the adapter in {checkpoint} changed after notebook 09 recorded it; "
            f"run notebook 09 again (make run PROFILE={profile} ONLY=09)."
        )
    # The template SWIFT trained with, also where an older record lacks it (a hub model is given none)
    record["template"] = lora.trained_template(checkpoint, record.get("template"))
    return record


def base_model(record: dict) -> models.ModelInfo:
    """The base model the adapter was trained on, as SWIFT was given it."""
    return models.ModelInfo(
        name=record.get("hub_id") or Path(record["model"]).name,
        path=record["model"],
        source="recorded by notebook 09",
        model_type=record.get("model_type"),
        template=record.get("template"),
        hub_id=record.get("hub_id"),
    )


def merged_model(record: dict, folder) -> models.ModelInfo:
    """The merged model in ``folder``: same type and template as the base model."""
    return models.ModelInfo(
        name=f"{Path(record['model']).name} + adapter, merged",
        path=str(folder),
        source=f"swift export --merge_lora of {record['checkpoint']}",
        model_type=record.get("model_type"),
        template=record.get("template"),
    )


def _model_flags(info: models.ModelInfo) -> list[str]:
    """--model (and --model_type / --template where SWIFT cannot tell them from the folder).

    ``--check_model`` is a training flag only: ``swift export`` and ``swift infer`` refuse it.
    """
    flags = ["--model", str(info.swift_model)]
    if info.local and not info.hub_id:  # SWIFT runs no code shipped in the folder (models.local_code_only)
        flags += ["--external_plugins", str(models.LOCAL_CODE_ONLY)]
    if info.model_type:
        flags += ["--model_type", info.model_type]
    if info.template:
        flags += ["--template", info.template]
    return flags


def model_text(info: models.ModelInfo) -> str:
    """What follows ``--model`` in a typed ``swift export`` or ``swift infer``: the model (a folder relative
    to the repository, or its hub id), then the flags SWIFT needs to be told about it."""
    return swiftcli.words(_model_flags(info)[1:])


def saved_dtype(model_dir) -> str | None:
    """The dtype a model directory's weights were saved in (config.json ``dtype``, formerly ``torch_dtype``)."""
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    return data.get("dtype") or data.get("torch_dtype")


def export_flags(record: dict, output_dir, dtype: str | None = None) -> list[str]:
    """The arguments after ``swift export`` that merge the recorded adapter into ``output_dir``, in ``dtype``:
    by default the dtype notebook 09 trained in (its record), else the base model's own."""
    output_dir = Path(output_dir)
    if output_dir.exists():
        raise CourseError(f"{output_dir} already exists; merge into a new folder (paths.new_output_dir).")
    return [
        "--adapters",
        str(record["checkpoint"]),
        *_model_flags(base_model(record)),
        "--merge_lora",
        "true",
        "--torch_dtype",  # the dtype of training, so that the merged model is the one the adapter was trained on
        dtype or record.get("dtype") or saved_dtype(base_model(record).path) or "float32",
        "--output_dir",
        str(output_dir),
    ]


def infer_flags(
    info: models.ModelInfo,
    questions,
    result,
    max_tokens: int,
    dtype: str = "float32",
    batch: int = 64,
    system=None,
):
    """The arguments after ``swift infer``: greedy answers to a question file, written to ``result``, in
    ``dtype`` (the profile's); ``system``: the system prompt the model was trained with (None: the template's
    own default)."""
    return [
        *_model_flags(info),
        "--torch_dtype",
        dtype,
        "--val_dataset",
        str(questions),
        "--result_path",
        str(result),
        "--max_new_tokens",
        str(max_tokens),
        "--temperature",
        "0",
        "--max_batch_size",
        str(batch),
        "--stream",
        "false",
        *(["--system", system] if system is not None else []),
    ]


def gpu_commands(
    model: models.ModelInfo | str, system: str | None, max_tokens: int, dtype: str = "bfloat16"
) -> dict[str, str]:
    """The gpu profile's ``swift export`` and ``swift infer`` for ``model`` as text to copy, on one GPU (the
    first this process may use, ``launching.visible_gpus``). ``model``: the base model as notebook 09 gave it to
    SWIFT (a hub model by its id, as the command that runs names it, never its cache folder), or a hub id.

    Both are one process. With several GPUs visible, one process spreads the model over all of them
    (swift/model/utils.py, ``get_default_device_map``: "auto" when more devices than processes), so the
    commands keep one GPU visible: a 7B model in bf16 (about 15 GB) fits one 24 GB card. The checkpoint
    and version folders are placeholders for the ones notebook 09 recorded.
    """
    if isinstance(model, str):
        model = models.ModelInfo(name=model, path=model, source="ModelScope", hub_id=model)
    record = {"checkpoint": "build/outputs/self-cognition-ddp/vN/checkpoint-M", "model": model.path,
              "hub_id": model.hub_id, "model_type": model.model_type, "template": model.template, "dtype": dtype}  # fmt: skip
    merged = "build/outputs/self-cognition-merged/vN/model"
    run = Path(merged).parent
    infer = infer_flags(
        merged_model(record, merged),
        run / QUESTIONS_FILE,
        run / ANSWERS_FILE,
        max_tokens,
        dtype,
        system=system,
    )
    env = launching.gpu_env(1)
    return {
        "export": swiftcli.swift_text("export", export_flags(record, merged), env),
        "infer": swiftcli.swift_text("infer", infer, env),
    }


# --- the merged folder's chat template ------------------------------------------------------------------

# SWIFT's ChatML templates (``chatml``, the cpu model's; ``qwen2_5``, the gpu model's) write every turn as
# <|im_start|>role\ncontent<|im_end|>\n (swift/template/templates/utils.py, ChatmlTemplateMeta). A model
# folder's own template may add a system message of its own when none is given (SmolLM2's names itself
# SmolLM, Qwen2.5's names itself Qwen): the merged model would then meet its users with an identity it was
# not trained with.
CHATML_TURN = "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
CHATML_TEMPLATES = ("chatml", "qwen", "qwen2_5")  # SWIFT template types built on ChatmlTemplateMeta


def training_chat_template(system: str | None) -> str:
    """A transformers chat template (Jinja) that writes the prompt a ChatML model was trained on: every
    turn as SWIFT writes it, ``system`` as the system message when none is given (None: no system message,
    as SWIFT's ``chatml`` template), and the assistant's turn opened by ``add_generation_prompt``."""
    default = ""
    if system is not None:
        quoted = json.dumps(system, ensure_ascii=False)  # a Jinja string literal
        default = (
            "{%- if messages[0]['role'] != 'system' %}"
            f"{{{{ '<|im_start|>system\\n' + {quoted} + '<|im_end|>\\n' }}}}"
            "{%- endif %}"
        )
    return (
        default
        + "{%- for message in messages %}" + CHATML_TURN + "{%- endfor %}"
        + "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    )


def prompt_system(template: str | None, system: str | None) -> str | None:
    """The system message SWIFT's ``template`` writes into a prompt that has none: ``system`` (``--system``),
    else the template's own default (``TEMPLATE_MAPPING[template].default_system``: None for ``chatml``,
    "You are Qwen, created by Alibaba Cloud. ..." for ``qwen2_5``; swift/template/base.py, ``_get_system``).
    An unknown template (None) gives ``system``."""
    if system is not None or template is None:
        return system
    from swift.template.register import TEMPLATE_MAPPING

    return TEMPLATE_MAPPING[template].default_system


def write_training_template(folder, template: str, system: str | None) -> Path:
    """Make ``folder``'s chat template the one the model was trained with (SWIFT ``template``, a ChatML
    one, and ``system``, None meaning the template's own default as SWIFT used it): ``chat_template.jinja``
    rewritten, and no second template left in ``tokenizer_config.json``. Returns the template file."""
    if template not in CHATML_TEMPLATES:
        raise CourseError(
            f"the template {template!r} is not one of SWIFT's ChatML templates {CHATML_TEMPLATES}; "
            "write its chat template by hand."
        )
    system = prompt_system(template, system)  # no --system: SWIFT trained with its template's default
    folder = Path(folder)
    config = folder / "tokenizer_config.json"
    if config.is_file():
        settings = json.loads(config.read_text(encoding="utf-8"))
        if settings.pop("chat_template", None) is not None:
            paths.write_atomic(config, json.dumps(settings, indent=2, ensure_ascii=False))
    target = folder / "chat_template.jinja"
    paths.write_atomic(target, training_chat_template(system))
    return target


# --- files: question file in, answers out, sizes on disk -----------------------------------------------


def write_questions(path, questions) -> Path:
    """A question file for ``swift infer --val_dataset``: one ``{"query": ...}`` per line."""
    return paths.write_jsonl(path, [{"query": q} for q in questions])


def read_answers(path, questions) -> list[str]:
    """The answers in a ``swift infer`` result file, in the order of ``questions``."""
    path = Path(path)
    if not path.is_file():
        raise CourseError(f"{path} does not exist; did swift infer finish?")
    by_question = {}
    for row in paths.read_jsonl(path):
        users = [m["content"] for m in row.get("messages", []) if m.get("role") == "user"]
        if users:
            by_question[users[-1]] = row["response"].strip()
    missing = [q for q in questions if q not in by_question]
    if missing:
        raise CourseError(f"{path} holds no answer to {len(missing)} question(s), the first: {missing[0]!r}.")
    return [by_question[q] for q in questions]


WEIGHT_SUFFIXES = (".safetensors", ".bin")


def _folder(folder) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        raise CourseError(f"{folder} is not a folder.")
    return folder


def folder_bytes(folder) -> int:
    """Bytes of every file in ``folder`` and below, links followed, each real file once: what copying it takes."""
    return paths.size_of(_folder(folder))


def _is_weight_file(path: Path) -> bool:
    return path.suffix in WEIGHT_SUFFIXES and path.name != "training_args.bin"


def weight_bytes(folder) -> int:
    """Bytes of the weight files (``*.safetensors``, ``*.bin``) directly in ``folder``, links followed.

    Stops with one sentence when there is none: a model or adapter folder without weights is incomplete,
    and its 0 bytes would only turn up later as a division by zero.
    """
    folder = _folder(folder)
    total = sum(size for _, size in paths.real_files(folder, recursive=False, keep=_is_weight_file))
    if not total:
        raise CourseError(
            f"{folder} holds no weight file (*.safetensors or *.bin, links followed); "
            "give a complete model or adapter folder."
        )
    return total


# --- logits: base + adapter against the merged model -----------------------------------------------------


def prompt_batch(template, questions, system=None) -> dict:
    """The questions encoded by SWIFT's chat ``template`` (an engine's ``.template``), padded on the right,
    with an attention mask: the prompts exactly as SWIFT's engine builds them."""
    from swift import InferRequest

    return answering.pad_right(
        [template.encode(InferRequest(messages=answering.messages(q, system)))["input_ids"] for q in questions]
    )


def logits(model, batch):
    """The model's logits for ``batch`` in float32, on the CPU (no gradients)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(**{k: v.to(device) for k, v in batch.items()}).logits
    return out.float().cpu()


def largest_gap(a, b, mask) -> float:
    """The largest absolute difference between two logit tensors at the real (unpadded) tokens."""
    if a.shape != b.shape:
        raise CourseError(f"the logits have different shapes, {tuple(a.shape)} and {tuple(b.shape)}.")
    keep = mask.bool()
    return float((a[keep] - b[keep]).abs().max())


# --- streaming: one answer, piece by piece --------------------------------------------------------------


def stream(chat: answering.Chat, question: str, max_tokens: int = 48, out=print) -> list[str]:
    """Ask ``question`` with streaming output: each piece is shown as it arrives; returns the pieces."""
    from swift import InferRequest, RequestConfig

    if chat.engine is None:
        raise CourseError("this Chat was closed; create a new one.")
    [chunks] = chat.engine.infer(
        [InferRequest(messages=answering.messages(question, chat.system))],
        RequestConfig(max_tokens=max_tokens, temperature=0, stream=True),
        use_tqdm=False,
    )
    pieces = []
    for chunk in chunks:
        if chunk is None or not chunk.choices:
            continue
        piece = chunk.choices[0].delta.content or ""
        if piece:
            pieces.append(piece)
            out(piece, end="", flush=True)
    out()
    return pieces


# --- comparing answers -------------------------------------------------------------------------------


def same_answers(a, b) -> int:
    """How many answers of two lists are the same text."""
    return sum(answering.answer_text(x).strip() == answering.answer_text(y).strip() for x, y in zip(a, b, strict=True))
