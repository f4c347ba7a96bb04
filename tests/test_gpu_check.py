"""make gpu-check: the script it runs, printed without a GPU (DRY=1), read back the way papermill reads it;
its own folder and limits; and one sentence when the python running it cannot."""

import os
import re
import shlex
import subprocess

import pytest

from course import runner
from helpers import launching, paths, profiles


def papermill_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("papermill ")]


def test_dry_run_prints_every_command_for_1_and_8_gpus(capsys):
    assert runner.gpu_check(dry=True) == 0
    out = capsys.readouterr().out
    papermill = papermill_lines(out)
    numbers = sorted(runner.GPU_CHECK)
    assert len(papermill) == 2 * len(numbers)
    for nproc, block in zip((1, 8), (papermill[: len(numbers)], papermill[len(numbers) :]), strict=True):
        assert [re.search(r"notebooks/(\d\d)_", line).group(1) for line in block] == numbers
        for line in block:
            params = runner.papermill_call(line)["parameters"]
            assert params["PROFILE"] == "gpu"
            assert "NPROC" not in params or params["NPROC"] == nproc
            assert "MODEL" not in params or params["MODEL"].endswith("tiny-qwen2-bf16")
    assert out.count("#   CUDA_VISIBLE_DEVICES=0 swift sft") == 1
    assert out.count("#   CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 NPROC_PER_NODE=8 swift sft") == 1


@pytest.mark.parametrize("shape_on_cpu", [False, True])
def test_the_printed_script_reads_back_as_exactly_gpu_checks_parameters(shape_on_cpu):
    """What papermill's own command line makes of each printed line is what GPU_CHECK says: `-p SEEDS '[1]'`
    would arrive as the string '[1]', so lists travel as YAML (-y)."""
    text = runner.gpu_check_script(2, shape_on_cpu)
    env, calls = runner.read_script(text)
    assert [os.path.basename(c["input_path"])[:2] for c in calls] == sorted(runner.GPU_CHECK)
    for call in calls:
        notebook = paths.ROOT / call["input_path"]
        number = notebook.name[:2]
        assert {k: call["parameters"][k] for k in runner.GPU_CHECK[number]} == runner.GPU_CHECK[number]
        assert call["parameters"]["PROFILE"] == "gpu"
        assert call["cwd"] == "notebooks" and call["execution_timeout"] == runner.GPU_CHECK_CELL_TIMEOUT
        model = call["parameters"].get("MODEL")
        if model is not None:  # relative to --cwd notebooks, where the kernel starts
            assert (paths.NOTEBOOKS / model).resolve() == (paths.ROOT / env["COURSE_MODELS_DIR"] / "tiny-qwen2-bf16")
    nine = next(c for c in calls if os.path.basename(c["input_path"]).startswith("09"))
    assert nine["parameters"]["SEEDS"] == [1]  # a list, not '[1]'
    assert env[launching.LAUNCH_TIMEOUT_CAP] == str(runner.GPU_CHECK_LAUNCH_TIMEOUT)
    assert runner.GPU_CHECK_LAUNCH_TIMEOUT < runner.GPU_CHECK_CELL_TIMEOUT  # the launch's own timeout fires first
    assert (env.get(profiles.GPU_SHAPE_ON_CPU) == "1") is shape_on_cpu


def test_a_shell_splits_the_printed_lines_as_the_check_reads_them():
    """The check reads each line with shlex; bash, given the same text, passes the same words."""
    text = runner.gpu_check_script(1)
    for line in papermill_lines(text):
        argv = subprocess.run(
            ["bash", "-c", "printf '%s\\0' " + line.removeprefix("papermill ")],
            capture_output=True, text=True, check=True,
        ).stdout.split("\0")[:-1]  # fmt: skip
        assert argv == shlex.split(line)[1:]


def test_gpu_check_writes_only_under_its_own_folder():
    """A learner's own gpu record, adapters and models are never touched by the check's tiny model."""
    env = runner.gpu_check_env()
    folder = runner.gpu_check_folder()
    for key in ("COURSE_BUILD_DIR", "COURSE_OUTPUTS_DIR", "COURSE_MODELS_DIR"):
        with runner.environment({key: env[key]}):
            where = {"COURSE_BUILD_DIR": paths.build_dir, "COURSE_OUTPUTS_DIR": paths.outputs_dir,
                     "COURSE_MODELS_DIR": paths.models_dir}[key]()  # fmt: skip
        assert where.is_relative_to(folder), (key, where)
    assert not paths.outputs_dir().is_relative_to(folder)


