"""helpers.troubleshooting: reading launch output, SWIFT logs, py-spy stacks and who may take them, and the 12
exercise checkers."""

import json
import os
import shlex
import sys
import time

import launched
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
    script.write_text("from launched import save_result\nprint('hi')\nsave_result({'answer': 42})\n")
    launched.beside(script)
    result = troubleshooting.python_script(script, timeout=60, show=False)
    assert result.returncode == 0
    assert result.results == [{"answer": 42}]
    assert "hi" in result.lines


def test_prepared_scripts_run_side_by_side_each_with_its_own_result(build, tmp_path):
    script = tmp_path / "echo_arg.py"
    script.write_text(
        "import sys, time\nfrom launched import save_result\n"
        "start = time.time()\ntime.sleep(2)\nsave_result({'arg': sys.argv[1], 'span': [start, time.time()]})\n"
    )
    launched.beside(script)
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


# --- who may ptrace whom: the kernel's rules, on a made-up /proc ----------------------------------------

PTRACE_BIT = 1 << troubleshooting.CAP_SYS_PTRACE
ALL_CAPS = (1 << 41) - 1  # CapBnd of a root process with every capability
# a made-up process tree: 100 is the tracer, 200 its child, 201 its grandchild, 400 a stranger, 500 another user's
TREE = {100: (1, 1000), 200: (100, 1000), 201: (200, 1000), 400: (1, 1000), 500: (1, 2000)}


def status_text(ppid: int, uid: int, eff: int = 0, bnd: int = ALL_CAPS, amb: int = 0) -> str:
    return (
        f"Name:\tpython\nPPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        f"CapInh:\t{0:016x}\nCapPrm:\t{eff:016x}\nCapEff:\t{eff:016x}\nCapBnd:\t{bnd:016x}\nCapAmb:\t{amb:016x}\n"
    )


def fake_proc(folder, scope, me: str) -> "os.PathLike":
    """/proc with ``kernel.yama.ptrace_scope`` = ``scope`` (None: no Yama), the tree above, and "self" (this
    process, 100's parent, also uid 1000) that is: "user" (no capability), "user+eff" (CAP_SYS_PTRACE effective
    but not ambient: gone after execve), "user+amb" (ambient), "root" (uid 0, every capability), or
    "root-ptrace" (uid 0 in a container whose bounding set lacks CAP_SYS_PTRACE)."""
    proc = folder / f"proc-{scope}-{me}"
    if scope is not None:
        (proc / "sys" / "kernel" / "yama").mkdir(parents=True)
        (proc / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(f"{scope}\n")
    selves = {
        "user": status_text(1, 1000),
        "user+eff": status_text(1, 1000, eff=PTRACE_BIT),
        "user+amb": status_text(1, 1000, eff=PTRACE_BIT, amb=PTRACE_BIT),
        "root": status_text(1, 0, eff=ALL_CAPS),
        "root-ptrace": status_text(1, 0, eff=ALL_CAPS & ~PTRACE_BIT, bnd=ALL_CAPS & ~PTRACE_BIT),
    }
    tree = {
        pid: (ppid, 0 if me.startswith("root") and pid != 500 else uid) for pid, (ppid, uid) in TREE.items()
    }
    for pid, text in [("self", selves[me])] + [
        (pid, status_text(ppid, uid)) for pid, (ppid, uid) in tree.items()
    ]:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "status").write_text(text)
    return proc


@pytest.mark.parametrize(
    "scope, me, tracer, target, allowed",
    [
        # no Yama, or scope 0: the classic rules, same user or CAP_SYS_PTRACE
        (None, "user", None, 400, True),
        (0, "user", None, 400, True),
        (0, "user", None, 500, False),  # another user's process
        (0, "user+eff", None, 500, False),  # an effective capability does not survive py-spy's execve
        (0, "user+amb", None, 500, True),  # an ambient one does
        (0, "root", None, 500, True),
        # scope 1: descendants only, unless CAP_SYS_PTRACE
        (1, "user", None, 200, False),  # py-spy, just started, has no descendants
        (1, "user", 100, 200, True),  # a child of the tracer
        (1, "user", 100, 201, True),  # a grandchild
        (1, "user", 100, 400, False),  # not a descendant
        (1, "user", 200, 100, False),  # the tracer's parent
        (1, "user+amb", None, 400, True),
        (1, "root", None, 400, True),
        (1, "root-ptrace", None, 400, False),  # root in a container without CAP_SYS_PTRACE
        # scope 2: CAP_SYS_PTRACE only
        (2, "user", 100, 200, False),
        (2, "user", None, 400, False),
        (2, "root", None, 400, True),
        (2, "root-ptrace", None, 400, False),
        # scope 3: nobody
        (3, "root", None, 400, False),
        (3, "user", 100, 200, False),
    ],
)
def test_ptrace_permission_follows_the_kernels_rules(tmp_path, scope, me, tracer, target, allowed):
    ok, why = troubleshooting.ptrace_permission(target, tracer=tracer, proc=fake_proc(tmp_path, scope, me))
    assert ok is allowed, why
    assert why and "\n" not in why
    if not ok and scope:
        assert f"ptrace_scope is {scope}" in why or "another user" in why
    if me == "user+eff" and not ok:
        assert "without CAP_SYS_PTRACE" in why


def test_ptrace_permission_of_a_process_that_has_ended(tmp_path):
    ok, why = troubleshooting.ptrace_permission(999, proc=fake_proc(tmp_path, 0, "user"))
    assert not ok and why == "process 999 has ended"


# --- section 5 of 12: py-spy on the stuck ranks, or the stacks recorded with permission ----------------

