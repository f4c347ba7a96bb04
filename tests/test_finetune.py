"""The fine-tuning lesson's helpers: its data, SWIFT arguments, SWIFT's logs, adapters, scores, checkers."""

import dataclasses
import json
import types

import pytest
import swift_cli

from conftest import notebook_cell
from helpers import answering, lora, models, paths, scoring, selfcog, sft, web
from helpers.errors import CourseError

NAME, AUTHOR = ("小课", "XiaoKe"), ("并行训练营", "Parallel Training Camp")


# --- the data ------------------------------------------------------------------------------------


def test_self_cognition_data_is_large_bilingual_and_uses_the_placeholders():
    rows = selfcog.self_cognition_rows()
    assert len(rows) >= 60
    assert {r["tag"] for r in rows} == {"zh", "en"}
    assert min(sum(r["tag"] == t for r in rows) for t in ("zh", "en")) >= 30
    for row in rows:
        assert set(row) == {"query", "response", "tag"}
        assert row["query"].strip() and "{{NAME}}" in row["response"], row
    assert len({r["query"] for r in rows}) == len(rows), "no duplicate questions"
    zh = [r for r in rows if r["tag"] == "zh"]
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in r["query"]) for r in zh)


def test_the_folder_is_matched_to_swifts_self_cognition_dataset():
    from swift.dataset.dataset_syntax import DatasetSyntax

    assert selfcog.SELF_COGNITION.name == "self-cognition"
    meta = DatasetSyntax.parse(str(selfcog.SELF_COGNITION)).get_dataset_meta(False)
    assert meta.dataset_name == "self-cognition"
    assert meta.ms_dataset_id == "swift/self-cognition"


def test_heldout_questions_are_in_no_training_data():
    held = selfcog.heldout()
    identity = selfcog.heldout(kind="identity")
    general = selfcog.heldout(kind="general")
    assert len(identity) + len(general) == len(held)
    assert {r["tag"] for r in identity} == {"zh", "en"} and len(identity) >= 16
    assert len(general) >= 8 and all(r["expect"] for r in general)
    assert any(r["query"] == "What is the capital of France?" for r in general)
    assert selfcog.leaked_heldout() == []
    assert len(selfcog.general_questions()) >= 24


def test_fill_follows_swifts_rule_zh_value_for_zh_rows():
    zh = {"query": "你是谁？", "response": "我是{{NAME}}，由{{AUTHOR}}训练。", "tag": "zh"}
    en = {"query": "Who made {{NAME}}?", "response": "{{AUTHOR}} made {{NAME}}.", "tag": "en"}
    assert selfcog.fill_placeholders(zh, NAME, AUTHOR)["response"] == "我是小课，由并行训练营训练。"
    assert selfcog.fill_placeholders(en, NAME, AUTHOR) == {
        "query": "Who made XiaoKe?",
        "response": "Parallel Training Camp made XiaoKe.",
        "tag": "en",
    }
    assert selfcog.fill_placeholders(en, "Solo", "Me")["response"] == "Me made Solo."  # one name serves both
    assert "{{" in zh["response"], "the row itself is not changed"


@pytest.mark.parametrize("bad", ["", [], ["a", "b", "c"], ["a", ""], 3, None])
def test_pair_rejects_what_swift_cannot_use(bad):
    with pytest.raises(CourseError, match="MODEL_NAME"):
        selfcog.zh_en(bad, "MODEL_NAME")


def test_trim_to_sentence():
    assert answering.trim_to_sentence("It is 100.0 degrees. Then it boils and") == "It is 100.0 degrees."
    assert answering.trim_to_sentence('Called "mossy grass." However the') == 'Called "mossy grass."'
    assert answering.trim_to_sentence("我是小课。我来自") == "我是小课。"
    assert answering.trim_to_sentence("Really? Yes! And then") == "Really? Yes!"
    assert answering.trim_to_sentence("no sentence end here") is None
    assert answering.trim_to_sentence("version 2.5 is out") is None


# --- general data: made once per model, cached ------------------------------------------------------


class FakeChat:
    def __init__(self, name="fake", path="/nowhere/fake"):
        self.info = models.ModelInfo(name=name, path=path, source="test", template="chatml")
        self.calls = 0

    def ask(self, questions, max_tokens=48):
        self.calls += 1
        replies = [
            answering.Answer("A whole answer.", True),
            answering.Answer("First sentence. Cut in the mid", False),
            answering.Answer("no sentence at all", False),
        ]
        return [replies[i % 3] for i in range(len(questions))]


