"""`make gpu-check SHAPE_ON_CPU=1 NPROC=2 PRETEND=h100` and `NPROC=1 PRETEND=rtx3090 ONLY="09 11 12"`: exactly
what `make gpu-check` runs on two GPUs and on one (the steps of gpu_check's plan: notebooks, parameters, the
printed commands), in the gpu shape on the CPU, with torch believing those cards are there:
COURSE_GPU_SHAPE_ON_CPU=1 takes every gpu value of every pick and the original tutorial's recipe (bf16, gradient
checkpointing, the system prompt) on the tiny Qwen2, with gloo for nccl and no CUDA. The 2-process run holds
every notebook of GPU_CHECK; the 1-process run the notebooks whose gpu path on one GPU is not their path on two
(gpu_check.ONE_GPU_PATHS, which tests/test_gpu_check.py holds to the notebooks' code): no notebook runs more
often than that. 03-06 (the Makefile's WHOLE_IN_SHAPE) run here and nowhere else in make test: the 2-process run
executes their lesson on the CPU ranks it takes on every machine, their GPU cell besides, and compares their
checked outputs with the committed ones, as the notebooks stage's nbval does for the others.

What a notebook did is read from what it recorded (``report.record``, which the runner collects into the
run's report.json), from the commands its launches ran (each recorded as ``Launch.command``) and from the
files it wrote, never from the wording of a printed line or the number of a cell.
"""

import glob
import json
import os
import subprocess

import nbformat
import pytest
import swift_cli
import test_gpu_check

from course import gpu_check
from helpers import lora, paths, selfcog, swiftcli

# the card torch believes in, in the kernel and in every process meant for the CPU (course/pretend/): any of
# those that touches CUDA fails the run at once, with the stack that did
PRETEND = {1: "rtx3090", 2: "h100"}
# the notebooks each shape runs: on one GPU only those whose path there differs from two GPUs'
NOTEBOOKS = {1: list(gpu_check.ONE_GPU_PATHS), 2: sorted(gpu_check.GPU_CHECK)}


