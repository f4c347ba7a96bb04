"""The merge-and-inference lesson's helpers: the recorded adapter, SWIFT flags, files, logits, scores, checkers."""

import dataclasses
import json
import types
from pathlib import Path

import pytest
import swift_cli

from conftest import notebook_cell
from helpers import answering, inference, lora, models, paths, selfcog
from helpers.errors import CourseError

NAME, AUTHOR = ("小课", "XiaoKe"), ("并行训练营", "Parallel Training Camp")
INFO = models.ModelInfo("m", "/models/m", "test", model_type="llama", template="chatml")


def fake_adapter(folder):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 32}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    return folder


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_OUTPUTS_DIR", str(tmp_path / "outputs"))
    return tmp_path / "outputs"


# --- the recorded adapter ------------------------------------------------------------------------------


def test_no_record_stops_with_one_sentence_naming_notebook_06(outputs):
    with pytest.raises(
        CourseError, match=r"no adapter is recorded for the cpu profile .* run notebook 09 first"
    ):
        inference.recorded_adapter("cpu")
    lora.save_latest("smoke", fake_adapter(outputs.parent / "smoke"), INFO, NAME, AUTHOR)
    with pytest.raises(CourseError, match="run notebook 09 first"):
        inference.recorded_adapter("cpu")  # a smoke record does not stand in for the cpu one
    assert inference.recorded_adapter("smoke")["profile"] == "smoke"


def test_a_missing_or_changed_adapter_is_refused(outputs, tmp_path):
    checkpoint = fake_adapter(tmp_path / "run" / "checkpoint-4")
    lora.save_latest("cpu", checkpoint, INFO, NAME, AUTHOR)
    record = inference.recorded_adapter("cpu")
    assert record["checkpoint"] == str(checkpoint.resolve()) and record["model_name"] == list(NAME)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"retrained")
    with pytest.raises(CourseError, match="changed after notebook 09 recorded it"):
        inference.recorded_adapter("cpu")
    for path in checkpoint.iterdir():
        path.unlink()
    checkpoint.rmdir()
    with pytest.raises(CourseError, match="is gone"):
        inference.recorded_adapter("cpu")


def test_a_hub_models_adapter_is_merged_and_asked_with_the_template_swift_trained_with(outputs, tmp_path):
    """09 on a GPU gives SWIFT the hub's Qwen2.5 and no --template; SWIFT's args.json names the qwen2_5 it
    picked. 10 then writes that ChatML template, with 09's system prompt, into the merged folder, instead of
    leaving Qwen's own, whose default system message is "You are Qwen, created by Alibaba Cloud"."""
    from helpers import scoring

    hub = models.ModelInfo("Qwen/Qwen2.5-7B-Instruct", "/cache/Qwen2___5-7B-Instruct", "ModelScope",
                           hub_id="Qwen/Qwen2.5-7B-Instruct")  # fmt: skip
    checkpoint = fake_adapter(tmp_path / "run" / "checkpoint-4")
    (tmp_path / "run" / "args.json").write_text(json.dumps({"template": "qwen2_5", "model_type": "qwen2"}))
    lora.save_latest("gpu", checkpoint, hub, NAME, AUTHOR, system=selfcog.SYSTEM)
    record = inference.recorded_adapter("gpu")
    assert record["template"] == "qwen2_5" and inference.base_model(record).template == "qwen2_5"
    assert inference.merged_model(record, tmp_path / "merged").template == "qwen2_5"
    assert record["template"] in inference.CHATML_TEMPLATES  # 10's branch: write the training template
    system = inference.prompt_system(record["template"], record["system"])
    assert system == selfcog.SYSTEM and scoring.goals_under(scoring.GOALS, system).measured
    qwen = inference.prompt_system(record["template"], None)  # trained with no --system: Qwen's default
    assert "Qwen" in qwen and not scoring.goals_under(scoring.GOALS, qwen).measured
    assert inference.prompt_system("chatml", None) is None  # the cpu model: no system message at all


