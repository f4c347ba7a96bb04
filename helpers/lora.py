"""A trained LoRA adapter: checked, counted, fingerprinted, and recorded for notebook 10.

The adapter notebook 10 should use is recorded in ``build/outputs/latest-self-cognition.json``, one
record per profile (``{"cpu": {...}, "smoke": {...}}``: a smoke test never replaces the cpu adapter).
:func:`save_latest` writes it atomically under a lock; ``load_latest(profile.name)`` reads one record:

- ``checkpoint``: the LoRA checkpoint directory (adapter_config.json, adapter_model.safetensors)
- ``model``, ``model_type``: the base model as SWIFT was given it (``--model`` ...), and ``hub_id`` when it
  came from ModelScope (``--model`` then names the id)
- ``template``: the chat template SWIFT trained with, as its ``args.json`` names it (:func:`trained_template`;
  SWIFT picks one from the model when no ``--template`` is given, e.g. ``qwen2_5`` for a hub Qwen2.5)
- ``model_name``, ``model_author``: the [zh, en] pairs used for the placeholders
- ``fingerprint``: :func:`fingerprint` of the checkpoint when it was written (to prove it unchanged)
- ``profile``, ``scores`` (held-out identity / general scores measured in notebook 09), ``written``
- ``goals``: the goals notebook 09 held this adapter to (``scoring.Goals.as_record``: the values, whether a run
  has measured them, and where they came from: :data:`scoring.GOALS` on cpu, ``GPU_GOALS`` for the original tutorial's
  recipe on a GPU, reported only for a short run), which notebook 10 holds the merged model to
  (``scoring.recorded_goals``); a record written before this may hold the values alone, or None
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

from helpers import models, paths
from helpers.errors import CourseError
from helpers.selfcog import zh_en

LATEST_FILE = "latest-self-cognition.json"


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


def adapter_parameters(checkpoint) -> int:
    """How many numbers the adapter file holds, summed from its tensors' shapes (none of them loaded)."""
    from safetensors import safe_open

    with safe_open(str(Path(checkpoint) / "adapter_model.safetensors"), "pt") as handle:
        return sum(math.prod(handle.get_slice(key).get_shape()) for key in handle.keys())


def fingerprint(folder) -> str:
    """A hash of every file's name and content in ``folder``: equal fingerprints, untouched folder."""
    digest = hashlib.sha256()
    folder = Path(folder)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def trained_template(checkpoint, given: str | None = None) -> str | None:
    """The chat template SWIFT trained ``checkpoint`` with: ``template`` in the ``args.json`` SWIFT saved in the
    checkpoint, or in its run folder, or ``given`` (the ``--template`` it was given) where there is none.

    ``swift sft`` writes its arguments to ``<output_dir>/args.json`` once they are resolved
    (``BaseArguments.save_args``), with ``template`` set to the template it chose from the model when none was
    given (``TemplateArguments.__post_init__``: ``self.template = self.template_meta.template_type``), and
    copies that file into every checkpoint it saves (``SwiftMixin._save``, swift/trainers/mixin.py)."""
    checkpoint = Path(checkpoint)
    for folder in (checkpoint, checkpoint.parent):
        args = folder / "args.json"
        if args.is_file():
            return json.loads(args.read_text(encoding="utf-8")).get("template") or given
    return given


def latest_path() -> Path:
    return paths.outputs_dir() / LATEST_FILE


def save_latest(profile: str, checkpoint, info: models.ModelInfo, name, author, **extra) -> Path:
    """Record the adapter notebook 10 should use under ``profile``, atomically (keys: module docstring)."""
    check_adapter(checkpoint)
    record = {
        "checkpoint": str(Path(checkpoint).resolve()),
        "model": info.path,
        "model_type": info.model_type,
        "hub_id": info.hub_id,
        "template": trained_template(checkpoint, info.template),  # the truth: a hub model is given none
        "model_name": list(zh_en(name, "MODEL_NAME")),
        "model_author": list(zh_en(author, "MODEL_AUTHOR")),
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
