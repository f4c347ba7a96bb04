"""make gpu-check: what it runs on 1 and 8 GPUs is printed without a GPU (CI runs this dry part)."""

import re
import shlex

import pytest

from helpers import runner


def test_dry_run_prints_every_command_for_1_and_8_gpus(capsys):
    assert runner.gpu_check(dry=True) == 0
    out = capsys.readouterr().out
    papermill = [line for line in out.splitlines() if line.startswith("papermill ")]
    numbers = sorted(runner.GPU_CHECK)
    assert len(papermill) == 2 * len(numbers)
    for nproc, block in zip((1, 8), (papermill[: len(numbers)], papermill[len(numbers) :]), strict=True):
        assert [re.search(r"notebooks/(\d\d)_", line).group(1) for line in block] == numbers
        for line in block:
            argv = shlex.split(line)
            params = {argv[i + 1]: argv[i + 2] for i, word in enumerate(argv) if word == "-p"}
            assert params["PROFILE"] == "gpu"
            assert "NPROC" not in params or params["NPROC"] == str(nproc)
            assert "MODEL" not in params or params["MODEL"].endswith("tiny-qwen2-bf16")
    assert out.count("CUDA_VISIBLE_DEVICES=0 swift sft") == 1
    assert out.count("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 NPROC_PER_NODE=8 swift sft") == 1


def test_every_gpu_check_parameter_is_a_real_notebook_parameter():
    for notebook in runner.course_notebooks(runner.GPU_CHECK):
        given = runner.gpu_check_parameters(notebook, 2, "m")
        assert set(runner.GPU_CHECK[notebook.name[:2]]) <= set(given)


def test_a_misspelt_parameter_is_refused(monkeypatch):
    monkeypatch.setitem(runner.GPU_CHECK, "06", {"STEP": 4})
    notebook = runner.course_notebooks(["06"])[0]
    with pytest.raises(ValueError, match=r"has no parameter \['STEP'\]"):
        runner.gpu_check_parameters(notebook, 2, "m")


def test_without_a_gpu_the_real_check_stops_with_one_sentence(monkeypatch, capsys):
    monkeypatch.setattr("helpers.profiles.count_gpus", lambda: 0)
    monkeypatch.delenv("COURSE_GPU_SHAPE_ON_CPU", raising=False)
    assert runner.gpu_check() == 2
    assert "needs a CUDA GPU and none is visible here" in capsys.readouterr().err