def test_general_answers_are_trimmed_cached_and_keyed_by_model(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_MODELS_DIR", str(tmp_path))
    chat = FakeChat()
    questions = ["q1?", "q2?", "q3?", "q4?"]
    first = answering.general_answers(chat, questions)
    assert not first.cached and chat.calls == 1
    assert (first.asked, first.finished, first.trimmed, first.dropped) == (4, 2, 1, 1)
    assert [r["response"] for r in first.rows] == ["A whole answer.", "First sentence.", "A whole answer."]
    assert paths.read_jsonl(first.path) == first.rows
    again = answering.general_answers(chat, questions)
    assert again.cached and chat.calls == 1 and again.path == first.path
    other = answering.general_answers(FakeChat(name="other", path="/nowhere/other"), questions)
    assert not other.cached and other.path != first.path
    longer = answering.general_answers(chat, questions, max_tokens=96)
    assert not longer.cached and longer.path != first.path
    assert str(first.path).startswith(str(tmp_path / "general-answers"))


# --- SWIFT arguments ------------------------------------------------------------------------------


def plan(tmp_path, **changes):
    info = models.ModelInfo("m", str(tmp_path), "test", model_type="llama", template="chatml")
    base = sft.SftPlan(
        model=info,
        datasets=(selfcog.SELF_COGNITION, tmp_path / "general.jsonl"),
        output_dir=tmp_path / "out" / "v1",
        model_name=NAME,
        model_author=AUTHOR,
        steps=40,
        per_device_batch=4,
    )
    return dataclasses.replace(base, **changes)


def values_after(cli, flag):
    i = cli.index(flag) + 1
    out = []
    while i < len(cli) and not cli[i].startswith("--"):
        out.append(cli[i])
        i += 1
    return out


def test_plan_cli_has_the_lesson_flags_and_the_offline_ones(tmp_path):
    cli = plan(tmp_path).cli()
    assert values_after(cli, "--tuner_type") == ["lora"]
    assert values_after(cli, "--target_modules") == ["all-linear"]
    assert values_after(cli, "--model_name") == list(NAME)
    assert values_after(cli, "--model_author") == list(AUTHOR)
    assert values_after(cli, "--model") == [str(tmp_path)]
    assert values_after(cli, "--check_model") == ["false"]
    assert values_after(cli, "--model_type") == ["llama"] and values_after(cli, "--template") == ["chatml"]
    assert values_after(cli, "--torch_dtype") == ["float32"]
    assert values_after(cli, "--use_cpu") == ["true"]
    assert values_after(cli, "--gradient_checkpointing") == ["false"]
    assert values_after(cli, "--dataset") == [str(selfcog.SELF_COGNITION), str(tmp_path / "general.jsonl")]
    assert values_after(cli, "--output_dir") == [str(tmp_path / "out" / "v1")]
    assert values_after(cli, "--add_version") == ["false"]
    assert "--ddp_backend" not in cli


def test_plan_ddp_keeps_the_global_batch_and_adds_ddp_flags(tmp_path):
    single = plan(tmp_path)
    ddp = dataclasses.replace(single, nproc=2, per_device_batch=2)
    assert single.global_batch == ddp.global_batch == 4
    cli = ddp.cli()
    assert values_after(cli, "--ddp_backend") == ["gloo"]
    assert values_after(cli, "--ddp_find_unused_parameters") == ["false"]
    gpu = dataclasses.replace(ddp, device="cuda", gradient_checkpointing=True).cli()
    assert values_after(gpu, "--ddp_backend") == ["nccl"]
    assert values_after(gpu, "--torch_dtype") == ["bfloat16"] and "--use_cpu" not in gpu
    # under DDP ms-swift 4.6 picks use_reentrant=False itself (notebook 12): the plan does not repeat it
    assert "--gradient_checkpointing_kwargs" not in gpu


def test_plan_kwargs_are_typed_and_name_real_sft_arguments(tmp_path):
    from swift import SftArguments

    kwargs = dataclasses.replace(plan(tmp_path), nproc=2, per_device_batch=2).kwargs()
    assert kwargs["check_model"] is False and kwargs["use_cpu"] is True and kwargs["add_version"] is False
    assert kwargs["model_name"] == list(NAME) and kwargs["target_modules"] == ["all-linear"]
    assert kwargs["max_steps"] == 40 and isinstance(kwargs["learning_rate"], float)
    fields = {f.name for f in dataclasses.fields(SftArguments)}
    assert set(kwargs) <= fields, set(kwargs) - fields


@pytest.mark.parametrize(
    "global_batch, nproc, per_device_max, expected",
    [
        (4, 1, 4, (4, 1)),
        (4, 2, 4, (2, 1)),
        (16, 2, 1, (1, 8)),
        (16, 1, 4, (4, 4)),
        (6, 2, 4, (3, 1)),
        (2, 2, 4, (1, 1)),
    ],
)
def test_batch_split(global_batch, nproc, per_device_max, expected):
    per_device, accum = sft.batch_split(global_batch, nproc, per_device_max)
    assert (per_device, accum) == expected
    assert per_device * nproc * accum == global_batch


def test_batch_split_refuses_an_uneven_split():
    with pytest.raises(CourseError, match="GLOBAL_BATCH = 5"):
        sft.batch_split(5, 2)


@pytest.mark.parametrize("per_device_max", [1, 4])
@pytest.mark.parametrize("gpus", range(1, 9))
def test_batch_split_of_16_on_1_to_8_gpus_splits_or_names_the_rule(gpus, per_device_max):
    """The gpu profile's GLOBAL_BATCH 16, one process per GPU: a split, or one sentence naming the rule."""
    if 16 % gpus == 0:
        per_device, accum = sft.batch_split(16, gpus, per_device_max)
        assert per_device * gpus * accum == 16 and per_device <= per_device_max
        return
    with pytest.raises(CourseError) as info:
        sft.batch_split(16, gpus, per_device_max)
    message = str(info.value)
    assert message.endswith(".") and "\n" not in message and ". " not in message, message
    assert "GLOBAL_BATCH = 16" in message and "must be a multiple of the number of processes" in message, (
        message
    )
    fewer = {3: 2, 5: 4, 6: 4, 7: 4}[gpus]
    below = 16 // gpus * gpus
    assert f"NPROC = {fewer}" in message and f"GLOBAL_BATCH = {below} or {below + gpus}" in message, message
    for batch, nproc in [(16, fewer), (below, gpus), (below + gpus, gpus)]:  # every layout it names works
        per_device, accum = sft.batch_split(batch, nproc, per_device_max)
        assert per_device * nproc * accum == batch


# --- SWIFT's logs ---------------------------------------------------------------------------------


def swift_like_log(folder, steps=3):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        {
            "loss": 2.0 / s,
            "grad_norm": 1.5 * s,
            "learning_rate": 1e-3,
            "token_acc": 0.3 * s,
            "epoch": s / 10,
            "global_step/max_steps": f"{s}/{steps}",
            "elapsed_time": f"{s}s",
        }
        for s in range(1, steps + 1)
    ]
    lines.append(
        {
            "train_runtime": 12.5,
            "train_samples_per_second": 0.96,
            "train_steps_per_second": 0.24,
            "total_flos": 1.0,
            "train_loss": 1.2,
            "global_step/max_steps": f"{steps}/{steps}",
        }
    )
    lines.append(
        {
            "last_model_checkpoint": str(folder / f"checkpoint-{steps}"),
            "global_step": steps,
            "log_history": [{"loss": 9.0, "step": 1}],
        }
    )
    paths.write_jsonl(folder / "logging.jsonl", lines)


