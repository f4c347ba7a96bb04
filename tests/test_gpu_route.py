"""The gpu path, piece by piece, where no GPU is needed: which GPUs each launch sees, the dtype, the ranks a
lesson runs on one GPU, hub models named by their id, memory let go, disk checked before a download, the
Web-UI behind a notebook's proxy, the held-out check against what is trained on, and launch timeouts."""

import dataclasses
import shutil
import sys
import weakref

import pytest
import swift_cli

from helpers import (
    answering,
    devicemap,
    disk,
    inference,
    launching,
    models,
    profiles,
    selfcog,
    sft,
    training,
    web,
)
from helpers.errors import CourseError

NAME, AUTHOR = ("小课", "XiaoKe"), ("并行训练营", "Parallel Training Camp")
HUB_MODEL = models.ModelInfo(name="Qwen/Qwen2.5-7B-Instruct", path="Qwen/Qwen2.5-7B-Instruct", source="ModelScope")


def gpu_profile(nproc: int, **changes) -> profiles.Profile:
    """The gpu profile as resolve() makes it on a machine with ``nproc`` GPUs."""
    fields = dict(name="gpu", requested="gpu", reason="asked for", device="cuda", backend="nccl", nproc=nproc,
                  gpus=nproc, model=None, dtype="bfloat16")  # fmt: skip
    return profiles.Profile(**{**fields, **changes})


# --- 4. which GPUs a launch sees: the first of this process's own -------------------------------------


def test_every_launcher_passes_the_gpus_this_process_was_given(monkeypatch):
    """A shared server gave this learner GPUs 4 and 5 (or 4-7): no launch may land on 0 and 1."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert launching.visible_gpus(2) == ["4", "5"] and launching.visible_gpus(1) == ["4"]
    assert launching.gpu_env(1) == {"CUDA_VISIBLE_DEVICES": "4"}
    assert launching.gpu_env(2) == {"CUDA_VISIBLE_DEVICES": "4,5", "NPROC_PER_NODE": "2"}
    assert launching.gpu_env(1, torchrun=True) == {"CUDA_VISIBLE_DEVICES": "4", "NPROC_PER_NODE": "1"}
    plan, _ = sft.tutorial_recipe(HUB_MODEL, 2, output_dir="out", model_name=NAME, model_author=AUTHOR)
    assert plan.env() == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert dataclasses.replace(plan, nproc=1).env() == {"CUDA_VISIBLE_DEVICES": "4"}  # 09's one-process run
    assert sft.shell_command(plan).startswith("CUDA_VISIBLE_DEVICES=4,5 NPROC_PER_NODE=2 swift sft")
    shown = inference.gpu_commands("Qwen/Qwen2.5-7B-Instruct", selfcog.SYSTEM, 96)  # 10's export and infer
    assert all(text.startswith("CUDA_VISIBLE_DEVICES=4 swift ") for text in shown.values())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    four = gpu_profile(4)
    assert [training.node_env(four, k) for k in (0, 1)] == [
        {"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}]  # fmt: skip  (06's two nodes)
    assert devicemap.mp_ddp_layout(4, 2)["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"  # 11's DDP + device_map
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5,7,8")
    assert devicemap.mp_ddp_layout(5, 2)["CUDA_VISIBLE_DEVICES"] == "2,3,5,7"  # the first 4 of 5: one idle


def test_without_the_variable_the_gpus_are_0_to_n_and_a_command_for_another_machine_ignores_it(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert launching.visible_gpus(3) == ["0", "1", "2"] and launching.visible_gpus(2, first=2) == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert launching.gpu_env(8, inherit=False)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    plan, _ = sft.tutorial_recipe(HUB_MODEL, 8, output_dir="o", model_name=NAME, model_author=AUTHOR, inherit=False)
    assert plan.env() == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def test_more_gpus_than_this_process_was_given_stops_with_one_sentence(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(CourseError) as info:
        launching.gpu_env(3)
    message = str(info.value)
    assert "CUDA_VISIBLE_DEVICES=4,5" in message and "NPROC" in message and "\n" not in message


# --- 5. the kernel's engines on one GPU --------------------------------------------------------------------


def test_the_kernels_engine_is_pinned_to_one_gpu_or_to_the_cpu(monkeypatch):
    """Left to itself SWIFT gives an engine device_map='auto' when more GPUs than processes are visible, and
    'cuda:0' when one is (swift/model/utils.py, get_default_device_map), whatever the profile."""
    import swift
    import torch

    seen = {}

    class Engine:
        def __init__(self, path, **kwargs):
            seen.update(kwargs, path=path)
            self.model = torch.nn.Linear(2, 2)

    monkeypatch.setattr(swift, "TransformersEngine", Engine)
    info = models.ModelInfo("m", "/models/m", "test", model_type="qwen2", template="qwen2_5")
    answering.Chat(info, "cuda", dtype="float16").close()
    assert seen["device_map"] == "cuda:0" and seen["torch_dtype"] == torch.float16
    answering.Chat(info, "cpu").close()  # never None: SWIFT would place it on cuda wherever a GPU is visible
    assert seen["device_map"] == "cpu" and seen["torch_dtype"] == torch.float32


# --- 14. the dtype: bf16 where the GPU has it, float16 elsewhere, everywhere alike ------------------------


def test_a_gpu_without_bf16_trains_merges_and_answers_in_float16():
    """T4 and V100 have no bf16: every command of the route carries the profile's float16. Which cards get it,
    decided by torch's own function on a pretended card: tests/test_devices.py."""
    from swift import SftArguments
    from swift.arguments import ExportArguments, InferArguments

    profile = gpu_profile(1, dtype="float16")
    plan, _ = sft.tutorial_recipe(HUB_MODEL, 1, output_dir="o", model_name=NAME, model_author=AUTHOR,
                                   dtype=profile.dtype)  # fmt: skip  (09)
    assert swift_cli.parse(sft.shell_command(plan), SftArguments)["torch_dtype"] == "float16"
    shown = inference.gpu_commands("Qwen/Qwen2.5-7B-Instruct", None, 16, profile.dtype)  # 10
    assert swift_cli.parse(shown["export"], ExportArguments)["torch_dtype"] == "float16"
    assert swift_cli.parse(shown["infer"], InferArguments)["torch_dtype"] == "float16"
    assert profiles.resolve("smoke").dtype == "float32"


