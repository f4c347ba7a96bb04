"""helpers.troubleshooting: reading launch output, SWIFT logs, py-spy stacks, and the 12 exercise checkers."""

import json
import shlex
import sys
import time

import pytest

from helpers import launching, troubleshooting
from helpers.exercises import nb12

RANK_OUTPUT = [
    "[rank0]:Traceback (most recent call last):",
    "[rank0]:[rank0]: RuntimeError: Expected to mark a variable ready only once. This error is caused by",
    "[rank1]:RuntimeError: Expected to mark a variable ready only once. This error is caused by",
    "[rank1]:Parameter at index 7 with name blocks.2.0.bias has been marked as ready twice.",
    "W1130 15:00:00.000 123 torch/distributed/run.py:874] something",
]

PY_SPY_DUMP = """Process 4688: /work/main/.venv/bin/python3 -u hang.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4688 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3245)
    wrapper (torch/distributed/c10d_logger.py:83)
    sync_gradients (hang.py:23)
    <module> (hang.py:30)
"""


def test_strip_rank_removes_launcher_and_torch_prefixes():
    assert troubleshooting.strip_rank("[rank0]:[rank0]: RuntimeError: x") == "RuntimeError: x"
    assert troubleshooting.strip_rank("[rank1]:hello") == "hello"
    assert troubleshooting.strip_rank("no prefix") == "no prefix"


def test_key_lines_are_distinct_unprefixed_and_cut():
    found = troubleshooting.key_lines(
        RANK_OUTPUT, troubleshooting.READY_TWICE, "marked as ready twice", width=60
    )
    assert len(found) == 2  # the two ranks' RuntimeError lines are the same line once unprefixed
    assert found[0].startswith("RuntimeError: Expected to mark")
    assert all(len(line) <= 60 for line in found)
    assert found[1].endswith("…")
    assert troubleshooting.key_lines("\n".join(RANK_OUTPUT), "nothing like this") == []


def test_key_lines_accepts_an_exception():
    error = launching.LaunchError("rank 0 failed.\n    RuntimeError: boom")
    assert troubleshooting.key_lines(error, "boom") == ["RuntimeError: boom"]


def test_chat_dataset_is_swift_messages(tmp_path):
    path = troubleshooting.write_chat_dataset(tmp_path / "data", rows=5)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant"]
        a, b = (int(w.rstrip("?")) for w in row["messages"][0]["content"].split() if w.rstrip("?").isdigit())
        assert row["messages"][1]["content"] == f"{a} plus {b} is {a + b}."


