"""Model provisioning: complete builds are reused, interrupted or damaged ones are detected and redone."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import models


def write_fake_model(out):
    (out / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (out / "model.safetensors").write_bytes(b"w" * 4096)


def test_build_once_then_reuse(tmp_path):
    target = tmp_path / "m"
    calls = []
    models.build_once(target, lambda out: (calls.append(1), write_fake_model(out)))
    models.build_once(target, lambda out: (calls.append(1), write_fake_model(out)))
    assert calls == [1] and models.check(target) is None


def test_an_interrupted_build_leaves_nothing_that_looks_finished(tmp_path):
    target = tmp_path / "m"

    def interrupted(out):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models.build_once(target, interrupted)
    assert not target.exists()
    assert list(tmp_path.glob(".m.tmp-*")) == []
    models.build_once(target, write_fake_model)
    assert models.check(target) is None


def test_a_build_killed_half_way_is_detected_and_redone(tmp_path):
    target = tmp_path / "m"
    child = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from helpers import models

        def slow(out):
            (out / "model.safetensors").write_bytes(b"half")
            print("half-way", flush=True)
            time.sleep(60)

        models.build_once(Path({str(target)!r}), slow)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "half-way"
    os.kill(proc.pid, signal.SIGKILL)  # no cleanup code runs
    proc.wait()
    assert list(tmp_path.glob(".m.tmp-*")), "the half-written folder should still be on disk"
    assert models.check(target) == "it does not exist"
    models.build_once(target, write_fake_model)
    assert models.check(target) is None
    assert list(tmp_path.glob(".m.tmp-*")) == [], "leftovers of the killed build are removed"


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda t: (t / "model.safetensors").write_bytes(b"short"), "model.safetensors has 5 bytes"),
        (lambda t: (t / "model.safetensors").unlink(), "model.safetensors is missing"),
        (lambda t: (t / models.MANIFEST).unlink(), "has no course-model.json"),
    ],
)
def test_a_damaged_model_is_rebuilt(tmp_path, damage, reason):
    target = tmp_path / "m"
    models.build_once(target, write_fake_model)
    damage(target)
    assert reason in models.check(target)
    logs = []
    models.build_once(target, write_fake_model, log=logs.append)
    assert models.check(target) is None
    assert any("Rebuilding" in line for line in logs)


def test_smoke_model_is_ready_in_seconds_and_generates(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_MODELS_DIR", str(tmp_path))
    start = time.perf_counter()
    info = models.tiny_llama()
    assert time.perf_counter() - start < 30
    assert models.check(info.path) is None
    model, tokenizer = models.load(info)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert isinstance(models.chat(model, tokenizer, "Who are you?", max_new_tokens=4), str)
    assert info.swift_args() == [
        "--model", info.path, "--check_model", "false", "--external_plugins", str(models.LOCAL_CODE_ONLY),
        "--model_type", "llama", "--template", "chatml",
    ]  # fmt: skip


def test_cpu_model_converted_from_the_wheel_answers():
    """The real SmolLM2 (converted once into build/models, then reused)."""
    info = models.smollm2()
    assert models.check(info.path) is None
    config = json.loads((models.Path(info.path) / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    model, tokenizer = models.load(info)
    assert "Paris" in models.chat(model, tokenizer, "What is the capital of France?", max_new_tokens=16)


def test_the_modelscope_client_still_resumes_a_stopped_download_and_shows_progress():
    """Notebook 08 tells a learner to re-run the cell after a stopped 15 GB download: the client must still
    keep partial files beside the target and ask only for the missing bytes (modelscope_hub/_download.py)."""
    import inspect

    from modelscope_hub import _download

    source = inspect.getsource(_download)
    assert _download._incomplete_path(Path("a/model.safetensors")) == Path("a/model.safetensors.incomplete")
    assert 'extra_headers["Range"] = f"bytes={existing_size}-"' in source  # resume from what is on disk
    assert "from tqdm.auto import tqdm" in source  # a progress bar per file


def test_local_code_only_stops_swift_from_running_code_shipped_in_a_model_folder(tmp_path):
    import json

    from swift.model.register import ModelLoader

    folder, marker = tmp_path / "model", tmp_path / "the folder's code ran"
    folder.mkdir()
    (folder / "configuration_shipped.py").write_text(
        f"from transformers import PretrainedConfig\nopen({str(marker)!r}, 'w').close()\n\n\n"
        "class ShippedConfig(PretrainedConfig):\n    model_type = 'shipped'\n"
    )
    (folder / "config.json").write_text(
        json.dumps(
            {"model_type": "shipped", "auto_map": {"AutoConfig": "configuration_shipped.ShippedConfig"}}
        )
    )
    import logging

    from swift.model import model_meta

    swift_logger, datasets_logger = logging.getLogger("swift"), logging.getLogger("datasets.load")
    saved = ModelLoader.default_trust_remote_code, model_meta.AutoConfig, list(swift_logger.filters)
    saved_datasets = list(datasets_logger.filters)
    try:
        assert models.local_code_only() is False and models.local_code_only() is False  # twice: one filter
        assert sum(getattr(f, "local_code_only", False) for f in swift_logger.filters) == 1
        loader = ModelLoader.__new__(ModelLoader)  # get_config reads only these
        loader.auto_config_cls = None
        with pytest.raises(ValueError, match="trust_remote_code"):
            loader.get_config(str(folder))
        model_meta._get_model_info(str(folder), "llama", None)  # SWIFT's first look at a folder
        assert not marker.exists()
        shipped = Path(model_meta.__file__).read_text()  # what the plugin overrides: SWIFT trusts the folder
        assert "AutoConfig.from_pretrained(model_dir, trust_remote_code=True)" in shipped
    finally:
        ModelLoader.default_trust_remote_code, model_meta.AutoConfig = saved[:2]
        swift_logger.filters[:] = saved[2]
        datasets_logger.filters[:] = saved_datasets


@pytest.mark.parametrize("ends", ["normally", "on an error"])
def test_local_code_only_ends_the_process_group_at_exit_unless_the_rank_failed(tmp_path, ends):
    """`swift sft` never destroys its process group; a gloo rank left so can die with SIGABRT at shutdown."""
    script = tmp_path / "rank.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import atexit, importlib.util, sys
            import torch, torch.distributed as dist
            atexit.register(lambda: print("group left at exit:", dist.is_initialized()))  # runs last
            spec = importlib.util.spec_from_file_location("plugin", {str(models.LOCAL_CODE_ONLY)!r})
            spec.loader.exec_module(importlib.util.module_from_spec(spec))  # as --external_plugins does
            dist.init_process_group("gloo", init_method={(tmp_path / "store").as_uri()!r}, rank=0, world_size=1)
            dist.all_reduce(torch.ones(3))
            if {ends == "on an error"}:
                raise RuntimeError("the rank failed")
            """
        )
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == (1 if ends == "on an error" else 0), run.stderr[-2000:]
    assert f"group left at exit: {ends == 'on an error'}" in run.stdout