# --- 9. a hub model is named by its id ---------------------------------------------------------------------


def test_a_model_from_the_hub_is_given_to_swift_by_its_id_not_its_cache_folder(tmp_path):
    folder = tmp_path / "Qwen2___5-7B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    info = models.ModelInfo("Qwen/Qwen2.5-7B-Instruct", str(folder), "ModelScope", hub_id="Qwen/Qwen2.5-7B-Instruct")
    assert info.local and info.swift_args() == ["--model", "Qwen/Qwen2.5-7B-Instruct"]  # no offline flags
    record = {"model": str(folder), "hub_id": info.hub_id, "checkpoint": "/a/checkpoint-4", "dtype": "bfloat16"}
    export = inference.export_flags(record, tmp_path / "merged")
    assert export[export.index("--model") + 1] == "Qwen/Qwen2.5-7B-Instruct" and "--external_plugins" not in export
    assert inference.base_model(record).path == str(folder)  # the kernel's engines load the cached folder


def test_a_printed_gpu_command_names_this_runs_model_on_the_gpu_profile_and_the_tutorials_elsewhere(tmp_path):
    """profiles.gpu_run, what 10, 11 and 12 print for the learner to copy: on the gpu profile this run's model
    and dtype (float16 on a card without bf16); elsewhere the original tutorial's hub id in bf16, not a
    local folder that exists only here, and nothing downloaded."""
    from swift import SftArguments

    local = models.ModelInfo("tiny", str(tmp_path), "built here", template="qwen2_5")
    assert profiles.gpu_run(gpu_profile(1, dtype="float16"), local) == (local, "float16")
    for name in ("cpu", "smoke"):
        model, dtype = profiles.gpu_run(profiles.resolve(name), local)
        assert (model.swift_args(), dtype) == (["--model", profiles.GPU_DEFAULT_MODEL], "bfloat16")
        parsed = swift_cli.parse(f"swift sft {' '.join(model.swift_args())} --torch_dtype {dtype}", SftArguments)
        assert parsed["model"] == profiles.GPU_DEFAULT_MODEL and parsed["torch_dtype"] == "bfloat16"
    base, _ = profiles.gpu_run(profiles.resolve("cpu"), local, "Qwen/Qwen2.5-7B")
    assert base.swift_args() == ["--model", "Qwen/Qwen2.5-7B"] and not base.local


# --- 3. memory let go at a notebook's end ------------------------------------------------------------------


def test_release_names_a_model_still_held_and_passes_once_it_is_gone(monkeypatch):
    import torch

    monkeypatch.setattr(models, "_LOADED", weakref.WeakSet())  # this test's models only
    model = models.hold(torch.nn.Linear(4, 4))
    gone = weakref.ref(model)
    with pytest.raises(CourseError) as info:
        models.release()
    assert "Linear" in str(info.value) and "del model" in str(info.value)
    del model
    assert models.release().startswith("No model is held by this kernel") and gone() is None


# --- 12. disk and time before a download -------------------------------------------------------------------