def test_swift_log_reads_the_newest_run(tmp_path):
    old, new = tmp_path / "v0-old", tmp_path / "v1-new"
    for folder, loss in ((old, 9.0), (new, 2.0)):
        folder.mkdir()
        rows = [{"loss": loss, "global_step/max_steps": "1/2"}, {"loss": loss / 2}, {"train_runtime": 1.0}]
        (folder / "logging.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        time.sleep(0.01)
    log = troubleshooting.swift_log(tmp_path)
    assert troubleshooting.losses(log) == [2.0, 1.0]
    assert troubleshooting.swift_log(tmp_path / "missing") == []


def test_saving_and_slowdown():
    saved, slower = troubleshooting.saving_and_slowdown(
        {"peak_extra_mb": 200.0, "step_seconds": 2.0}, {"peak_extra_mb": 50.0, "step_seconds": 2.6}
    )
    assert saved == pytest.approx(0.75)
    assert slower == pytest.approx(1.3)


def test_stack_frames_of_a_py_spy_dump():
    frames = troubleshooting.stack_frames(PY_SPY_DUMP)
    assert frames[0] == "all_reduce (distributed_c10d.py:3245)"
    assert frames[2] == "sync_gradients (hang.py:23)"
    assert len(frames) == 4


def test_stack_frames_ignores_terminal_colours():
    coloured = "Thread 1 (idle)\n    \x1b[32mzz\x1b[0m (\x1b[36m<string>\x1b[0m:\x1b[2m2\x1b[0m)\n"
    assert troubleshooting.stack_frames(coloured) == ["zz (<string>:2)"]


def test_grep_source_reads_the_installed_swift():
    lines = troubleshooting.grep_source("trainers/mixin.py", "check_local_model_is_latest")
    assert lines and all(line.startswith("swift/trainers/mixin.py:") for line in lines)
    with_context = troubleshooting.grep_source("trainers/mixin.py", "use_reentrant_ = ", context=1)
    assert len(with_context) > len(troubleshooting.grep_source("trainers/mixin.py", "use_reentrant_ = "))


def test_python_script_returns_the_saved_result(build, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("from helpers.worker import save_result\nprint('hi')\nsave_result({'answer': 42})\n")
    result = troubleshooting.python_script(script, timeout=60, show=False)
    assert result.returncode == 0
    assert result.results == [{"answer": 42}]
    assert "hi" in result.lines


def test_prepared_scripts_run_side_by_side_each_with_its_own_result(build, tmp_path):
    script = tmp_path / "echo_arg.py"
    script.write_text(
        "import sys, time\nfrom helpers.worker import save_result\n"
        "start = time.time()\ntime.sleep(2)\nsave_result({'arg': sys.argv[1], 'span': [start, time.time()]})\n"
    )
    runs = launching.run(
        *[troubleshooting.prepare_python(script, a, timeout=60) for a in ("off", "on")], show=False
    )
    off, on = (r.results[0] for r in runs)
    assert (off["arg"], on["arg"]) == ("off", "on")
    assert on["span"][0] < off["span"][1] and off["span"][0] < on["span"][1], "they ran one after the other"


def test_python_script_is_stopped_at_its_timeout(build, tmp_path):
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n")
    start = time.perf_counter()
    with pytest.raises(launching.LaunchTimeout, match="did not finish within 2 s"):
        troubleshooting.python_script(script, timeout=2, show=False)
    assert time.perf_counter() - start < 20


@pytest.mark.skipif(troubleshooting.py_spy() is None, reason="py-spy is not installed")
def test_run_and_dump_sees_the_stuck_function(build, tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(
        "import time\n\ndef stuck_here():\n    time.sleep(60)\n\nprint('ready', flush=True)\nstuck_here()\n"
    )
    # a shell in between, as torchrun is: the worker is a child of the launched process
    launch = launching.Launch(
        ["sh", "-c", f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}; true"], timeout=6
    )
    outcome, dumps, seconds = troubleshooting.run_and_dump(
        launch, "stuck.py", ready="ready", ranks=1, timeout=6
    )
    assert isinstance(outcome, launching.LaunchTimeout)
    assert 5 < seconds < 30
    assert len(dumps) == 1
    frames = troubleshooting.stack_frames(next(iter(dumps.values())))
    assert any(f.startswith("stuck_here (stuck.py:") for f in frames), frames


def test_local_repo_path_is_used_by_swifts_loader_without_a_clone(tmp_path):
    import sys

    from transformers import LlamaConfig

    LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2).save_pretrained(
        tmp_path / "model"
    )
    before = list(sys.path)
    found = troubleshooting.local_repo_path_in_use(tmp_path / "model", tmp_path / "DeepSeek-VL")
    assert found["cloned"] is False and found["repo on the import path"] is True
    assert found["processor class from"].startswith(str(tmp_path / "DeepSeek-VL"))
    assert found["config read"] == "LlamaConfig"
    assert sys.path == before and "deepseek_vl" not in sys.modules


def test_hang_stacks_have_2_to_8_ranks_some_waiting_some_missing():
    for seed in range(40):
        stacks = nb12.hang_stacks(seed)
        assert 2 <= len(stacks) <= 8 and sorted(stacks) == list(range(len(stacks)))
        waiting, missing = nb12.stuck_and_missing(stacks)
        assert waiting and missing and waiting | missing == set(stacks) and not waiting & missing
    assert nb12.hang_stacks(3) == nb12.hang_stacks(3)  # seeded


def test_swift_use_reentrant_follows_swifts_source():
    reentrant = nb12.swift_use_reentrant
    assert reentrant(None, 2, False, False) is False  # plain DDP: non-reentrant
    assert reentrant(None, 1, False, False) is False  # NPROC_PER_NODE=1 starts torchrun too
    assert reentrant(None, None, False, False) is True  # one process, no torchrun
    assert (
        reentrant({}, 4, True, False) is True and reentrant(None, 2, False, True) is True
    )  # DeepSpeed, FSDP
    assert reentrant({"use_reentrant": True}, 2, False, False) is True  # the kwargs win
    assert reentrant({"preserve_rng_state": False}, 2, False, False) is False
    source = troubleshooting.swift_source("trainers/mixin.py").read_text()
    assert "if is_dist() and not self.is_deepspeed_enabled and not self.is_fsdp_enabled:" in source


def test_with_template_replaces_or_adds_the_flag():
    args = ["--model", "m", "--template", "chatml", "--model_type", "llama"]
    assert troubleshooting.with_template(args, "default") == [
        "--model",
        "m",
        "--model_type",
        "llama",
        "--template",
        "default",
    ]
    assert troubleshooting.with_template(["--model", "Qwen/Qwen2.5-7B"], "default")[-2:] == [
        "--template",
        "default",
    ]


def test_base_model_is_the_parameter_or_the_local_model_standing_in(tmp_path):
    from types import SimpleNamespace

    from helpers import models
    from helpers.errors import CourseError

    tiny = models.tiny_qwen2()
    gpu_with_folder = SimpleNamespace(name="gpu", model=tiny.path)
    info, note = troubleshooting.base_model(None, tiny, gpu_with_folder)
    assert info is tiny and "stands in for the base model" in note and "Qwen/Qwen2.5-7B" in note
    info, note = troubleshooting.base_model(tiny.path, tiny, SimpleNamespace(name="gpu", model=None))
    assert info.path == tiny.path and info.model_type == "qwen2" and note is None
    (tmp_path / "empty").mkdir()
    for bad, profile in ((str(tmp_path / "empty"), "gpu"), ("Qwen/Qwen2.5-7B", "cpu"), (3, "gpu")):
        with pytest.raises(CourseError, match="BASE_MODEL"):
            troubleshooting.base_model(bad, tiny, SimpleNamespace(name=profile, model=None))


def test_prompt_ids_end_where_the_answer_starts():
    from helpers import models

    tok = troubleshooting.swift_tokenizer(models.tiny_qwen2())
    assert tok.decode(troubleshooting.prompt_ids(tok, "default", "Hi?")).endswith(
        "### Human:\nHi?\n\n### Assistant:\n"
    )
    assert tok.decode(troubleshooting.prompt_ids(tok, "chatml", "Hi?")).endswith("<|im_start|>assistant\n")