def test_a_record_written_without_the_template_gets_it_from_args_json(outputs, tmp_path):
    hub = models.ModelInfo("Qwen/Qwen2.5-7B-Instruct", "/cache/q", "ModelScope", hub_id="Qwen/Qwen2.5-7B-Instruct")
    checkpoint = fake_adapter(tmp_path / "run" / "checkpoint-4")
    lora.save_latest("gpu", checkpoint, hub, NAME, AUTHOR)
    assert lora.load_latest("gpu")["template"] is None  # no args.json yet: nothing to read
    (tmp_path / "run" / "args.json").write_text(json.dumps({"template": "qwen2_5"}))
    assert inference.recorded_adapter("gpu")["template"] == "qwen2_5"  # the run folder's file, not the checkpoint


def test_base_and_merged_model_keep_type_and_template(tmp_path):
    record = {
        "model": "/models/m",
        "model_type": "llama",
        "template": "chatml",
        "checkpoint": "/a/checkpoint-4",
    }
    base = inference.base_model(record)
    merged = inference.merged_model(record, tmp_path / "merged")
    assert (base.path, base.model_type, base.template) == ("/models/m", "llama", "chatml")
    assert (merged.path, merged.model_type, merged.template) == (str(tmp_path / "merged"), "llama", "chatml")


# --- SWIFT flags -----------------------------------------------------------------------------------------


def flags_to_dict(flags):
    out, key = {}, None
    for item in flags:
        if item.startswith("--"):
            key = item[2:]
            out[key] = []
        else:
            out[key].append(item)
    return {k: v[0] if len(v) == 1 else v for k, v in out.items()}


def test_export_flags_merge_into_a_new_folder_and_are_export_arguments(tmp_path):
    from swift.arguments import ExportArguments

    record = {
        "model": "/models/m",
        "model_type": "llama",
        "template": "chatml",
        "checkpoint": "/a/checkpoint-4",
    }
    flags = flags_to_dict(inference.export_flags(record, tmp_path / "v1" / "model"))
    assert flags["adapters"] == "/a/checkpoint-4" and flags["model"] == "/models/m"
    assert flags["merge_lora"] == "true" and flags["torch_dtype"] == "float32"
    assert flags["output_dir"] == str(tmp_path / "v1" / "model")
    assert "check_model" not in flags, "swift export refuses the training-only --check_model"
    assert set(flags) <= {f.name for f in dataclasses.fields(ExportArguments)}
    assert flags_to_dict(inference.export_flags(record, tmp_path / "new", "float16"))["torch_dtype"] == "float16"
    trained = {**record, "dtype": "bfloat16"}  # the dtype notebook 09 trained in, as it recorded it
    assert flags_to_dict(inference.export_flags(trained, tmp_path / "new"))["torch_dtype"] == "bfloat16"
    (tmp_path / "taken").mkdir()
    with pytest.raises(CourseError, match="already exists"):
        inference.export_flags(record, tmp_path / "taken")


def test_infer_flags_are_greedy_batched_and_are_infer_arguments(tmp_path):
    from swift.arguments import InferArguments

    flags = flags_to_dict(inference.infer_flags(INFO, tmp_path / "q.jsonl", tmp_path / "a.jsonl", 32))
    assert flags["val_dataset"] == str(tmp_path / "q.jsonl") and flags["result_path"] == str(
        tmp_path / "a.jsonl"
    )
    assert flags["temperature"] == "0" and flags["max_new_tokens"] == "32" and flags["stream"] == "false"
    assert int(flags["max_batch_size"]) > 1
    assert set(flags) <= {f.name for f in dataclasses.fields(InferArguments)}
    assert "system" not in flags  # None: the template's own default
    system = "You are a helpful assistant."
    flags = flags_to_dict(inference.infer_flags(INFO, "q.jsonl", "a.jsonl", 32, system=system))
    assert flags["system"] == system  # the prompt notebook 09 trained with, asked with again


def test_model_text_names_a_local_folder_from_the_repository_with_the_plugin_and_a_hub_model_by_its_id():
    """What 10's typed commands put after --model: a local folder (relative to the repository, as a learner
    types it at its root) with the plugin that keeps SWIFT from running its code; a hub model by its id."""
    from helpers import swiftcli

    local = models.ModelInfo("m", str(paths.ROOT / "helpers"), "test", model_type="llama", template="chatml")
    assert inference.model_text(local) == (
        f"helpers --external_plugins {paths.relative(models.LOCAL_CODE_ONLY)} --model_type llama --template chatml"
    )
    hub = models.ModelInfo("q", str(paths.ROOT / "helpers"), "test", hub_id="Qwen/Qwen2.5-7B-Instruct")
    assert inference.model_text(hub) == "Qwen/Qwen2.5-7B-Instruct"
    spaced = models.ModelInfo("m", "/no/such folder", "test")  # not here: named as given, quoted for the shell
    _, _, args = swiftcli.parse_swift_text("swift infer --model " + inference.model_text(spaced))
    assert args == ["--model", "/no/such folder"]