def test_every_gpu_check_parameter_is_a_real_notebook_parameter():
    for notebook in runner.course_notebooks(runner.GPU_CHECK):
        given = runner.gpu_check_parameters(notebook, 2, "m")
        assert set(runner.GPU_CHECK[notebook.name[:2]]) <= set(given)


def test_a_misspelt_parameter_is_refused(monkeypatch):
    monkeypatch.setitem(runner.GPU_CHECK, "09", {"STEP": 4})
    notebook = runner.course_notebooks(["09"])[0]
    with pytest.raises(ValueError, match=r"has no parameter \['STEP'\]"):
        runner.gpu_check_parameters(notebook, 2, "m")


def test_without_a_gpu_the_real_check_stops_with_one_sentence_naming_the_fix(monkeypatch, capsys):
    """A CPU build of torch (the lock's): the check says so, with torch.version.cuda, and what to do."""
    import torch

    monkeypatch.delenv(profiles.GPU_SHAPE_ON_CPU, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)  # as the lock's CPU build, also in a CUDA .venv
    assert runner.gpu_check() == 2
    err = capsys.readouterr().err.strip()
    assert "a CPU build (torch.version.cuda is None)" in err and "COURSE_KEEP_TORCH=1 make setup" in err
    assert "SHAPE_ON_CPU=1" in err and "\n" not in err
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build that cannot use the GPU: why, in a sentence
    from helpers import environment

    why = "torch 2.13.0 is a CUDA 12.8 build, and this machine's NVIDIA driver 470.82 runs CUDA up to 11.4: ..."
    monkeypatch.setattr(environment, "cuda_problem", lambda: why)
    assert runner.gpu_python_problem() == f"make gpu-check: {why}"
    monkeypatch.setattr(environment, "cuda_problem", lambda: "")  # nothing torch can name: it sees no GPU
    monkeypatch.setattr(profiles, "count_gpus", lambda: 0)
    assert "sees no GPU" in runner.gpu_python_problem() and "nvidia-smi" in runner.gpu_python_problem()
    monkeypatch.setattr(profiles, "count_gpus", lambda: 1)
    assert runner.gpu_python_problem() is None


def test_a_python_without_the_course_packages_is_named(monkeypatch):
    """A venv that holds only a CUDA torch lacks papermill and SWIFT: say which, and how to add them."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("papermill", "swift") else real(name, *a))
    problem = runner.gpu_python_problem()
    assert "lacks papermill, swift" in problem and "COURSE_KEEP_TORCH=1 make setup" in problem


def test_make_runs_the_check_with_its_own_flags():
    """`make gpu-check SHAPE_ON_CPU=1 NPROC=2` is the command a person runs and make test runs."""
    dry = subprocess.run(["make", "-n", "gpu-check", "SHAPE_ON_CPU=1", "NPROC=2"], cwd=paths.ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert ".venv/bin/python -m course.runner gpu-check --nproc 2 --shape-on-cpu" in dry
    real = subprocess.run(["make", "-n", "gpu-check"], cwd=paths.ROOT, capture_output=True, text=True, check=True).stdout
    assert "PYTHONPATH=" in real and ".venv/bin/python -m course.runner gpu-check" in real
    assert "setup.sh" not in real  # set-up would put the lock's CPU torch into a CUDA .venv
    pretend = subprocess.run(["make", "-n", "gpu-check", "SHAPE_ON_CPU=1", "NPROC=2", "PRETEND=h100"], cwd=paths.ROOT,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "gpu-check --nproc 2 --shape-on-cpu --pretend h100" in pretend
    for words in (["--pretend", "h100"], ["--shape-on-cpu", "--pretend", "a100"]):  # on a GPU; a card it lacks
        refused = subprocess.run([".venv/bin/python", "-m", "course.runner", "gpu-check", *words], cwd=paths.ROOT,
                                 capture_output=True, text=True)  # fmt: skip
        assert refused.returncode == 2 and "goes with SHAPE_ON_CPU=1 and names a card: rtx3090" in refused.stderr
    bad = subprocess.run([".venv/bin/python", "-m", "course.runner", "gpu-check", "--nproc", "two"],
                         cwd=paths.ROOT, capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "NPROC = 'two' must be a whole number" in bad.stderr