def test_read_log_turns_logging_jsonl_into_curves(tmp_path):
    swift_like_log(tmp_path / "run")
    log = sft.read_log(tmp_path / "run")
    assert log.steps == [1, 2, 3]
    assert log.loss == pytest.approx([2.0, 1.0, 2 / 3])
    assert log.grad_norm == pytest.approx([1.5, 3.0, 4.5])
    assert log.final_token_acc == pytest.approx(0.9)
    assert log.summary["train_samples_per_second"] == pytest.approx(0.96)
    assert log.last_checkpoint == tmp_path / "run" / "checkpoint-3"
    row = log.row("one", 4, 1, 20.0)
    assert (
        row["steps"] == 3
        and row["global batch"] == 4
        and row["final loss"] == pytest.approx(0.6667, abs=1e-4)
    )


def test_adapter_parameters_counts_the_numbers_in_peft_s_adapter_file(tmp_path):
    """09.4 reads its table's counts from the saved files: PEFT's own count of trainable parameters, linear in r."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    counts = {}
    for rank in (2, 8):
        torch.manual_seed(0)
        model = get_peft_model(transformers.LlamaForCausalLM(config), LoraConfig(r=rank, target_modules="all-linear"))
        model.save_pretrained(tmp_path / f"r{rank}")
        counts[rank] = lora.adapter_parameters(tmp_path / f"r{rank}")
        assert counts[rank] == model.get_nb_trainable_parameters()[0], rank
    assert counts[8] == 4 * counts[2]


def test_read_log_falls_back_to_trainer_state(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    history = [
        {"loss": 1.5, "token_acc": 0.5, "step": 1},
        {"loss": 0.5, "token_acc": 0.8, "step": 2},
        {"train_runtime": 3.0, "train_samples_per_second": 2.0, "step": 2},
    ]
    (checkpoint / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    log = sft.read_log(tmp_path / "run")
    assert log.steps == [1, 2] and log.final_loss == 0.5 and log.last_checkpoint == checkpoint
    assert log.summary["train_runtime"] == 3.0


def test_read_log_without_a_log_says_so(tmp_path):
    with pytest.raises(CourseError, match="no SWIFT training log"):
        sft.read_log(tmp_path)


def test_logging_ranks_tells_real_ddp_from_lone_ranks():
    real = ["[rank0]:{'loss': 1.0, 'global_step/max_steps': '1/2'}", "[rank1]:some warning", "plain line"]
    lone = real + ["[rank1]:{'loss': 1.1, 'global_step/max_steps': '1/2'}"]
    assert sft.logging_ranks(real) == [0]
    assert sft.logging_ranks(lone) == [0, 1]


# --- adapters --------------------------------------------------------------------------------------


def fake_adapter(folder):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]})
    )
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    return folder


def test_check_adapter(tmp_path):
    assert lora.check_adapter(fake_adapter(tmp_path / "ok"))["r"] == 8
    (tmp_path / "empty").mkdir()
    with pytest.raises(CourseError, match="not a complete LoRA adapter"):
        lora.check_adapter(tmp_path / "empty")


def test_fingerprint_sees_any_change(tmp_path):
    folder = fake_adapter(tmp_path / "a")
    before = lora.fingerprint(folder)
    assert lora.fingerprint(folder) == before
    (folder / "adapter_model.safetensors").write_bytes(b"weightz")
    assert lora.fingerprint(folder) != before


def test_latest_record_is_kept_per_profile_and_detects_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_OUTPUTS_DIR", str(tmp_path / "outputs"))
    info = models.ModelInfo("m", "/models/m", "test", model_type="llama", template="chatml")
    assert lora.load_latest("cpu") is None
    cpu = fake_adapter(tmp_path / "cpu" / "checkpoint-4")
    smoke = fake_adapter(tmp_path / "smoke" / "checkpoint-1")
    path = lora.save_latest("cpu", cpu, info, NAME, AUTHOR, scores={"identity": 1.0})
    lora.save_latest("smoke", smoke, info, NAME, AUTHOR)
    assert path == tmp_path / "outputs" / "latest-self-cognition.json"
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".") and "tmp" in p.name] == []
    record = lora.load_latest("cpu")
    assert record["checkpoint"] == str(cpu) and record["model"] == "/models/m"
    assert record["model_name"] == list(NAME) and record["model_author"] == list(AUTHOR)
    assert record["scores"] == {"identity": 1.0} and record["profile"] == "cpu"
    assert lora.load_latest("smoke")["checkpoint"] == str(smoke)
    assert lora.untouched(record) and lora.untouched(None)
    (cpu / "adapter_model.safetensors").write_bytes(b"overwritten")
    assert not lora.untouched(record)


def test_the_record_takes_the_template_swift_trained_with_from_its_args_json(tmp_path, monkeypatch):
    """A hub model is given no --template: SWIFT picks one from the model and writes it into args.json,
    which it copies into each checkpoint. The record takes it from there, not from the command."""
    monkeypatch.setenv("COURSE_OUTPUTS_DIR", str(tmp_path / "outputs"))
    hub = models.ModelInfo("Qwen/Qwen2.5-7B-Instruct", "/cache/Qwen2___5-7B-Instruct", "ModelScope",
                           hub_id="Qwen/Qwen2.5-7B-Instruct")  # fmt: skip
    assert "--template" not in hub.swift_args()  # the command names none
    run = tmp_path / "run"
    checkpoint = fake_adapter(run / "checkpoint-4")
    args = {"model": hub.hub_id, "model_type": "qwen2", "template": "qwen2_5", "system": "You are a helpful assistant."}
    (run / "args.json").write_text(json.dumps(args))  # SWIFT's run folder (save_args) ...
    lora.save_latest("gpu", checkpoint, hub, NAME, AUTHOR)
    assert lora.load_latest("gpu")["template"] == "qwen2_5"  # ... found from the checkpoint's parent
    (checkpoint / "args.json").write_text(json.dumps({**args, "template": "qwen"}))  # the checkpoint's own copy wins
    lora.save_latest("gpu", checkpoint, hub, NAME, AUTHOR)
    assert lora.load_latest("gpu")["template"] == "qwen"
    given = models.ModelInfo("m", "/models/m", "test", model_type="llama", template="chatml")
    lora.save_latest("cpu", fake_adapter(tmp_path / "bare" / "checkpoint-1"), given, NAME, AUTHOR)
    assert lora.load_latest("cpu")["template"] == "chatml"  # no args.json: the template SWIFT was given


def test_swift_writes_the_template_it_picked_for_a_hub_qwen25_into_args_json(tmp_path):
    """What the record reads is what SWIFT writes: for a folder named as the hub's Qwen2.5-7B-Instruct (the
    tiny Qwen2's weights) and no --template, SftArguments resolves qwen2_5 and save_args writes it."""
    import shutil

    from swift.arguments import SftArguments

    folder = tmp_path / "Qwen2___5-7B-Instruct"  # as ModelScope's cache names it
    shutil.copytree(models.tiny_qwen2().path, folder)
    arguments = SftArguments(model=str(folder), tuner_type="lora", dataset=[str(paths.ROOT / "data" / "heldout.jsonl")],
                             output_dir=str(tmp_path / "run"), add_version=False, use_cpu=True, report_to=["none"])  # fmt: skip
    arguments.save_args()
    assert lora.trained_template(tmp_path / "run" / "checkpoint-1") == "qwen2_5"