# --- files -------------------------------------------------------------------------------------------------


def test_questions_out_answers_back_in_question_order(tmp_path):
    questions = ["Who are you?", "你是谁？"]
    path = inference.write_questions(tmp_path / "q.jsonl", questions)
    assert paths.read_jsonl(path) == [{"query": "Who are you?"}, {"query": "你是谁？"}]
    result = tmp_path / "a.jsonl"
    paths.write_jsonl(
        result,
        [  # swift infer's rows, here in the other order
            {
                "response": " 我是小课。",
                "messages": [
                    {"role": "user", "content": "你是谁？"},
                    {"role": "assistant", "content": "我是小课。"},
                ],
            },
            {"response": "I am XiaoKe.", "messages": [{"role": "user", "content": "Who are you?"}]},
        ],
    )
    assert inference.read_answers(result, questions) == ["I am XiaoKe.", "我是小课。"]
    with pytest.raises(CourseError, match="no answer to 1 question"):
        inference.read_answers(result, questions + ["What is 2 + 2?"])
    with pytest.raises(CourseError, match="did swift infer finish"):
        inference.read_answers(tmp_path / "missing.jsonl", questions)


def test_sizes_on_disk(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"w" * 1000)
    (folder / "training_args.bin").write_bytes(b"t" * 10)
    (folder / "adapter_config.json").write_bytes(b"c" * 5)
    (folder / "sub").mkdir()
    (folder / "sub" / "x.txt").write_bytes(b"x" * 3)
    (folder / "link.safetensors").symlink_to(folder / "adapter_model.safetensors")
    assert inference.weight_bytes(folder) == 1000  # the link is not a second copy; training_args is no weight
    assert inference.folder_bytes(folder) == 1018
    with pytest.raises(CourseError, match="is not a folder"):
        inference.folder_bytes(tmp_path / "nothing")


def hub_cache_snapshot(root):
    """A folder laid out like a hub cache: the snapshot holds only links into blobs/ (two to one blob)."""
    blobs, snapshot = root / "blobs", root / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    (snapshot / "sub").mkdir(parents=True)
    for name, size in {"w1": 1000, "w2": 600, "config": 50, "tok": 7}.items():
        (blobs / name).write_bytes(b"x" * size)
    (snapshot / "model-00001-of-00002.safetensors").symlink_to(blobs / "w1")
    (snapshot / "model-00002-of-00002.safetensors").symlink_to("../../blobs/w2")  # relative, as the hub links
    (snapshot / "config.json").symlink_to(blobs / "config")
    (snapshot / "sub" / "tokenizer.json").symlink_to(blobs / "tok")
    (snapshot / "also-config.json").symlink_to(blobs / "config")  # the same real file twice: counted once
    (snapshot / "broken.bin").symlink_to(blobs / "missing")  # a dangling link holds nothing
    return snapshot


def test_sizes_follow_links_into_a_hub_cache(tmp_path):
    snapshot = hub_cache_snapshot(tmp_path)
    assert inference.weight_bytes(snapshot) == 1600
    assert inference.folder_bytes(snapshot) == 1600 + 50 + 7


def test_a_zero_size_is_refused_in_one_sentence(tmp_path):
    folder = tmp_path / "no-weights"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "training_args.bin").write_bytes(b"t" * 10)  # not a weight file
    for call in (
        lambda: inference.weight_bytes(folder),
        lambda: inference.weight_bytes(tmp_path / "nothing"),
    ):
        with pytest.raises(CourseError) as info:
            call()
        message = str(info.value)
        assert message.endswith(".") and "\n" not in message and ". " not in message, message
    with pytest.raises(CourseError, match="no weight file"):
        inference.weight_bytes(folder)