@pytest.fixture(scope="module", params=[1, 2], ids=["1-process", "2-process"])
def shape(request):
    """One run of the make target, as a person types it, into a build folder of this test session's own;
    its folder, its output, the text DRY=1 printed and the notebooks it ran."""
    import shutil

    nproc = request.param
    build = paths.build_dir() / f"shape-{nproc}"
    shutil.rmtree(build, ignore_errors=True)
    env = {**os.environ, "COURSE_BUILD_DIR": str(build)}
    target = ["make", "--no-print-directory", "gpu-check", "SHAPE_ON_CPU=1", f"NPROC={nproc}", f"PRETEND={PRETEND[nproc]}"]
    if NOTEBOOKS[nproc] != sorted(gpu_check.GPU_CHECK):
        target.append(f"ONLY={' '.join(NOTEBOOKS[nproc])}")
    done = subprocess.run(target, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=2400)
    dry = subprocess.run([*target, "DRY=1"], cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    return {"nproc": nproc, "build": build, "folder": build / "gpu-check", "out": done.stdout, "dry": dry.stdout,
            "pretend": PRETEND[nproc], "notebooks": NOTEBOOKS[nproc]}  # fmt: skip


def ran(shape, *numbers: str) -> list[str]:
    """Those of ``numbers`` this shape runs; a test of notebooks it does not run is skipped, saying why."""
    found = [number for number in numbers if number in shape["notebooks"]]
    if not found:
        pytest.skip(f"the {shape['nproc']}-process shape runs {' '.join(shape['notebooks'])} only")
    return found


def metrics(shape, number: str) -> dict:
    """What notebook ``number`` recorded with ``report.record``, by name: its metrics in the run's
    report.json, where the runner collects them from the executed notebook."""
    report = json.loads((shape["folder"] / "report.json").read_text())
    [notebook] = [n for n in report["notebooks"] if n["name"][:2] == number]
    return {m["name"]: m["value"] for m in notebook["metrics"]}


def environment_of(command: str) -> dict[str, str]:
    """The environment a recorded ``swift`` command ran with (its ``VAR=value`` words before ``swift``)."""
    env, _, _ = swiftcli.parse_swift_text(command)
    return env


def test_every_notebook_of_gpu_check_passes(shape):
    report = json.loads((shape["folder"] / "report.json").read_text())
    assert report["profile"] == "gpu"
    assert [(n["name"][:2], n["status"]) for n in report["notebooks"]] == [(k, "passed") for k in shape["notebooks"]]


def test_the_run_executed_the_steps_dry_prints(shape):
    """The text at the top of the run is DRY=1's, and each notebook ran as its step says (papermill's record:
    input, output, parameters; the kernel)."""
    with gpu_check.environment({"COURSE_BUILD_DIR": str(shape["build"])}):
        plan = gpu_check.plan(shape["nproc"], shape_on_cpu=True, pretend=shape["pretend"], only=shape["notebooks"])
    assert plan.text() in shape["dry"] and plan.text() in shape["out"]
    assert [step.notebook.name[:2] for step in plan.steps] == shape["notebooks"]
    for step in plan.steps:
        executed = nbformat.read(step.out, as_version=4).metadata
        record = executed["papermill"]
        assert (record["input_path"], record["output_path"]) == (str(step.notebook), str(step.out))
        assert record["parameters"] == step.parameters and executed["kernelspec"]["name"] == step.kernel


def test_lessons_of_ranks_run_two_ranks_on_the_cpu_whatever_the_gpus(shape):
    """03-06 teach a mechanism: their ranks run on the CPU over gloo on every machine, two of them, whatever
    the GPUs (profiles.ranks_on_cpu)."""
    for number in ran(shape, "03", "04", "05", "06"):
        assert metrics(shape, number)["lesson_ranks"] == {"profile": "cpu", "backend": "gloo", "nproc": 2}, number


def test_lessons_of_ranks_run_their_script_once_more_on_two_gpus_or_more(shape):
    """Each of 03-06 has one GPU cell: with 2 GPUs it ran the lesson's script on them (one rank per GPU, gloo
    in the gpu shape where a GPU machine has nccl) and recorded its numbers as gpu_*. With one GPU the cell
    only says so (one GPU holds one nccl rank): profiles.on_gpus and no_gpu_run, tests/test_profiles.py."""
    for number in ran(shape, "03", "04", "05", "06"):
        got = metrics(shape, number)
        numbers = {name: value for name, value in got.items() if name.startswith("gpu_") and name != "gpu_ranks"}
        assert got["gpu_ranks"] == {"profile": "gpu", "backend": "gloo", "nproc": 2}, number
        assert numbers and all(isinstance(v, (int, float)) and v > 0 for v in numbers.values()), (number, numbers)


def test_09_runs_the_seeds_recipe_with_its_knobs_on_the_first_gpus(shape):
    from swift import SftArguments

    got = metrics(shape, "09")
    single = got["sft_single_command"]  # the command section 4's launch ran
    env = environment_of(single)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and "NPROC_PER_NODE" not in env  # the first GPU, one process
    args = swift_cli.parse(single, SftArguments)
    assert (args["torch_dtype"], args["use_cpu"], args["gradient_checkpointing"]) == ("bfloat16", True, True)
    assert (args["max_length"], args["learning_rate"], args["system"]) == (2048, 1e-4, selfcog.SYSTEM)
    assert args["gradient_checkpointing_kwargs"] is None  # SWIFT picks non-reentrant under DDP itself
    assert args["max_steps"] == gpu_check.GPU_CHECK["09"]["STEPS"]  # one process: as STEPS, at most 10 on N GPUs
    if shape["nproc"] > 1:
        ddp = got["sft_ddp_command"]
        env = environment_of(ddp)
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(shape["nproc"])))  # the first N GPUs
        assert env["NPROC_PER_NODE"] == str(shape["nproc"])
        assert swift_cli.parse(ddp, SftArguments)["torch_dtype"] == "bfloat16"
    else:  # one process cannot run DDP: no second run
        assert "sft_ddp_command" not in got and "ddp_wall_seconds" not in got


def test_09_compares_forgetting_on_the_same_identity_rows_each_run_in_its_own_process(shape):
    """Both kinds of run take the same sample of section 4's identity data, ABLATION_STEPS global batches of
    it, listed first ('identity + general' adds as many general rows, but the tiny random model writes no
    whole sentence, so here there are none); on gpu each sft_main run is a process of its own."""
    from swift import SftArguments

    runs = sorted(glob.glob(str(shape["folder"] / "sft-from-python" / "*" / "kwargs.json")))
    assert len(runs) == 2 * len(gpu_check.GPU_CHECK["09"]["SEEDS"])
    # sft.sft_process wrote each kwargs.json; the process it started (sft_from_python.py) wrote result.json
    assert all(os.path.isfile(os.path.join(os.path.dirname(p), "result.json")) for p in runs)

    def where(dataset: str) -> str:  # a local path as the repository's absolute path (commands give it relative)
        path, mark, rows = dataset.partition("#")
        return str((paths.ROOT / path).resolve()) + mark + rows if (paths.ROOT / path).exists() else dataset

    datasets = [[where(d) for d in json.loads(open(p, encoding="utf-8").read())["dataset"]] for p in runs]
    got = metrics(shape, "09")
    single = swift_cli.parse(got["sft_single_command"], SftArguments)
    assert [where(d) for d in single["dataset"]] == [str(selfcog.SELF_COGNITION)]  # no general data here
    rows = single["per_device_train_batch_size"] * single["gradient_accumulation_steps"]
    sample = [where(f"{selfcog.SELF_COGNITION}#{gpu_check.GPU_CHECK['09']['ABLATION_STEPS'] * rows}")]
    assert datasets == [sample, sample]
    assert {"forgetting_identity_only", "forgetting_identity_and_general"} <= set(got)  # both measured