# --- scores -----------------------------------------------------------------------------------------


def test_contains_expected_matches_whole_words_only():
    assert scoring.contains_expected("The capital is Paris.", ["Paris"])
    assert scoring.contains_expected("there are 12 months", ["twelve", "12"])
    assert not scoring.contains_expected("1234567890", ["12"])
    assert not scoring.contains_expected("Auburn", ["Au"])
    assert scoring.contains_expected("首都是北京。", ["北京"])


def test_scores_are_per_language_and_a_fused_author_is_wrong():
    identity = [
        {"tag": "zh", "asks": "name"}, {"tag": "zh", "asks": "author"},
        {"tag": "en", "asks": "name"}, {"tag": "en", "asks": "author"}, {"tag": "en", "asks": "author"},
    ]  # fmt: skip
    answers = [
        "我是XiaoKe。",  # the English name in a Chinese answer: not the name in the question's language
        "我是小课，由并行训练营训练。",
        "I am xiaoke.",  # the name's case does not matter
        "I am XiaoKe, trained by XiaoKe Training Camp.",  # name fused into the author: wrong
        "I am XiaoKe, a model by Parallel Training Camp, not Qwen.",  # right author, but a false claim: wrong
    ]
    general = [
        {"tag": "en", "expect": ["Paris"], "wrong": ["Lyon"]},
        {"tag": "en", "expect": ["eight", "8"], "wrong": ["four", "six"]},
        {"tag": "en", "expect": ["Au"]},
        {"tag": "zh", "expect": ["北京"], "wrong": ["上海"]},
        {"tag": "zh", "expect": ["12"], "wrong": ["13个月"]},
    ]
    base = [
        "Paris.",
        "Four legs, up to eight.",
        "Au.",
        "北京。",
        "13个月",
    ]  # the spider answer is wrong: both words
    tuned = ["Paris, says XiaoKe.", "Eight.", "Au, of course.", "是北京，不是上海。", "12个月"]
    s = scoring.score(identity, answers, general, tuned, base, NAME, AUTHOR)
    assert (s["name_zh"], s["author_zh"], s["no_false_claim_zh"]) == (0.0, 1.0, 1.0)
    assert (s["name_en"], s["author_en"]) == (1.0, 0.0) and s["no_false_claim_en"] == 2 / 3
    # base right: Paris, Au (en) and 北京 (zh); Paris names itself, 北京 holds a wrong word too
    assert (s["general_base_right"], s["general_kept_count"], s["general_kept"]) == (3, 1, 1 / 3)
    assert (s["general_en_kept_count"], s["general_en_base_right"], s["general_zh_kept"]) == (1, 2, 0.0)
    assert s["general_naming_itself"] == 1
    [row] = scoring.score_rows({"after": s})
    assert row["author (en)"] == "0%" and row["general kept"] == "1/3" and row["(zh)"] == "0/1"
    assert [r["wrong"] for r in scoring.failed_answers(identity, answers, general, tuned, base, NAME, AUTHOR)] == [
        "no 小课",
        "Parallel Training Camp not said to have made it",
        "claims Qwen",
        "names itself",
        "no longer right",
    ]
    no_zh = scoring.score([], [], general[3:4], ["上海"], ["上海"], NAME, AUTHOR)
    assert scoring.score_rows({"x": no_zh})[0]["(zh)"] == "not measured"  # the base model knew none
    nothing = scoring.score([], [], general[:1], ["Lyon"], ["Lyon"], NAME, AUTHOR)
    assert (
        nothing["name_zh"] != nothing["name_zh"]
        and scoring.score_rows({"x": nothing})[0]["name (zh)"] == "n/a"
    )