# --- the merged folder's chat template ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "system"),
    [("chatml", None), ("chatml", "You are a helpful assistant."), ("qwen2_5", "You are a helpful assistant."),
     ("qwen2_5", None), ("qwen", None)],  # fmt: skip
)
def test_the_written_template_gives_the_prompt_swift_trained_with(tmp_path, template, system):
    """transformers' apply_chat_template, with and without a system message, gives the token ids SWIFT's
    template encodes (SmolLM2's own template, with no system message, names the model SmolLM)."""
    import shutil

    from swift import InferRequest
    from swift.model import get_processor
    from swift.template import get_template
    from transformers import AutoTokenizer

    source = Path(models.smollm2().path)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, tmp_path / name)
    asked = [{"role": "user", "content": "Who are you?"}]
    own = AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(asked, add_generation_prompt=True, tokenize=False)
    assert "SmolLM" in own  # the base model's template speaks for it

    inference.write_training_template(tmp_path, template, system)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    trained = get_template(get_processor(str(tmp_path), model_type="llama"), default_system=system, template_type=template)
    for messages in (asked, [{"role": "system", "content": "You are Ada."}, *asked]):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert ids == trained.encode(InferRequest(messages=messages))["input_ids"], tokenizer.decode(ids)
    assert "SmolLM" not in tokenizer.decode(ids)
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    with pytest.raises(CourseError, match="not one of SWIFT's ChatML templates"):
        inference.write_training_template(tmp_path, "llama3", None)


# --- logits and streaming on the tiny model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_adapter(tmp_path_factory):
    """A tiny Llama, a LoRA adapter with non-zero B (so it changes the outputs), and the merged model."""
    import torch
    from peft import LoraConfig, get_peft_model

    info = models.tiny_llama()
    folder = tmp_path_factory.mktemp("tiny")
    model, tokenizer = models.load(info)
    torch.manual_seed(0)
    config = LoraConfig(
        r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(folder / "adapter")
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(folder / "merged")
    tokenizer.save_pretrained(folder / "merged")
    return info, folder / "adapter", dataclasses.replace(info, path=str(folder / "merged"))


def test_merged_logits_equal_base_plus_adapter(tiny_adapter):
    info, adapter, merged = tiny_adapter
    questions = ["Who are you?", "你是谁？", "What is the capital of France?"]
    with answering.Chat(info, adapter=adapter) as chat:
        batch = inference.prompt_batch(chat.engine.template, questions)
        with_adapter = inference.logits(chat.engine.model, batch)
        with chat.engine.model.disable_adapter():
            without = inference.logits(chat.engine.model, batch)
    merged_model, _ = models.load(merged)
    merged_logits = inference.logits(merged_model, batch)
    mask = batch["attention_mask"]
    lengths = mask.sum(dim=1).tolist()
    assert len(set(lengths)) > 1 and mask[0, : lengths[0]].all() and not mask[0, lengths[0] :].any()
    assert inference.largest_gap(with_adapter, merged_logits, mask) < 1e-4
    assert inference.largest_gap(with_adapter, without, mask) > 1e-2
    with pytest.raises(CourseError, match="different shapes"):
        inference.largest_gap(with_adapter, merged_logits[:2], mask)


def _merge(info, folder, scale_error: float = 1.0):
    """Merge a fresh LoRA adapter into ``info``'s model the way ``swift export`` does (peft's merge, in the
    model's own dtype); ``scale_error`` multiplies the update, as a wrong alpha / r would."""
    import torch
    from peft import LoraConfig, get_peft_model

    model, _ = models.load(info)
    model = model.to(getattr(torch, inference.saved_dtype(info.path) or "float32"))
    torch.manual_seed(1)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "down_proj"],
                                                  init_lora_weights=False))  # fmt: skip
    peft_model.save_pretrained(folder / "adapter")
    with torch.no_grad():
        for name, weight in peft_model.named_parameters():
            if "lora_B" in name:
                weight.mul_(scale_error)
    peft_model.merge_and_unload().save_pretrained(folder / "merged")
    return folder / "adapter", folder / "merged"


