"""A trained LoRA adapter: checked, counted, fingerprinted, and recorded for notebook 07.

The adapter notebook 10 should use is recorded in ``build/outputs/latest-self-cognition.json``, one
record per profile (``{"cpu": {...}, "smoke": {...}}``: a smoke test never replaces the cpu adapter).
:func:`save_latest` writes it atomically under a lock; ``load_latest(profile.name)`` reads one record:

- ``checkpoint``: the LoRA checkpoint directory (adapter_config.json, adapter_model.safetensors)
- ``model``, ``model_type``, ``template``: the base model as SWIFT was given it (``--model`` ...), and
  ``hub_id`` when it came from ModelScope (``--model`` then names the id)
- ``model_name``, ``model_author``: the [zh, en] pairs used for the placeholders
- ``fingerprint``: :func:`fingerprint` of the checkpoint when it was written (to prove it unchanged)
- ``profile``, ``scores`` (held-out identity / general scores measured in notebook 09), ``written``
- ``goals``: the goals notebook 09 asserted for this adapter (:data:`scoring.GOALS` on cpu, ``GPU_GOALS``
  for the seed's recipe on a GPU), which notebook 10 asserts for the merged model; None where none were
"""

from __future__ import annotations

import hashlib
import json
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
    """Record the adapter notebook 10 should use under ``profile``, atomically (keys: module docstring)."""
    check_adapter(checkpoint)
    record = {
        "checkpoint": str(Path(checkpoint).resolve()),
        "model": info.path,
        "model_type": info.model_type,
        "hub_id": info.hub_id,
        "template": info.template,
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