def test_10_merges_and_answers_on_one_gpu_in_the_training_dtype(shape):
    from swift.arguments import ExportArguments, InferArguments

    [ten] = ran(shape, "10")
    got = metrics(shape, ten)
    for name, kind in (("export_command", ExportArguments), ("infer_command", InferArguments)):
        env = environment_of(got[name])  # the command the launch ran
        assert env["CUDA_VISIBLE_DEVICES"] == "0" and "NPROC_PER_NODE" not in env, name
        assert swift_cli.parse(got[name], kind)["torch_dtype"] == "bfloat16", name
    # each merged weight checked against W + (alpha/r)·B·A: within bfloat16's rounding bound
    assert got["merged_weight_dtype"] == "bfloat16" and 0 <= got["merged_weight_worst_error"] <= 1
    assert swift_cli.parse(got["infer_command"], InferArguments)["system"] == selfcog.SYSTEM  # 09's, asked with again


def test_11_and_12_run_the_commands_they_show(shape):
    """Each launch runs the text its cell shows (swiftcli.swift_shell parses that very text); what it ran is
    what the notebook recorded."""
    from swift import SftArguments

    nproc = shape["nproc"]
    eight = metrics(shape, "11")
    for name in ("zero2", "zero3"):
        command = eight[f"swift_{name}_command"]
        assert environment_of(command)["NPROC_PER_NODE"] == str(nproc), name
        args = swift_cli.parse(command, SftArguments)
        assert args["torch_dtype"] == "bfloat16" and name in args["deepspeed"], name
        # DeepSpeed's shards read back from the checkpoint it saved: split over every rank
        outcome = eight["swift_runs"][name]
        assert (outcome["kind"], outcome["ranks sharded over"]) == ("DeepSpeed ZeRO", nproc), name
    nine = metrics(shape, "12")
    got = swift_cli.parse(nine["base_default_template_command"], SftArguments)
    assert got["template"] == "default" and got["model"].endswith("tiny-qwen2-bf16")
    assert len(nine["base_model_default_template_losses"]) == gpu_check.GPU_CHECK["12"]["SWIFT_STEPS"]  # steps logged


# what nbval leaves out of a comparison without --nbdime (nbval/plugin.py, IPyNbFile.skip_compare), beside the
# metadata and execution counts not read here
NOT_COMPARED = ("image/png", "image/jpeg", "application/vnd.jupyter.widget-view+json")


def checked_outputs(notebook) -> dict:
    """What nbval compares in a ``# NBVAL_CHECK_OUTPUT`` cell, by cell id: each stream's text, and every other
    output's data by type but pictures and widget ids (NOT_COMPARED), and an error's name and value."""
    found = {}
    for cell in notebook.cells:
        if cell.cell_type == "code" and cell.source.startswith("# NBVAL_CHECK_OUTPUT"):
            streams, values = {}, []
            for output in cell.outputs:
                if output.output_type == "stream":
                    streams[output.name] = streams.get(output.name, "") + output.text
                elif output.output_type == "error":
                    values.append(("error", output.ename, output.evalue))
                else:
                    values.append({k: v for k, v in output.get("data", {}).items() if k not in NOT_COMPARED})
            found[cell.id] = (streams, values)
    return found


def test_the_lessons_it_runs_whole_print_their_checked_outputs_as_committed(shape):
    """03-06 run here cell by cell and nowhere else in make test (test_gpu_check.whole_in_shape): the checks nbval
    makes in the notebooks stage are made here, each checked cell's text against the committed notebook's."""
    for number in ran(shape, *test_gpu_check.whole_in_shape()):
        [executed] = (shape["folder"] / "executed").glob(f"{number}_*.ipynb")
        committed = checked_outputs(nbformat.read(paths.NOTEBOOKS / executed.name, as_version=4))
        assert committed, f"{executed.name} has no checked cell"
        assert checked_outputs(nbformat.read(executed, as_version=4)) == committed, executed.name


def test_every_gpu_notebook_ends_holding_no_model(shape):
    """Each records it after models.release(), which stops the notebook while a model is still referenced."""
    for number in ran(shape, "09", "10", "11", "12"):
        assert metrics(shape, number).get("no_model_held_at_end") is True, number


def test_the_check_wrote_only_under_its_own_folder(shape):
    record = json.loads((shape["folder"] / "outputs" / lora.LATEST_FILE).read_text())
    assert set(record) == {"gpu"} and record["gpu"]["checkpoint"].startswith(str(shape["folder"]))
    assert record["gpu"]["dtype"] == "bfloat16"
    assert not (paths.outputs_dir() / lora.LATEST_FILE).is_file() or "gpu" not in json.loads(
        (paths.outputs_dir() / lora.LATEST_FILE).read_text()
    )
