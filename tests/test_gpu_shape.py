"""`make gpu-check SHAPE_ON_CPU=1 NPROC=1` and `NPROC=2`: exactly what `make gpu-check` runs on one GPU and
on two (the notebooks of runner.GPU_CHECK, their parameters, the printed commands), in the gpu shape on the
CPU: COURSE_GPU_SHAPE_ON_CPU=1 takes every gpu value of every pick and the seed's recipe (bf16, gradient
checkpointing, the system prompt) on the tiny Qwen2, with gloo for nccl and no CUDA. Nothing is picked by
hand: a notebook that joins GPU_CHECK joins these runs.
"""

import glob
import json
import os
import subprocess

import nbformat
import pytest
import swift_cli

from course import runner
from helpers import lora, paths, selfcog


@pytest.fixture(scope="module", params=[1, 2], ids=["1-process", "2-process"])
def shape(request):
    """One run of the make target, as a person types it, into a build folder of this test session's own;
    its folder, its output and the script it printed."""
    import shutil

    nproc = request.param
    build = paths.build_dir() / f"shape-{nproc}"
    shutil.rmtree(build, ignore_errors=True)
    env = {**os.environ, "COURSE_BUILD_DIR": str(build)}
    target = ["make", "--no-print-directory", "gpu-check", "SHAPE_ON_CPU=1", f"NPROC={nproc}"]
    done = subprocess.run(target, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=2400)
    dry = subprocess.run([*target, "DRY=1"], cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    return {"nproc": nproc, "build": build, "folder": build / "gpu-check", "out": done.stdout, "dry": dry.stdout}


def executed(shape, number: str):
    [path] = glob.glob(str(shape["folder"] / "executed" / f"{number}_*.ipynb"))
    return nbformat.read(path, as_version=4)


def outputs(shape, number: str) -> dict[str, str]:
    """Each cell's printed text, by cell id."""
    nb = executed(shape, number)
    return {c.get("id"): "".join(o.get("text", "") for o in c.get("outputs", [])) for c in nb.cells}


def shown_commands(text: str, program: str = "swift") -> list[str]:
    """Every command a cell printed to type: ``[VAR=value ...] swift ...`` with its continuation lines."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        words = line.split()
        if program in words and all("=" in w for w in words[: words.index(program)]) and not line.startswith("$"):
            block = [line]
            while block[-1].rstrip().endswith("\\"):
                block.append(lines[i + len(block)])
            found.append("\n".join(block))
    return found


def test_every_notebook_of_gpu_check_passes(shape):
    report = json.loads((shape["folder"] / "report.json").read_text())
    assert report["profile"] == "gpu"
    assert [(n["name"][:2], n["status"]) for n in report["notebooks"]] == [(k, "passed") for k in sorted(runner.GPU_CHECK)]


def test_the_run_executed_the_text_dry_prints(shape):
    """The script at the top of the run is DRY=1's, and each notebook got the parameters its line gives."""
    with runner.environment({"COURSE_BUILD_DIR": str(shape["build"])}):
        script = runner.gpu_check_script(shape["nproc"], shape_on_cpu=True)
    assert script in shape["dry"] and script in shape["out"]
    _, calls = runner.read_script(script)
    for call in calls:
        nb = nbformat.read(paths.ROOT / call["output_path"], as_version=4)
        assert nb.metadata["papermill"]["parameters"] == call["parameters"]


def test_lessons_of_ranks_run_two_ranks_on_one_gpu(shape):
    for number in ("03", "04"):
        text = outputs(shape, number)["c03"]
        assert ("runs 2 ranks on the CPU over gloo" in text) is (shape["nproc"] == 1), number
    assert "2 ranks x" in outputs(shape, "04")["c03"]  # 04's ranks: two, whatever NPROC was


def test_06_runs_the_seeds_recipe_with_its_knobs_on_the_first_gpus(shape):
    from swift import SftArguments

    out = outputs(shape, "06")
    [single] = shown_commands(out["c14"])
    got = swift_cli.parse(single, SftArguments)
    assert "CUDA_VISIBLE_DEVICES=0 " in single.splitlines()[0]  # the first GPU, named in the gpu shape too
    assert (got["torch_dtype"], got["use_cpu"], got["gradient_checkpointing"]) == ("bfloat16", True, True)
    assert (got["max_length"], got["learning_rate"], got["system"]) == (2048, 1e-4, selfcog.SYSTEM)
    assert got["gradient_checkpointing_kwargs"] is None  # SWIFT picks non-reentrant under DDP itself
    assert got["max_steps"] == runner.GPU_CHECK["06"]["STEPS"]  # one process: as STEPS, at most 10 on N GPUs
    if shape["nproc"] > 1:
        [ddp] = shown_commands(out["c16"])
        assert "CUDA_VISIBLE_DEVICES=0,1" in ddp and "NPROC_PER_NODE=2" in ddp
    else:
        assert "one process cannot run DDP" in out["c16"]


def test_06_compares_forgetting_on_the_same_identity_data_each_run_in_its_own_process(shape):
    """'identity only' trains on the identity part of the very data section 4 trained on, 'identity +
    general' on all of it (the tiny random model writes no whole sentence, so here that is identity data
    alone too); on gpu each sft_main run is a process of its own."""
    from swift import SftArguments

    runs = sorted(glob.glob(str(shape["folder"] / "sft-from-python" / "*" / "kwargs.json")))
    assert len(runs) == 2 * len(runner.GPU_CHECK["06"]["SEEDS"])
    def where(dataset: str) -> str:  # a local path as the repository's absolute path (commands show it relative)
        path, mark, rows = dataset.partition("#")
        return str((paths.ROOT / path).resolve()) + mark + rows if (paths.ROOT / path).exists() else dataset

    datasets = [[where(d) for d in json.loads(open(p, encoding="utf-8").read())["dataset"]] for p in runs]
    [single] = shown_commands(outputs(shape, "06")["c14"])
    trained = [where(d) for d in swift_cli.parse(single, SftArguments)["dataset"]]
    assert sorted(datasets) == sorted([[str(selfcog.SELF_COGNITION)], trained])
    assert "sft_from_python.py" in outputs(shape, "06")["c23"]


def test_07_merges_and_answers_on_one_gpu_in_the_training_dtype(shape):
    from swift.arguments import ExportArguments, InferArguments

    out = outputs(shape, "07")
    [export] = shown_commands(out["c07"])
    [infer] = shown_commands(out["c15"])
    for text, kind in ((export, ExportArguments), (infer, InferArguments)):
        assert "CUDA_VISIBLE_DEVICES=0 " in text.splitlines()[0]
        assert swift_cli.parse(text, kind)["torch_dtype"] == "bfloat16"
    assert "within bfloat16 rounding: True" in out["c13"]  # each merged weight checked
    assert "'You are a helpful assistant.'" in out["c03"]  # 06's system prompt, asked with again


def test_08_and_09_run_the_commands_they_show(shape):
    from swift import SftArguments

    nproc = shape["nproc"]
    deepspeed = shown_commands(outputs(shape, "08")["c37"])
    assert len(deepspeed) == 2 and all(f"NPROC_PER_NODE={nproc}" in c for c in deepspeed)
    assert [swift_cli.parse(c, SftArguments)["torch_dtype"] for c in deepspeed] == ["bfloat16"] * 2
    assert f"'ranks sharded over': {nproc}" in outputs(shape, "08")["c37"]  # DeepSpeed's bf16 shards read back
    nine = outputs(shape, "09")
    [base] = shown_commands(nine["c25b"])
    got = swift_cli.parse(base, SftArguments)
    assert got["template"] == "default" and got["model"].endswith("tiny-qwen2-bf16")
    assert f"{runner.GPU_CHECK['09']['SWIFT_STEPS']} steps logged" in nine["c25b"]


def test_every_gpu_notebook_ends_holding_no_model(shape):
    for number in ("06", "07", "08", "09"):
        assert outputs(shape, number)["free"].startswith("No model is held by this kernel"), number


def test_the_check_wrote_only_under_its_own_folder(shape):
    record = json.loads((shape["folder"] / "outputs" / lora.LATEST_FILE).read_text())
    assert set(record) == {"gpu"} and record["gpu"]["checkpoint"].startswith(str(shape["folder"]))
    assert record["gpu"]["dtype"] == "bfloat16"
    assert not (paths.outputs_dir() / lora.LATEST_FILE).is_file() or "gpu" not in json.loads(
        (paths.outputs_dir() / lora.LATEST_FILE).read_text()
    )