def merge_check(info, adapter, merged) -> tuple[dict, list]:
    """Run 10's merge check cell on ``info``'s base model, ``adapter`` and the ``merged`` folder: what it found
    (its ``weights``) and the names it recorded."""
    recorded = []
    report_stub = types.SimpleNamespace(record=lambda *args, **kwargs: recorded.append(args[0]))
    space = {"config": lora.check_adapter(adapter), "adapter": adapter, "base": info, "merged_dir": merged,
             "report": report_stub, "print": lambda *args, **kwargs: None}  # fmt: skip
    exec(compile(notebook_cell("10_", "c12"), "10 c12", "exec"), space)
    return space["weights"], recorded


@pytest.mark.parametrize("make", [models.tiny_llama, models.tiny_qwen2], ids=["float32", "bfloat16"])
def test_10s_merge_check_finds_each_weight_w_plus_scaled_ba_and_catches_a_wrong_scale(make, tmp_path):
    """10's cell computes W + (alpha/r)·B·A over the safetensors files itself, within the dtype's rounding."""
    info = make()
    adapter, merged = _merge(info, tmp_path / "right")
    weights, recorded = merge_check(info, adapter, merged)
    assert weights["dtype"] == (inference.saved_dtype(info.path) or "float32")
    assert (
        weights["weights"]
        == 2 * json.loads((Path(info.path) / "config.json").read_text())["num_hidden_layers"]
    )
    assert weights["worst"] <= 1, weights
    assert recorded == ["merged_weight_worst_error", "merged_weight_dtype"]
    adapter, merged = _merge(info, tmp_path / "wrong", scale_error=1.05)  # an update 5% too large
    assert merge_check(info, adapter, merged)[0]["worst"] > 1


def test_the_system_prompt_comes_first_in_every_prompt(tiny_adapter):
    info, adapter, _ = tiny_adapter
    assert answering.messages("Who are you?") == [{"role": "user", "content": "Who are you?"}]
    with answering.Chat(info, adapter=adapter) as chat:
        plain = inference.prompt_batch(chat.engine.template, ["Who are you?"])
        told = inference.prompt_batch(chat.engine.template, ["Who are you?"], system="You are Ada.")
        text = chat.engine.template.tokenizer.decode(told["input_ids"][0])
    assert "You are Ada." in text and told["input_ids"].shape[1] > plain["input_ids"].shape[1]


def test_streaming_gives_the_batch_answer_in_pieces(tiny_adapter):
    info, adapter, _ = tiny_adapter
    shown = []
    with answering.Chat(info, adapter=adapter) as chat:
        pieces = inference.stream(chat, "Who are you?", max_tokens=6, out=lambda *a, **k: shown.append(a))
        [answer] = chat.ask(["Who are you?"], max_tokens=6)
    assert "".join(pieces).strip() == answer.text
    assert len(shown) == len(pieces) + 1  # one print per piece, then the closing newline
    with pytest.raises(CourseError, match="closed"):
        inference.stream(chat, "Who are you?")


def test_closing_an_engine_that_streamed_lets_its_model_go(tiny_adapter):
    """Streaming starts SWIFT's worker thread, which loops for ever holding the engine: on a GPU the model's
    memory would stay taken for the kernel's lifetime (notebook 10's last cell found it)."""
    import gc
    import weakref

    info, adapter, _ = tiny_adapter
    chat = answering.Chat(info, adapter=adapter)
    inference.stream(chat, "Who are you?", max_tokens=3, out=lambda *a, **k: None)
    model = weakref.ref(chat.engine.model)
    worker = chat.engine._task_thread
    chat.close()
    gc.collect()
    assert not worker.is_alive() and model() is None


# --- scores ------------------------------------------------------------------------------------------------


def test_same_answers_counts_equal_texts():
    assert inference.same_answers(["a ", answering.Answer("b", True)], ["a", "c"]) == 1


# --- exercises -----------------------------------------------------------------------------------------------