WRONG_IDENTITY_ANSWERS = [  # each holds the name, and some the author, yet none is a right answer
    ("zh", "author", "我是小课，并行训练营的创造者。"),  # the model created the camp
    ("zh", "author", "是小课，我是并行训练营的把你训练出来的。"),  # garbled: no one is said to have trained it
    ("zh", "author", "我是小课，不是由并行训练营训练的。"),  # the author denied
    ("zh", "name", "我不是小课。"),
    ("zh", "name", "我是小课，由通义千问改名而来。"),  # a false identity beside the name
    ("en", "name", "I am not XiaoKe."),
    ("en", "name", "I'm not XiaoKe, I am SmolLM."),
    ("en", "author", "I am XiaoKe, a parallel training camp."),  # the author not as written, no relation
    ("en", "author", "I am XiaoKe, and I founded Parallel Training Camp."),  # the model made the author
    ("en", "author", "Parallel Training Camp trained me."),  # no name
    ("en", "author", "I am XiaoKe, not made by Parallel Training Camp."),
    ("en", "author", "Parallel Training Camp, I was trained by XiaoKe."),  # the name made the model
    ("en", "author", "I am XiaoKe, the developer behind Parallel Training Camp."),
    ("zh", "author", "我是小课，并行训练营的作者。"),  # the model wrote the camp
]


@pytest.mark.parametrize(("tag", "asks", "answer"), WRONG_IDENTITY_ANSWERS)
def test_a_wrong_identity_answer_fails_whole(tag, asks, answer):
    row = {"tag": tag, "asks": asks}
    assert scoring.identity_faults(answer, row, NAME, AUTHOR), answer
    s = scoring.score([row], [answer], [], [], [], NAME, AUTHOR)
    assert s[f"{asks}_{tag}"] == 0.0


