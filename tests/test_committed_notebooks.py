"""What is committed in notebooks/: a complete, error-free cpu run that reads as a lesson."""

import json

import pytest

from course import runner

NOTEBOOKS = runner.course_notebooks()


@pytest.fixture(params=NOTEBOOKS, ids=lambda p: p.stem)
def notebook(request):
    return json.loads(request.param.read_text())


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def source(cell):
    return "".join(cell["source"])


def test_no_error_outputs(notebook):
    errors = [o for c in code_cells(notebook) for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors == []


def test_execution_counts_are_one_fresh_run(notebook):
    counts = [c["execution_count"] for c in code_cells(notebook)]
    assert counts == list(range(1, len(counts) + 1)), f"stale or missing execution counts: {counts}"


def test_parameters_cell_then_resolve(notebook):
    cells = code_cells(notebook)
    tagged = [i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", [])]
    assert tagged == [0], "the first code cell is the only one tagged parameters"
    assert 'PROFILE = "auto"' in source(cells[0])
    assert "profiles.resolve(" in source(cells[1])


def test_reads_as_a_lesson(notebook):
    text = "\n".join(source(c) for c in notebook["cells"] if c["cell_type"] == "markdown")
    assert text.lstrip().startswith("# ")
    for heading in ("By the end of this notebook you can", "## Summary", "## Glossary"):
        assert heading in text, heading
    solutions = [c for c in code_cells(notebook) if "solution" in c["metadata"].get("tags", [])]
    assert solutions, "each notebook has checkable exercises"
    for cell in solutions:
        assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True
        assert "assert check(" in source(cell) and "solution=True" in source(cell)
        shown = "".join("".join(o["text"]) for o in cell.get("outputs", []) if o["output_type"] == "stream")
        assert shown.count("\n") == 1 and "the reference solution passes" in shown, (
            shown
        )  # gives nothing away
    assert any(source(c).startswith("# NBVAL_CHECK_OUTPUT") for c in code_cells(notebook))


def test_records_metrics_for_the_run_report(notebook):
    """Every lesson puts its key facts in the run report (the runner collects them the same way)."""
    from course import metrics

    assert len(metrics.collect(notebook)) >= 3


def test_no_path_plumbing_in_lessons(notebook):
    for cell in code_cells(notebook):
        assert "sys.path" not in source(cell)


def output_text(nb) -> str:
    """Everything a reader sees in a notebook's outputs (streams and text displays)."""
    parts = []
    for cell in code_cells(nb):
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                parts.append("".join(out["text"]))
            for kind, value in out.get("data", {}).items():
                if kind.startswith("text/"):
                    parts.append("".join(value))
    return "\n".join(parts)


def test_outputs_hold_no_path_of_the_recording_machine(notebook):
    from pathlib import Path

    from helpers import paths

    text = output_text(notebook)
    for absolute in (str(paths.ROOT), str(Path.home()) + "/", "/home/", "/Users/"):
        lines = [line for line in text.splitlines() if absolute in line]
        assert not lines, f"{absolute!r} in the outputs: {lines[:3]}"


def test_outputs_fold_library_log_lines(notebook):
    """SWIFT's, DeepSpeed's and transformers' INFO/WARNING chatter stays in the launches' log files."""
    import re

    log_line = re.compile(
        r"^(?:\[rank\d+\]:)?\[(?:INFO|WARNING)[:\]]"
    )  # a quoted line is indented: not counted
    noise = [line for line in output_text(notebook).splitlines() if log_line.match(line)]
    assert len(noise) <= 3, noise


def test_recorded_metrics_show_nothing_and_checks_print_values_not_true(notebook):
    """report.record adds no line a reader sees, and no output line ends in a bare True or False: a check
    prints what it compared."""
    import re

    text = output_text(notebook)
    assert "📏" not in text
    bare = [line for line in text.splitlines() if re.search(r"(^|[\s:=])(True|False)\s*$", line)]
    assert not bare, bare[:5]


def committed_metrics(stem: str) -> dict:
    """``{name: metric}`` (value, unit, note) of what a committed notebook recorded with report.record."""
    [path] = [p for p in NOTEBOOKS if p.stem.startswith(stem)]
    found = {}
    for cell in code_cells(json.loads(path.read_text())):
        for output in cell.get("outputs", []):
            metric = output.get("data", {}).get("application/vnd.course.metric+json")
            if metric:
                found[metric["name"]] = metric
    return found


def test_the_committed_fine_tune_clears_each_goal_by_two_answers_also_through_its_own_template():
    """09's adapter and 10's merged model (through SWIFT, and through transformers' apply_chat_template with
    no system message, as a user of the merged folder asks) clear every cpu goal by at least two answers."""
    import re

    from helpers import scoring, selfcog

    identity = selfcog.heldout(kind="identity")
    asked = {f"{asks}_{tag}": sum(r["tag"] == tag and r["asks"] == asks for r in identity)
             for tag in ("zh", "en") for asks in ("name", "author")}  # fmt: skip
    tuned, merged = committed_metrics("09_"), committed_metrics("10_")
    for metrics, prefix in ((tuned, ""), (merged, ""), (merged, "transformers_")):
        for key, n in asked.items():
            right, goal = round(metrics[prefix + key]["value"] * n), scoring.GOALS[key]
            assert right >= goal * n + 2 - 1e-9, (prefix + key, f"{right} of {n}", goal)
        if not prefix:  # general kept: of the answers the base model got right
            kept, n = map(int, re.match(r"(\d+)/(\d+) ", metrics["general_kept"]["note"]).groups())
            assert kept >= scoring.GOALS["general_kept"] * n + 2 - 1e-9, ("general_kept", f"{kept} of {n}")


def test_the_merge_and_infer_10_typed_are_the_flags_its_gpu_commands_copy():
    """10 types `swift export` and `swift infer` in its cells; `inference.gpu_commands` (the gpu profile's
    commands it shows to copy) builds them from `export_flags` and `infer_flags`. Given what the committed
    run typed, those build the same arguments, as SWIFT's own parser reads both."""
    import shlex

    import swift_cli
    from swift.arguments import ExportArguments, InferArguments

    from helpers import inference, models, paths

    ran = committed_metrics("10")
    typed_export = swift_cli.parse(ran["export_command"]["value"], ExportArguments)
    typed_infer = swift_cli.parse(ran["infer_command"]["value"], InferArguments)
    record = {
        "checkpoint": typed_export["adapters"][0],
        "model": typed_export["model"],
        "model_type": typed_export["model_type"],
        "template": typed_export["template"],
        "dtype": typed_export["torch_dtype"],
    }
    fresh = paths.build_dir() / "never-made" / "model"  # export_flags refuses a folder that exists
    copied_export = swift_cli.parse("swift export " + shlex.join(inference.export_flags(record, fresh)), ExportArguments)
    merged = models.ModelInfo("merged", typed_infer["model"], "test", record["model_type"], record["template"])
    copied_infer = swift_cli.parse(
        "swift infer "
        + shlex.join(
            inference.infer_flags(
                merged,
                typed_infer["val_dataset"][0],
                typed_infer["result_path"],
                typed_infer["max_new_tokens"],
                typed_infer["torch_dtype"],
                system=typed_infer["system"],
            )
        ),
        InferArguments,
    )
    # the cpu model is a local folder: the plugin that keeps SWIFT from running its code is typed in both
    assert typed_export["external_plugins"] == typed_infer["external_plugins"] == ["helpers/swift_local_code_only.py"]
    # the folders may not exist here, so the copies may leave the plugin out; everything else is the same
    skip = {"external_plugins", "output_dir"}
    assert {k: v for k, v in copied_export.items() if k not in skip} == {
        k: v for k, v in typed_export.items() if k not in skip
    }
    assert {k: v for k, v in copied_infer.items() if k not in skip} == {
        k: v for k, v in typed_infer.items() if k not in skip
    }


def test_the_sft_12_typed_is_swifts_own_and_leaves_the_checkpointing_choice_to_swift():
    """12's `sft_command` is typed text; what the committed run ran is read back through SWIFT's parser:
    two CPU ranks, gradient checkpointing on, no kwargs for it (SWIFT chooses), and --use_cpu true."""
    import swift_cli
    from swift import SftArguments

    from helpers import swiftcli

    ran = committed_metrics("12")["swift_ckpt_command"]["value"]
    env, _, _ = swiftcli.parse_swift_text(ran)
    args = swift_cli.parse(ran, SftArguments)
    assert env.get("NPROC_PER_NODE") == "2"
    assert args["gradient_checkpointing"] is True and args["gradient_checkpointing_kwargs"] is None
    assert (args["use_cpu"], args["tuner_type"], args["torch_dtype"]) == (True, "lora", "float32")


def test_the_deepspeed_runs_11_typed_are_swifts_own_with_what_a_cpu_needs():
    """11's `sft_command` is typed text; the committed runs, read back through SWIFT's parser, are two
    torchrun ranks with SWIFT's ZeRO-2 preset and ZeRO-3 without its batch size, and what a CPU needs:
    --use_cpu true and fp32 with fp16 and bf16 off."""
    import swift_cli
    from swift import SftArguments

    from helpers import swiftcli

    ran = committed_metrics("11")
    for name in ("zero2", "zero3"):
        command = ran[f"swift_{name}_command"]["value"]
        env, _, _ = swiftcli.parse_swift_text(command)
        args = swift_cli.parse(command, SftArguments)
        assert env.get("NPROC_PER_NODE") == "2", name
        assert name in args["deepspeed"] and args["use_cpu"] is True, name
        assert (args["torch_dtype"], args["fp16"], args["bf16"]) == ("float32", False, False), name
        assert (args["gradient_checkpointing"], args["save_only_model"]) == (False, False), name
    assert ran["swift_zero2_command"]["value"].split("--deepspeed ")[1].split()[0] == "zero2"  # SWIFT's own preset


def test_the_sft_commands_09_typed_are_what_the_recipe_builder_gives_for_the_same_values():
    """09 types its two `swift sft` commands in cells; `sft.SftPlan` builds the gpu commands it shows to
    copy. Given the values the committed run typed, the builder gives the same arguments, as SWIFT's own
    parser reads both: a flag typed in one and not the other fails here."""
    import shlex

    import swift_cli
    from swift import SftArguments

    from helpers import models, sft, swiftcli

    ran = committed_metrics("09")
    for key, nproc in (("sft_single_command", 1), ("sft_ddp_command", 2)):
        env, _, _ = swiftcli.parse_swift_text(ran[key]["value"])
        assert env.get("NPROC_PER_NODE", "1") == str(nproc), key
        typed = swift_cli.parse(ran[key]["value"], SftArguments)
        assert typed["use_cpu"] and typed["torch_dtype"] == "float32" and typed["tuner_type"] == "lora", key
        model = models.ModelInfo("typed", typed["model"], "test", typed["model_type"], typed["template"])
        plan = sft.SftPlan(
            model=model, datasets=tuple(typed["dataset"]), output_dir=typed["output_dir"],
            model_name=tuple(typed["model_name"]), model_author=tuple(typed["model_author"]),
            steps=typed["max_steps"], per_device_batch=typed["per_device_train_batch_size"],
            grad_accum=typed["gradient_accumulation_steps"], nproc=nproc, learning_rate=typed["learning_rate"],
            max_length=typed["max_length"], gradient_checkpointing=typed["gradient_checkpointing"], seed=typed["seed"],
        )  # fmt: skip
        built = swift_cli.parse("swift sft " + shlex.join(plan.cli()), SftArguments)
        skip = {"external_plugins", "check_model"}  # a local folder's flags: the model may not be built here
        assert {k: v for k, v in built.items() if k not in skip} == {k: v for k, v in typed.items() if k not in skip}, key