def test_a_download_checks_the_free_space_first(tmp_path, monkeypatch):
    import modelscope

    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 4 * 10**9, 4 * 10**9))
    monkeypatch.setattr(modelscope, "snapshot_download", lambda *a, **k: pytest.fail("downloaded without room"))
    with pytest.raises(CourseError) as info:
        models.from_modelscope("Qwen/Qwen2.5-7B-Instruct")
    message = str(info.value)
    assert "needs about 16 GB" in message and "4.0 GB free" in message and "MODELSCOPE_CACHE" in message
    with pytest.raises(CourseError, match="needs about 49 GB"):
        disk.gpu_route_space(tmp_path / "outputs")  # 08: the route's two downloads and what it writes, on one disk


def test_the_route_says_what_it_needs_when_there_is_room(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**13, 0, 10**13))
    said = disk.gpu_route_space(tmp_path / "outputs")
    assert f"about {disk.GPU_ROUTE_GB} GB" in said and "30.6 GB" in said and "h at 10 MB/s" in said


# --- 6, 7, 8, 16: 09's runs on the gpu profile -------------------------------------------------------------


def test_the_gpu_recipe_takes_the_notebooks_knobs_and_leaves_use_reentrant_to_swift():
    from swift import SftArguments

    plan, note = sft.tutorial_recipe(
        HUB_MODEL, 2, output_dir="o", model_name=NAME, model_author=AUTHOR, global_batch=8,
        learning_rate=3e-4, max_length=1024, gradient_checkpointing=False, dtype="float16",
    )  # fmt: skip
    got = swift_cli.parse(sft.shell_command(plan), SftArguments)
    assert (got["learning_rate"], got["max_length"], got["gradient_checkpointing"]) == (3e-4, 1024, False)
    assert got["per_device_train_batch_size"] * 2 * got["gradient_accumulation_steps"] == 8 and note is None
    assert got["torch_dtype"] == "float16" and got["gradient_checkpointing_kwargs"] is None


def test_the_forgetting_comparison_keeps_the_same_identity_data():
    """'identity only' is the identity part of the very mix 'identity + general' trains on."""
    assert selfcog.identity_part(sft.HUB_DATASETS) == ("swift/self-cognition#500",)
    course = (selfcog.SELF_COGNITION, "build/models/general-answers/x/general.jsonl#96")
    assert selfcog.identity_part(course) == (selfcog.SELF_COGNITION,)
    with pytest.raises(CourseError, match="no self-cognition"):
        selfcog.identity_part(("AI-ModelScope/alpaca-gpt4-data-en#500",))


def test_both_forgetting_runs_draw_the_same_identity_rows_from_swift(tmp_path):
    """09 section 7: sft.sampled gives each source its share of the rows, and SWIFT's sampler, seeded by
    --data_seed and not --seed, draws the same identity rows whether general data follows them or not."""
    import json

    from swift.dataset import load_dataset

    assert sft.sampled(sft.HUB_DATASETS[:2], 161) == (
        "AI-ModelScope/alpaca-gpt4-data-zh#81",
        "AI-ModelScope/alpaca-gpt4-data-en#80",
    )
    with pytest.raises(CourseError, match="at least one row each"):
        sft.sampled(sft.HUB_DATASETS, 2)
    general = tmp_path / "general.jsonl"
    general.write_text("".join(json.dumps({"query": f"q{i}?", "response": f"a{i}."}) + "\n" for i in range(30)))
    identity = list(sft.sampled([selfcog.SELF_COGNITION], 12))
    names = {"model_name": ["小课", "XiaoKe"], "model_author": ["并行训练营", "Parallel Training Camp"]}
    alone, _ = load_dataset(identity, seed=42, **names)
    mixed, _ = load_dataset(identity + list(sft.sampled([general], 12)), seed=42, **names)

    def rows(dataset):
        return sorted(json.dumps(row["messages"], ensure_ascii=False) for row in dataset)

    assert len(rows(alone)) == 12 and len(rows(mixed)) == 24
    assert set(rows(alone)) <= set(rows(mixed))  # the same 12 identity rows, and 12 general ones besides


def test_a_run_of_sft_main_in_its_own_process_gets_its_keywords_and_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    script = tmp_path / "fake_sft.py"  # stands in for 09's sft_from_python.py: echoes what it was given
    script.write_text(
        "import json, os, sys\n"
        "kwargs = json.load(open(sys.argv[1]))\n"
        "json.dump({'last_model_checkpoint': kwargs['output_dir'], 'pid': os.getpid(),\n"
        "           'visible': os.environ.get('CUDA_VISIBLE_DEVICES'), 'seed': kwargs['seed']}, open(sys.argv[2], 'w'))\n"
    )
    plan, _ = sft.tutorial_recipe(HUB_MODEL, 2, output_dir=tmp_path / "v1", model_name=NAME, model_author=AUTHOR)
    got = sft.sft_process(dataclasses.replace(plan, nproc=1, seed=7).kwargs(), script, gpus=1, timeout=60)
    assert got["last_model_checkpoint"] == str(tmp_path / "v1") and got["seed"] == 7
    assert got["visible"] == "4" and got["pid"] != __import__("os").getpid()