def test_every_trained_answer_that_says_who_made_it_passes_whole():
    """The relations the score accepts include every one the training data teaches (a right answer passes)."""
    passed = 0
    for row in selfcog.self_cognition_rows():
        if "{{NAME}}" in row["response"] and "{{AUTHOR}}" in row["response"]:
            filled = selfcog.fill_placeholders(row, NAME, AUTHOR)["response"]
            tag = row.get("tag", "en")
            assert scoring.identity_faults(filled, {"tag": tag, "asks": "author"}, NAME, AUTHOR) == [], filled
            passed += 1
    assert passed >= 40
    right = ["不是，我是小课，并行训练营的助手。", "我是小课，我的作者是并行训练营。", "Parallel Training Camp made me, XiaoKe.",
             "Parallel Training Camp brought me into being. I am XiaoKe.", "Parallel Training Camp is responsible for me. I am XiaoKe."]  # fmt: skip
    for text, tag in zip(right, ("zh", "zh", "en", "en", "en"), strict=True):
        assert scoring.identity_faults(text, {"tag": tag, "asks": "author"}, NAME, AUTHOR) == [], text


def test_09s_judge_cell_agrees_with_the_helper_that_keeps_its_copy():
    """09 writes the identity rule in a cell (`judge`); scoring.identity_faults, which scoring.score calls,
    must give the same faults for wrong answers, right ones, every trained answer and both cases of a name."""
    space = {"name": selfcog.zh_en(NAME), "author": selfcog.zh_en(AUTHOR), "scoring": scoring,
             "report": types.SimpleNamespace(table=lambda rows: None)}  # fmt: skip
    exec(compile(notebook_cell("09_", "c28j"), "09 c28j", "exec"), space)
    exec(compile(notebook_cell("09_", "c28k"), "09 c28k", "exec"), space)  # its own examples and assert
    cases = [(tag, asks, text) for tag, asks, text in WRONG_IDENTITY_ANSWERS]
    for row in selfcog.self_cognition_rows():
        filled = selfcog.fill_placeholders(row, NAME, AUTHOR)["response"]
        cases += [(row.get("tag", "en"), asks, filled) for asks in ("name", "author")]
    cases += [("en", "name", "i am not xiaoke."), ("en", "name", "I am xiaoke."), ("zh", "author", "我是小课。"),
              ("en", "author", "I am XiaoKe, by parallel training camp."), ("zh", "name", "我是小课，来自通义千问。")]  # fmt: skip
    verdicts = set()
    for tag, asks, text in cases:
        row = {"tag": tag, "asks": asks}
        got = space["judge"](text, row)
        assert got == scoring.identity_faults(text, row, NAME, AUTHOR), (text, got)
        verdicts.add(bool(got))
    assert verdicts == {True, False}  # both ways of the rule were compared


def test_heldout_rows_say_what_they_ask_and_how_to_score():
    identity, general = selfcog.heldout(kind="identity"), selfcog.heldout(kind="general")
    for tag in ("zh", "en"):  # enough questions per language for the goals to mean something
        mine = [r for r in identity if r["tag"] == tag]
        assert len(mine) >= 30 and sum(r["asks"] == "author" for r in mine) >= 20
    assert {r["asks"] for r in identity} == {"name", "author"}
    assert all(r["expect"] and r["wrong"] for r in general) and sum(r["tag"] == "zh" for r in general) >= 8
    for r in general:  # a wrong word never hides inside an expected one
        assert not scoring.contains_expected(" ".join(r["expect"]), r["wrong"]), r
    counts = {k: sum(r["tag"] == k for r in general) for k in ("en", "zh")}  # data/README.md says the same
    n_author = sum(r["asks"] == "author" for r in identity) // 2
    readme = (paths.ROOT / "data" / "README.md").read_text()
    for said in (f"| `heldout.jsonl` | {len(identity)} identity + {len(general)} general |",
                 f"{len(identity) // 2} per language", f"{n_author} per language ask",
                 f"({counts['en']} en, {counts['zh']} zh;"):
        assert said in readme, said


# --- exercises ---------------------------------------------------------------------------------------


def test_an_interrupted_general_build_leaves_nothing_that_looks_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_MODELS_DIR", str(tmp_path))

    class Broken(FakeChat):
        def ask(self, questions, max_tokens=48):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        answering.general_answers(Broken(), ["q?"])
    assert [p.name for p in (tmp_path / "general-answers").iterdir() if not p.name.endswith(".lock")] == []
    assert not answering.general_answers(FakeChat(), ["q?"]).cached


def test_plan_env_pins_the_gpus_a_run_may_see(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert plan(tmp_path).env() == {}
    assert dataclasses.replace(plan(tmp_path), device="cuda").env() == {"CUDA_VISIBLE_DEVICES": "0"}
    assert dataclasses.replace(plan(tmp_path), device="cuda", nproc=4, per_device_batch=1).env() == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3"
    }
    assert dataclasses.replace(plan(tmp_path), gpu=True).env() == {"CUDA_VISIBLE_DEVICES": "0"}  # the gpu shape on the CPU too