REFUSED = (
    "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'"
)


def stuck_launch(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(
        "import time\n\ndef stuck_here():\n    time.sleep(60)\n\nprint('ready', flush=True)\nstuck_here()\n"
    )
    # a shell in between, as torchrun is: the worker is a child of the launched process
    return launching.Launch(
        ["sh", "-c", f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}; true"], timeout=6
    )


def refusing_py_spy(tmp_path):
    """A py-spy that answers as the real one does when the kernel refuses it (py-spy 0.4.2, as nobody on a
    root process), and leaves a mark that it ran."""
    exe = tmp_path / "py-spy"
    exe.write_text(
        f"#!/bin/sh\ntouch {shlex.quote(str(tmp_path / 'py-spy-ran'))}\nprintf '%s' {shlex.quote(REFUSED)} >&2\nexit 1\n"
    )
    exe.chmod(0o755)
    return exe


def the_hang_is_shown(stacks):
    """Notebook 12's own check on section 5's stacks: one rank in sync_gradients' all_reduce, one waiting."""
    frames = list(stacks.values())
    in_all_reduce = sum(any(f.startswith("sync_gradients") for f in s) for s in frames)
    waiting = sum(any(f.startswith("wait_for_input") for f in s) for s in frames)
    return in_all_reduce == 1 and waiting == 1


def test_without_ptrace_permission_section_5_shows_the_stacks_recorded_with_permission(
    build, tmp_path, monkeypatch
):
    monkeypatch.setattr(troubleshooting, "py_spy", lambda: str(refusing_py_spy(tmp_path)))
    why = "kernel.yama.ptrace_scope is 1 (faked for this test)"
    monkeypatch.setattr(
        troubleshooting, "ptrace_permission", lambda pid, tracer=None, proc=None: (False, why)
    )
    outcome, dumps, seconds = troubleshooting.run_and_dump(
        stuck_launch(tmp_path), "stuck.py", ready="ready", ranks=1, timeout=6
    )
    assert isinstance(outcome, launching.LaunchTimeout) and len(dumps) == 1
    assert not (tmp_path / "py-spy-ran").exists(), "py-spy was run although the permission check said no"
    stacks, note = troubleshooting.hang_stacks(dumps)
    assert the_hang_is_shown(stacks), stacks
    recorded = troubleshooting.recorded_hang()
    assert set(stacks) == set(recorded["dumps"])
    assert note.startswith(f"py-spy may not read the workers here: {why}; ") and note.count(". ") == 0
    assert f"recorded on {recorded['machine']} with permission" in note and note.endswith(".")


def test_a_py_spy_refused_despite_the_rules_falls_back_too(tmp_path, monkeypatch):
    monkeypatch.setattr(troubleshooting, "py_spy", lambda: str(refusing_py_spy(tmp_path)))
    monkeypatch.setattr(
        troubleshooting, "ptrace_permission", lambda pid, tracer=None, proc=None: (True, "same user")
    )
    dumps = troubleshooting.dump_stacks([os.getpid()])
    assert (tmp_path / "py-spy-ran").exists() and REFUSED in dumps[os.getpid()]
    stacks, note = troubleshooting.hang_stacks(dumps)
    assert the_hang_is_shown(stacks) and "py-spy itself was refused (Permission Denied)" in note


def test_live_stacks_are_shown_as_they_are_and_missing_ones_fail_the_check():
    stacks, note = troubleshooting.hang_stacks(
        {7: PY_SPY_DUMP, 8: "Thread 8 (idle)\n    wait_for_input (hang.py:19)\n"}
    )
    assert note is None and stacks[7][2] == "sync_gradients (hang.py:23)" and the_hang_is_shown(stacks)
    empty = troubleshooting.hang_stacks({7: PY_SPY_DUMP, 8: ""})[0]  # an empty dump stays empty
    assert not the_hang_is_shown(empty)
    assert troubleshooting.hang_stacks({}) == ({}, None)  # nothing dumped: nothing shown, and the check fails


def test_the_recorded_hang_is_a_real_py_spy_dump_labelled_with_its_machine():
    recorded = troubleshooting.recorded_hang()
    assert "with CAP_SYS_PTRACE" in recorded["machine"] and "py-spy" in recorded["how"]
    assert len(recorded["dumps"]) == 2
    for pid, text in recorded["dumps"].items():
        assert text.startswith(f"Process {pid}: ") and "hang.py" in text.splitlines()[0]
        assert f'Thread {pid} (idle): "MainThread"' in text
    stacks = {pid: troubleshooting.stack_frames(text) for pid, text in recorded["dumps"].items()}
    assert the_hang_is_shown(stacks)


@pytest.mark.skipif(troubleshooting.py_spy() is None, reason="py-spy is not installed")
@pytest.mark.skipif(
    not troubleshooting.ptrace_permission(os.getpid())[0],
    reason="py-spy may not read processes here: " + troubleshooting.ptrace_permission(os.getpid())[1],
)
def test_run_and_dump_sees_the_stuck_function(build, tmp_path):
    outcome, dumps, seconds = troubleshooting.run_and_dump(
        stuck_launch(tmp_path), "stuck.py", ready="ready", ranks=1, timeout=6
    )
    assert isinstance(outcome, launching.LaunchTimeout)
    assert 5 < seconds < 30
    assert len(dumps) == 1
    frames = troubleshooting.stack_frames(next(iter(dumps.values())))
    assert any(f.startswith("stuck_here (stuck.py:") for f in frames), frames
    stacks, note = troubleshooting.hang_stacks(dumps)
    assert note is None, note  # with permission: the live stacks, nothing recorded
    assert list(stacks.values()) == [frames]


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