def test_the_merge_keeps_the_base_models_saved_dtype(tmp_path):
    """A bf16 base merged on the CPU stays bf16 (else the merged model is twice its size)."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "qwen2", "dtype": "bfloat16"}))
    record = {
        "model": str(base),
        "model_type": "qwen2",
        "template": "qwen2_5",
        "checkpoint": "/a/checkpoint-4",
    }
    assert flags_to_dict(inference.export_flags(record, tmp_path / "m1"))["torch_dtype"] == "bfloat16"
    (base / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float32"}))
    assert flags_to_dict(inference.export_flags(record, tmp_path / "m2"))["torch_dtype"] == "float32"
    assert inference.saved_dtype(tmp_path / "nowhere") is None


def test_the_gpu_export_and_infer_commands_are_swifts_own_arguments(monkeypatch):
    from swift.arguments import ExportArguments, InferArguments

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    shown = inference.gpu_commands("Qwen/Qwen2.5-7B-Instruct", selfcog.SYSTEM, 96)
    assert [line.split(" \\")[0] for line in (shown["export"].splitlines()[0], shown["infer"].splitlines()[0])] == [
        "CUDA_VISIBLE_DEVICES=0 swift export", "CUDA_VISIBLE_DEVICES=0 swift infer"]  # fmt: skip
    export = swift_cli.parse(shown["export"], ExportArguments)
    assert export["model"] == "Qwen/Qwen2.5-7B-Instruct" and export["merge_lora"] is True
    assert export["torch_dtype"] == "bfloat16" and export["adapters"] == [
        "build/outputs/self-cognition-ddp/vN/checkpoint-M"
    ]
    infer = swift_cli.parse(shown["infer"], InferArguments)
    assert infer["model"] == export["output_dir"] and infer["system"] == selfcog.SYSTEM
    assert (infer["temperature"], infer["max_new_tokens"], infer["torch_dtype"]) == (0.0, 96, "bfloat16")


def test_answer_loss_is_the_mean_surprise_of_the_answers_tokens(tiny_adapter):
    """The forgetting measure of notebook 09, checked token by token: each answer token's -log p given
    the prompt and the answer so far, one forward pass per prefix, averaged."""
    import math

    import torch
    from swift import InferRequest

    info, _, _ = tiny_adapter
    question, answer = "Who are you?", "zebra quantum marmalade"
    with answering.Chat(info) as chat:
        got, empty = chat.answer_loss([question, question], [answer, ""])
        template, model = chat.engine.template, chat.engine.model
        prompt = template.encode(InferRequest(messages=[{"role": "user", "content": question}]))["input_ids"]
        reply = template.tokenizer(answer, add_special_tokens=False)["input_ids"]
        surprise = []
        with torch.inference_mode():
            for k, token in enumerate(reply):
                logits = model(input_ids=torch.tensor([prompt + reply[:k]])).logits[0, -1].float()
                surprise.append(-torch.log_softmax(logits, -1)[token].item())
    assert len(reply) > 1 and math.isclose(got, sum(surprise) / len(surprise), rel_tol=1e-4)
    assert empty != empty  # an empty answer has no tokens: NaN, not a score


def test_an_adapter_put_on_and_taken_off_scores_as_the_adapter_loaded_by_swift(tiny_adapter):
    info, adapter, _ = tiny_adapter
    question, answer = ["Who are you?"], ["zebra quantum marmalade"]
    with answering.Chat(info, adapter=adapter) as tuned:
        expected = tuned.answer_loss(question, answer)
    with answering.Chat(info) as judge:
        before = judge.answer_loss(question, answer)
        with judge.adapter_on(adapter):
            during = judge.answer_loss(question, answer)
        after = judge.answer_loss(question, answer)
    assert abs(during[0] - expected[0]) < 1e-4 and during != before and after == before


def test_10s_commands_to_copy_name_a_hub_model_by_its_id_as_the_command_that_runs_does(tmp_path):
    """The gpu profile's base model is a ModelScope download: the command that runs gives SWIFT its id
    (inference.model_text), and so do the commands printed to copy, never its cache folder with the plugin
    flag a local folder needs."""
    snapshot = tmp_path / "models" / "Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "master"
    snapshot.mkdir(parents=True)
    base = models.ModelInfo(name="Qwen/Qwen2.5-7B-Instruct", path=str(snapshot), source="ModelScope",
                            template="qwen2_5", hub_id="Qwen/Qwen2.5-7B-Instruct")  # fmt: skip
    shown = inference.gpu_commands(base, "You are XiaoKe.", 16, "bfloat16")["export"]
    assert f"--model {inference.model_text(base)}" in " ".join(shown.replace("\\\n", " ").split())
    assert str(snapshot) not in shown and "--external_plugins" not in shown
    assert "--model Qwen/Qwen2.5-7B-Instruct" in " ".join(shown.split())