# --- 18. the held-out questions against the rows trained on --------------------------------------------------


def test_the_held_out_check_reads_the_data_a_run_trains_on(monkeypatch):
    heldout = selfcog.heldout(kind="identity")[0]["query"]
    asked = []

    def hub(dataset, name, author):
        asked.append(dataset)
        return {heldout} if dataset.startswith("swift/self-cognition") else {"What is 2 + 2?"}

    monkeypatch.setattr(selfcog, "hub_questions", hub)
    assert selfcog.leaked_heldout(sft.HUB_DATASETS, NAME, AUTHOR) == [heldout]
    assert asked == list(sft.HUB_DATASETS)
    assert selfcog.leaked_heldout((selfcog.SELF_COGNITION, selfcog.GENERAL_QUESTIONS), NAME, AUTHOR) == []
    assert selfcog.leaked_heldout() == []


# --- 17. the Web-UI behind a hosted notebook's proxy ---------------------------------------------------------


def test_the_web_ui_is_addressed_through_the_notebooks_proxy(monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ann/")
    ui = web.WebUI(port=7860, proxied=True)
    assert ui.proxy_path == "/user/ann/proxy/7860/" and ui.url == "http://127.0.0.1:7860/"
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX")
    assert web.WebUI(port=7861).proxy_path == "/proxy/7861/"


# --- 10. a launch never outlives the check's own limit ---------------------------------------------------------


def test_a_launch_timeout_is_capped_by_the_environment_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(launching.LAUNCH_TIMEOUT_CAP, "1")
    sleeper = launching.Launch([sys.executable, "-c", "import time; time.sleep(60)"], label="sleeper", timeout=3600)
    with pytest.raises(launching.LaunchTimeout) as info:
        launching.run(sleeper, show=False)
    assert f"within 1 s ({launching.LAUNCH_TIMEOUT_CAP}, for 3600 s asked)" in str(info.value)
    monkeypatch.setenv(launching.LAUNCH_TIMEOUT_CAP, "soon")
    with pytest.raises(CourseError, match="must be a number of seconds"):
        launching.capped(10)
    monkeypatch.delenv(launching.LAUNCH_TIMEOUT_CAP)
    assert launching.capped(10) == 10


def test_a_typed_web_ui_command_starts_the_web_ui_it_names():
    """09 types `swift web-ui ...` in its cell: the port, host and language are the typed ones, any other
    flag is passed on, and a command that is not `swift web-ui` is refused in one sentence."""
    ui = web.WebUI.typed("swift web-ui --lang zh --server_name 127.0.0.1 --server_port 7999 --share false")
    assert (ui.lang, ui.host, ui.port, ui.extra) == ("zh", "127.0.0.1", 7999, ["--share", "false"])
    bare = web.WebUI.typed("swift web-ui", proxied=True)  # what the same text does in a terminal: SWIFT's defaults
    assert (bare.lang, bare.host, bare.port, bare.proxied) == ("zh", "127.0.0.1", 7860, True)
    with pytest.raises(CourseError, match="is not a swift web-ui command; write it as 'swift web-ui"):
        web.WebUI.typed("swift sft --model x")


def test_docs_gpu_md_counts_every_gpu_branch_of_08_to_12():
    """docs/gpu.md lists the gpu branches of the SWIFT lessons by what they decide; a branch added to a lesson
    must be added to that list, so the count it gives is the notebooks' own."""
    import json
    import re

    from helpers import paths

    branches = picks = 0
    for notebook in sorted((paths.ROOT / "notebooks").glob("1[0-2]_*.ipynb")) + sorted(
        (paths.ROOT / "notebooks").glob("0[89]_*.ipynb")
    ):
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or source.startswith("%%writefile"):
                continue  # a take-away script decides its device from its own arguments
            branches += len(re.findall(r"profile\.(?:name|device)\s*(?:==|!=|\.startswith)|on_gpus\(", source))
            picks += len(re.findall(r"\.(?:pick|knob)\(", source))
    said = re.search(r"The gpu branches of 08-12 \((\d+) places .*?, and (\d+) picks\)", (paths.ROOT / "docs" / "gpu.md").read_text(encoding="utf-8"), re.S)
    assert said, "docs/gpu.md no longer says how many gpu branches 08-12 hold"
    assert (int(said[1]), int(said[2])) == (branches, picks), (
        f"docs/gpu.md counts {said[1]} branches and {said[2]} picks in 08-12; the notebooks hold {branches} and {picks}: "
        "list the new ones by what they decide"
    )
