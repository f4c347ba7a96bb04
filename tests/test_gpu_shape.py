"""The gpu profile in its gpu shape, on the CPU: what a GPU run does, except CUDA and nccl.

PROFILE = "gpu" with ``COURSE_GPU_SHAPE_ON_CPU=1`` takes every gpu value of every pick and the seed's
recipe (bf16 weights, gradient checkpointing, an explicit system prompt, the nearest global batch), on the
tiny Qwen2 driven through SWIFT's qwen2_5 template, over gloo, with 1 and 3 processes (MATRIX). The notebooks get the parameters
``make gpu-check`` gives them on a GPU (runner.GPU_CHECK); 03 and 04 are left to the GPU itself.
"""

import json

import nbformat
import pytest
import swift_cli

from helpers import profiles, runner


@pytest.fixture
def gpu_shape(tmp_path, monkeypatch):
    monkeypatch.setenv(profiles.GPU_SHAPE_ON_CPU, "1")
    monkeypatch.setenv("COURSE_OUTPUTS_DIR", str(tmp_path / "outputs"))
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path / "build"))  # run_course sets it; restored after
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    return tmp_path / "build"


def swift_commands(text: str) -> list[str]:
    """Every ``swift`` command a cell printed as text to type (its lines joined by trailing backslashes)."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if " swift " in f" {line}" and line.rstrip().endswith("\\") and not line.startswith(("$", "▶")):
            block = [line]
            while block[-1].rstrip().endswith("\\"):
                block.append(lines[i + len(block)])
            found.append("\n".join(block))
    return found


def outputs(executed) -> dict[str, str]:
    """Each cell's printed text, by cell id."""
    nb = nbformat.read(executed, as_version=4)
    return {c.get("id"): "".join(o.get("text", "") for o in c.get("outputs", [])) for c in nb.cells}


# Which notebooks run with how many processes: 3 is where 16 does not divide (06, and 07 merging its
# adapter); 1 is one GPU, where every DDP comparison is skipped. 08 and 09 with 3 processes, and all four
# with 2, pass too (run by hand) but would cost make test about 4 more minutes; the smoke course runs 2.
MATRIX = {3: ["06", "07"], 1: ["06", "08", "09"]}


@pytest.mark.parametrize("nproc", sorted(MATRIX, reverse=True))
def test_gpu_check_passes_06_to_09_in_the_gpu_shape(gpu_shape, nproc):
    only = MATRIX[nproc]
    assert runner.gpu_check(build=gpu_shape, only=only, nproc=nproc) == 0
    report = json.loads((gpu_shape / "report.json").read_text())
    assert report["profile"] == "gpu"
    assert [(n["name"][:2], n["status"]) for n in report["notebooks"]] == [(o, "passed") for o in only]
    out = {n["name"][:2]: outputs(gpu_shape / "executed" / f"{n['name']}.ipynb") for n in report["notebooks"]}
    if "06" in out:
        sixth = out["06"]
        shown = " ".join(sixth["c14"].replace("\\\n", " ").split())  # the command as printed, one flag per line
        for flag in ("--model_type qwen2 --template qwen2_5", "--torch_dtype bfloat16", "--use_cpu true",
                     "--gradient_checkpointing true", "--system 'You are a helpful assistant.'",
                     "--warmup_ratio 0.05", "--learning_rate 0.0001", "--max_length 2048"):  # fmt: skip
            assert flag in shown, flag
        assert "CUDA_VISIBLE_DEVICES=0 swift sft" in sixth["c03b"]  # the 1-GPU command shown before any run
    if "07" in out:
        seventh = out["07"]
        assert "--torch_dtype bfloat16" in "".join(seventh.values())  # merged in the base model's dtype
        assert "within bfloat16 rounding: True" in seventh["c13"]  # each merged bf16 weight checked
        assert (
            "in every question here: 'You are a helpful assistant.'" in seventh["c03"]
        )  # 06's system prompt
        assert "--system 'You are a helpful assistant.'" in seventh["c06b"]
    if "08" in out:  # DeepSpeed's bf16 shards (bf16_zero_pp_rank_*) were found and read
        assert f"'ranks sharded over': {nproc}" in out["08"]["c37"]
    if nproc == 1:  # one GPU: no DDP comparison, said in a sentence, never a failure
        assert "one process cannot run DDP" in out["06"]["c16"]
        assert "every run of this execution in its own new numbered folder: True" in out["06"]["c34"]
        assert "section 3 runs 2 ranks on the CPU over gloo" in out["08"]["c03"]
        assert "fsdp only works in distributed training" in out["08"]["c39"]
        assert "SWIFT trains in one process, without DDP" in out["09"]["c15"]
        assert "CUDA_VISIBLE_DEVICES=0 NPROC_PER_NODE=1 swift sft" in out["08"]["c33b"]  # DeepSpeed: torchrun
        assert "CUDA_VISIBLE_DEVICES=0 swift sft" in out["09"]["c14"]  # the 1-GPU command, shown
        assert "# this machine's run\nCUDA_VISIBLE_DEVICES=0 swift sft" in out["09"]["c14"]  # the text run
        assert "▶ swift sft: the command above" in out["09"]["c14"]
        from swift import SftArguments

        for shown in (out["08"]["c33b"], out["09"]["c14"], out["09"]["c25b"]):  # gpu commands are SWIFT's own
            for command in shown.split("\n\n"):
                if command.lstrip().startswith("# ") and " swift sft " in command:  # the commands shown
                    got = swift_cli.parse(command[command.index("CUDA_VISIBLE_DEVICES") :], SftArguments)
                    assert got["torch_dtype"] == "bfloat16" and got["model"].endswith(
                        "tiny-qwen2-bf16"
                    )  # the model run
        ran = swift_commands(out["08"]["c37"])  # 08's DeepSpeed runs: the text shown is the text run
        assert len(ran) == 2 and all(
            c.startswith("CUDA_VISIBLE_DEVICES=0 NPROC_PER_NODE=1 swift sft") for c in ran
        )
        assert [swift_cli.parse(c, SftArguments)["torch_dtype"] for c in ran] == ["bfloat16"] * 2
        assert out["08"]["c37"].count("▶ swift sft: the command above") == 2
        # 09, section 2: the base model (here make gpu-check's tiny Qwen2 stands in) with --template default
        assert "stands in for the base model" in out["09"]["c20"]
        [base] = swift_commands(out["09"]["c25b"])
        got = swift_cli.parse(base, SftArguments)
        assert got["template"] == "default" and got["model"].endswith("tiny-qwen2-bf16"), got
        assert (
            f"with --template default: {runner.GPU_CHECK['09']['SWIFT_STEPS']} steps logged"
            in out["09"]["c25b"]
        )
        assert "base model tiny-qwen2" in out["09"]["c23"] + out["09"]["c20"]
        assert "--dtype bfloat16" in out["09"]["c34"]  # 09's checkpointing measurement: bf16, not float32
    if nproc == 3:  # 16 does not divide over 3: the nearest global batch, said in a sentence
        assert "a global batch of 15, the nearest possible" in out["06"]["c14"]
        assert "3 processes × 1 × 5 = 15" in out["06"]["c16"]
        assert "ranks that logged training steps: [0]" in out["06"]["c17"]