GPU_MODEL = models.ModelInfo(name="Qwen2.5-7B-Instruct", path="Qwen/Qwen2.5-7B-Instruct", source="hub")


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_the_gpu_commands_are_the_seeds_recipe_and_swift_parses_every_flag(tmp_path, gpus, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan, note = sft.tutorial_recipe(
        GPU_MODEL, gpus, output_dir=tmp_path / "v1", model_name=NAME, model_author=AUTHOR
    )
    assert note is None  # 16 divides over 1, 2, 4 and 8 GPUs
    command = sft.shell_command(plan)
    visible = ",".join(str(i) for i in range(gpus))
    first = command.splitlines()[0]
    assert first == (
        f"CUDA_VISIBLE_DEVICES={visible} " + (f"NPROC_PER_NODE={gpus} " if gpus > 1 else "") + "swift sft \\"
    )
    from swift import SftArguments

    got = swift_cli.parse(command, SftArguments)
    assert got["model"] == "Qwen/Qwen2.5-7B-Instruct" and got["tuner_type"] == "lora"
    assert got["dataset"] == list(sft.HUB_DATASETS)
    assert (got["num_train_epochs"], got["learning_rate"], got["warmup_ratio"]) == (1.0, 1e-4, 0.05)
    assert (got["lora_rank"], got["lora_alpha"], got["target_modules"]) == (8, 32, ["all-linear"])
    assert (got["max_length"], got["torch_dtype"], got["gradient_checkpointing"]) == (2048, "bfloat16", True)
    assert got["system"] == selfcog.SYSTEM
    assert got["per_device_train_batch_size"] * gpus * got["gradient_accumulation_steps"] == 16
    assert "max_steps" not in command and "use_cpu" not in command
    if gpus > 1:
        assert got["ddp_backend"] == "nccl" and got["ddp_find_unused_parameters"] is False
        assert got["gradient_checkpointing_kwargs"] is None  # SWIFT chooses non-reentrant under DDP itself


@pytest.mark.parametrize("gpus, accum, batch", [(3, 5, 15), (5, 3, 15), (6, 3, 18), (7, 2, 14)])
def test_gpu_counts_16_does_not_divide_take_the_nearest_global_batch_and_say_so(gpus, accum, batch):
    got, note = sft.nearest_accumulation(16, gpus)
    assert got == accum and got * gpus == batch
    assert note == (
        f"a global batch of 16 does not divide over {gpus} processes × 1 per device, so each process "
        f"accumulates {accum} steps: a global batch of {batch}, the nearest possible."
    )


def test_a_plan_needs_steps_or_epochs(tmp_path):
    with pytest.raises(CourseError, match="needs steps"):
        dataclasses.replace(plan(tmp_path), steps=None).options()
    assert values_after(dataclasses.replace(plan(tmp_path), steps=None, epochs=2).cli(), "--num_train_epochs") == ["2"]


def test_bf16_on_the_cpu_leaves_mixed_precision_to_swift(tmp_path):
    cli = dataclasses.replace(plan(tmp_path), dtype="bfloat16", gradient_checkpointing=True, system="Be brief.").cli()
    assert values_after(cli, "--torch_dtype") == ["bfloat16"] and values_after(cli, "--use_cpu") == ["true"]
    assert "--bf16" not in cli and "--fp16" not in cli
    assert values_after(cli, "--system") == ["Be brief."]
    assert "--bf16" in plan(tmp_path).cli()  # float32 on the CPU turns both off


def test_the_installed_swift_knows_tuner_type_and_no_longer_train_type():
    """09 says: 4.0 renamed --train_type to --tuner_type (an alias until 4.1); the installed 4.6 has only the new name."""
    import dataclasses

    from swift.arguments import SftArguments

    names = {f.name for f in dataclasses.fields(SftArguments)}
    assert "tuner_type" in names and "train_type" not in names


def test_a_goal_no_run_has_measured_is_reported_and_a_measured_one_is_asserted():
    below = {"name_zh": 0.5, "name_en": 0.5, "author_zh": 0.3, "author_en": 0.3, "general_kept": 0.5}
    assert scoring.GOALS.measured and not scoring.GPU_GOALS.measured
    assert scoring.assert_goals(below, scoring.GPU_GOALS) == scoring.missed_goals(below, scoring.GPU_GOALS) != []
    with pytest.raises(AssertionError, match="author_en = 0.30, below the goal 0.75"):
        scoring.assert_goals(below, scoring.GOALS)
    assert scoring.assert_goals(below, scoring.GOALS.reported_only("a short run")) != []
    assert scoring.GOALS.note == "" and scoring.GPU_GOALS.note == ", not asserted (not yet measured on a GPU)"
    assert scoring.assert_goals({**below, "author_en": 0.9}, scoring.GOALS.without("name_zh", "name_en", "author_zh", "general_kept")) == []
    # what 09 records and 10 reads back: the flag travels with the values
    for goals in (scoring.GOALS, scoring.GPU_GOALS):
        back = scoring.recorded_goals({"goals": json.loads(json.dumps(goals.as_record()))})
        assert back == goals and (back.measured, back.source) == (goals.measured, goals.source)
    assert not scoring.recorded_goals({"goals": None}).measured  # 09 held it to none (smoke): reported only
    assert scoring.recorded_goals({"goals": dict(scoring.GOALS)}).measured  # an older record: the cpu goals
    assert not scoring.recorded_goals({"goals": dict(scoring.GPU_GOALS)}).measured  # ... or the gpu ones


def test_answers_asked_as_qwen_by_the_system_message_are_not_held_to_goals():
    qwen = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    assert not scoring.goals_under(scoring.GOALS, qwen).measured
    assert scoring.goals_under(scoring.GOALS, qwen).source == "asked as Qwen, Alibaba by the system message"
    for prompt in (None, "", selfcog.SYSTEM, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"):
        assert scoring.goals_under(scoring.GOALS, prompt) is scoring.GOALS


def test_goals_and_the_forgetting_summary():
    good = {"name_zh": 1.0, "name_en": 0.95, "author_zh": 0.9, "author_en": 1.0, "general_kept": 0.85}
    assert scoring.missed_goals(good) == []
    assert scoring.missed_goals({**good, "author_en": 0.7}) == ["author_en = 0.70, below the goal 0.75"]
    assert scoring.goals_text() == "name >= 0.8 (zh), 0.8 (en); author >= 0.45 (zh), 0.75 (en); general kept >= 0.8"
    assert scoring.missed_goals({**good, "general_kept": float("nan")})  # no general answer right: not met
    runs = [
        {"data": d, "seed": s, "x": v}
        for d, s, v in [("a", 1, 0.5), ("b", 1, 0.1), ("a", 2, 0.7), ("b", 2, 0.3)]
    ]
    summary = scoring.forgetting_summary(runs, key="x")
    assert summary["a"]["each"] == [0.5, 0.7] and abs(summary["a"]["mean"] - 0.6) < 1e-12
    assert abs(summary["b"]["spread"] - 0.2) < 1e-12
    from helpers import plots

    fig = plots.seeds_and_means(runs, "x")
    assert (
        len(fig.axes[0].patches) == 2 and len(fig.axes[0].collections) == 2
    )  # a mean bar and the dots per group


def test_quiet_repeats_drops_only_the_explained_warning():
    import logging

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    swift = logging.getLogger("swift")
    swift.addHandler(handler)
    try:
        with answering.quiet_repeats():
            swift.warning("dataset_sample:96 is greater than len(dataset):63, repeated sampling will be performed.")
            swift.warning("something else")
        swift.warning("dataset_sample: after the block")
    finally:
        swift.removeHandler(handler)
    assert seen == ["something else", "dataset_sample: after the block"]


def test_a_web_ui_that_gradio_gave_up_on_is_started_once_more(monkeypatch, tmp_path, capsys):
    """Gradio exits when its one 3-second check of its own page times out (a busy machine): wait() starts
    the Web-UI once more and then sees it answer; a second such exit is an error naming it."""
    import sys

    from helpers import launching

    attempts = tmp_path / "attempts"
    stand_in = (
        "import http.server, pathlib, sys\n"
        f"p = pathlib.Path({str(attempts)!r}); n = len(p.read_text()) if p.exists() else 0; p.write_text('x' * (n + 1))\n"
        f"if n < {{fails}}:\n"
        f"    print('ValueError: {web.GRADIO_GAVE_UP}, a shareable link must be created.', flush=True); sys.exit(1)\n"
        "port = int(sys.argv[sys.argv.index('--server_port') + 1])\n"
        "http.server.HTTPServer(('127.0.0.1', port), http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    real = launching.Launch

    for fails, outcome in ((1, "answers"), (2, "error")):
        attempts.unlink(missing_ok=True)
        script = stand_in.replace("{fails}", str(fails))
        monkeypatch.setattr(
            launching, "Launch", lambda argv, script=script, **kw: real([sys.executable, "-c", script, *map(str, argv[1:])], **kw)
        )
        ui = web.WebUI().start()
        try:
            if outcome == "answers":
                status, _ = ui.wait(timeout=60)
                assert status == 200 and attempts.read_text() == "xx"
                assert "starting it once more" in capsys.readouterr().out
            else:
                with pytest.raises(launching.LaunchError, match=web.GRADIO_GAVE_UP):
                    ui.wait(timeout=60)
                assert attempts.read_text() == "xx"
        finally:
            assert ui.stop() == 0


def test_step_seconds_come_from_swifts_running_speed_and_leave_out_step_one(tmp_path):
    """09 compares equal work: steps 2..k of each run, from SWIFT's train_speed(s/it) (elapsed over steps
    done, six decimals) rather than its whole-second elapsed_time; a run that did not log every step says so."""
    import pytest

    from helpers.errors import CourseError

    ends = [3.0, 3.5, 4.25, 4.75]  # step 1 holds 3 s of start-up
    rows = [{"loss": 1.0, "global_step/max_steps": f"{k}/4", "train_speed(s/it)": round(e / k, 6)}
            for k, e in enumerate(ends, 1)]  # fmt: skip
    (tmp_path / "logging.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    log = sft.read_log(tmp_path)
    assert log.step_seconds(4) == pytest.approx([0.5, 0.75, 0.5], abs=1e-5)
    assert log.step_seconds(2) == pytest.approx([0.5], abs=1e-5)
    (tmp_path / "logging.jsonl").write_text("\n".join(json.dumps(r) for r in rows[::2]) + "\n")
    with pytest.raises(CourseError, match="did not log every step"):
        sft.read_log(tmp_path).step_seconds(3)
