"""make gpu-check: its plan (the steps it runs, printed without a GPU by DRY=1), the printed text read back the
way papermill and a shell read it, its own folder and limits, the notebooks its 1-process gpu shape runs, and
one sentence when the python running it cannot."""

import ast
import re
import shlex
import subprocess

import nbformat
import pytest

from course import gpu_check
from course.lessons import course_notebooks
from helpers import launching, paths, profiles


def papermill_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("papermill ")]


def papermill_call(line: str) -> dict:
    """The keywords papermill's own command line gives ``papermill.execute_notebook`` for ``line`` (as a shell
    splits it), its execution intercepted: what running the printed text would run."""
    from unittest import mock

    import papermill.cli

    words = shlex.split(line)
    assert words[0] == "papermill", line
    seen = {}
    with mock.patch.object(papermill.cli, "execute_notebook", lambda **kw: seen.update(kw)):
        papermill.cli.papermill.main(args=words[1:], prog_name="papermill", standalone_mode=False)
    return seen


def test_dry_run_prints_every_step_for_1_and_8_gpus(capsys):
    assert gpu_check.run(dry=True) == 0
    out = capsys.readouterr().out
    lines = papermill_lines(out)
    numbers = sorted(gpu_check.GPU_CHECK)
    assert len(lines) == 2 * len(numbers)
    for nproc, block in zip((1, 8), (lines[: len(numbers)], lines[len(numbers) :]), strict=True):
        assert [re.search(r"notebooks/(\d\d)_", line).group(1) for line in block] == numbers
        assert "\n".join(block) == "\n".join(map(gpu_check.command, gpu_check.plan(nproc).steps))
    assert out.count("#   CUDA_VISIBLE_DEVICES=0 swift sft") == 1
    assert out.count("#   CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 NPROC_PER_NODE=8 swift sft") == 1


@pytest.mark.parametrize("shape_on_cpu", [False, True])
def test_each_printed_line_runs_exactly_its_step(shape_on_cpu):
    """What papermill's own command line makes of each printed line is the step the run executes, and the
    step's parameters are what GPU_CHECK says: `-p SEEDS '[1]'` would arrive as the string '[1]', so lists
    travel as YAML (-y)."""
    plan = gpu_check.plan(2, shape_on_cpu)
    assert [step.notebook.name[:2] for step in plan.steps] == sorted(gpu_check.GPU_CHECK)
    for step, line in zip(plan.steps, papermill_lines(plan.text()), strict=True):
        call = papermill_call(line)
        assert paths.ROOT / call["input_path"] == step.notebook and paths.ROOT / call["output_path"] == step.out
        assert paths.ROOT / call["cwd"] == step.cwd == paths.NOTEBOOKS and call["kernel_name"] == step.kernel
        assert call["execution_timeout"] == step.cell_timeout == gpu_check.GPU_CHECK_CELL_TIMEOUT
        assert call["parameters"] == step.parameters
        number = step.notebook.name[:2]
        assert {k: step.parameters[k] for k in gpu_check.GPU_CHECK[number]} == gpu_check.GPU_CHECK[number]
        assert step.parameters["PROFILE"] == "gpu"
        model = step.parameters.get("MODEL")
        if model is not None:  # relative to --cwd notebooks, where the kernel starts
            assert (paths.NOTEBOOKS / model).resolve() == paths.ROOT / plan.env["COURSE_MODELS_DIR"] / "tiny-qwen2-bf16"
    nine = next(step for step in plan.steps if step.notebook.name.startswith("09"))
    assert nine.parameters["SEEDS"] == [1]  # a list, not '[1]'
    assert plan.env[launching.LAUNCH_TIMEOUT_CAP] == str(gpu_check.GPU_CHECK_LAUNCH_TIMEOUT)
    assert gpu_check.GPU_CHECK_LAUNCH_TIMEOUT < gpu_check.GPU_CHECK_CELL_TIMEOUT  # the launch's own timeout fires first
    assert (plan.env.get(profiles.GPU_SHAPE_ON_CPU) == "1") is shape_on_cpu


def test_a_shell_reads_the_printed_text_as_the_plan_says():
    """bash, given the printed lines, sets the plan's environment and passes each papermill line's words as the
    plan's own reading of it (shlex) does."""
    plan = gpu_check.plan(1, shape_on_cpu=True, pretend="rtx3090")
    [export] = [line for line in plan.text().splitlines() if line.startswith("export ")]
    names = list(plan.env)
    shown = subprocess.run(["bash", "-c", export + "; printf '%s\\0' " + " ".join(f'"${n}"' for n in names)],
                           capture_output=True, text=True, check=True).stdout.split("\0")[:-1]  # fmt: skip
    assert dict(zip(names, shown, strict=True)) == plan.env
    for line in papermill_lines(plan.text()):
        argv = subprocess.run(
            ["bash", "-c", "printf '%s\\0' " + line.removeprefix("papermill ")],
            capture_output=True, text=True, check=True,
        ).stdout.split("\0")[:-1]  # fmt: skip
        assert argv == shlex.split(line)[1:]


def test_only_some_notebooks_are_printed_and_run_and_a_number_outside_the_check_is_refused(capsys):
    assert gpu_check.run(dry=True, nproc=1, shape_on_cpu=True, only=["9", "11"]) == 0
    lines = papermill_lines(capsys.readouterr().out)
    assert [re.search(r"notebooks/(\d\d)_", line).group(1) for line in lines] == ["09", "11"]
    assert gpu_check.run(dry=True, only=["07"]) == 2
    assert "names 07, not in make gpu-check" in capsys.readouterr().err


def test_gpu_check_writes_only_under_its_own_folder():
    """A learner's own gpu record, adapters and models are never touched by the check's tiny model."""
    env = gpu_check.check_env()
    folder = gpu_check.folder()
    for key in ("COURSE_BUILD_DIR", "COURSE_OUTPUTS_DIR", "COURSE_MODELS_DIR"):
        with gpu_check.environment({key: env[key]}):
            where = {"COURSE_BUILD_DIR": paths.build_dir, "COURSE_OUTPUTS_DIR": paths.outputs_dir,
                     "COURSE_MODELS_DIR": paths.models_dir}[key]()  # fmt: skip
        assert where.is_relative_to(folder), (key, where)
    assert not paths.outputs_dir().is_relative_to(folder)
    assert all(step.out.is_relative_to(folder) for step in gpu_check.plan(2).steps)


def test_every_gpu_check_parameter_is_a_real_notebook_parameter():
    for notebook in course_notebooks(gpu_check.GPU_CHECK):
        given = gpu_check.parameters(notebook, 2, "m")
        assert set(gpu_check.GPU_CHECK[notebook.name[:2]]) <= set(given)


def test_a_misspelt_parameter_is_refused(monkeypatch):
    monkeypatch.setitem(gpu_check.GPU_CHECK, "09", {"STEP": 4})
    notebook = course_notebooks(["09"])[0]
    with pytest.raises(ValueError, match=r"has no parameter \['STEP'\]"):
        gpu_check.parameters(notebook, 2, "m")


def gpu_count_reads(number: str) -> list[str]:
    """Where notebook ``number``'s code reads how many GPUs (or ranks on them) it has, outside a lesson's GPU
    cell: ``.nproc``, ``.gpus`` or ``.env()`` of a profile from ``profiles.resolve`` (a ``ranks_on_cpu``
    profile has two CPU ranks whatever the GPUs), the NPROC parameter anywhere but in ``resolve(...)``, or
    ``count_gpus()``. A cell under ``if profiles.on_gpus(...)`` runs only on two GPUs or more; on one it prints
    ``profiles.no_gpu_run``'s sentence, which tests/test_profiles.py checks."""
    [notebook] = course_notebooks([number])
    cells = [c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    trees = [ast.parse(s) for s in cells if not s.lstrip().startswith("%%")]
    cpu_only = {
        target.id
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func) == "profiles.ranks_on_cpu"
        for target in node.targets if isinstance(target, ast.Name)
    }  # fmt: skip
    found = []

    def visit(node, on_gpus: bool, in_resolve: bool):
        if isinstance(node, ast.If) and ast.unparse(node.test).startswith("profiles.on_gpus("):
            for child in node.body:
                visit(child, True, in_resolve)
            for child in node.orelse:
                visit(child, on_gpus, in_resolve)
            return
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "profiles.resolve":
            in_resolve = True
        if not on_gpus:
            if isinstance(node, ast.Attribute) and node.attr in ("nproc", "gpus", "env") and isinstance(
                node.value, ast.Name
            ) and node.value.id not in cpu_only and node.value.id in ("profile", "resolved"):
                found.append(ast.unparse(node))
            if isinstance(node, ast.Name) and node.id == "NPROC" and isinstance(node.ctx, ast.Load) and not in_resolve:
                found.append("NPROC")
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("count_gpus"):
                found.append(ast.unparse(node))
        for child in ast.iter_child_nodes(node):
            visit(child, on_gpus, in_resolve)

    for tree in trees:
        visit(tree, False, False)
    return found


def test_the_1_process_gpu_shape_runs_the_notebooks_whose_gpu_path_depends_on_one_gpu():
    """make test runs the 1-process gpu shape for ONE_GPU_PATHS only: exactly the notebooks of GPU_CHECK whose
    code reads its GPU count outside a lesson's GPU cell (the others run the same cells on one GPU as on two,
    which the 2-process shape runs). A notebook that starts reading it joins the list, or this fails."""
    reads = {number: gpu_count_reads(number) for number in gpu_check.GPU_CHECK}
    assert {number for number, found in reads.items() if found} == set(gpu_check.ONE_GPU_PATHS), reads
    assert set(gpu_check.ONE_GPU_PATHS) <= set(gpu_check.GPU_CHECK)


def whole_in_shape() -> list[str]:
    """The notebooks the 2-process gpu shape runs cell by cell on the paths they take without a GPU: those of
    GPU_CHECK whose lesson runs on CPU ranks on every machine (they call profiles.ranks_on_cpu)."""
    return [number for number in sorted(gpu_check.GPU_CHECK)
            if "profiles.ranks_on_cpu(" in course_notebooks([number])[0].read_text()]  # fmt: skip


def test_the_notebooks_stage_leaves_to_the_gpu_shape_exactly_the_lessons_it_runs_whole():
    """make test's smoke notebooks stage skips the Makefile's WHOLE_IN_SHAPE, which the 2-process gpu shape runs
    cell by cell (tests/test_gpu_shape.py compares their checked outputs there): exactly whole_in_shape(), none
    of them a notebook whose GPU count decides anything outside its GPU cell. Every other notebook stays."""
    whole = whole_in_shape()
    assert whole and not set(whole) & set(gpu_check.ONE_GPU_PATHS)
    stream = subprocess.run(["make", "-n", "stream-notebooks"], cwd=paths.ROOT, capture_output=True, text=True,
                            check=True).stdout  # fmt: skip
    [skip] = re.findall(r'make --no-print-directory notebooks SKIP="([^"]*)"', stream)
    assert skip.split() == whole
    stage = subprocess.run(["make", "-n", "notebooks", f"SKIP={skip}"], cwd=paths.ROOT, capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    ran = sorted(word.rpartition("/")[2][:2] for word in stage.split() if re.fullmatch(r"notebooks/\d\d_\w+\.ipynb", word))
    assert ran == sorted(set(n.name[:2] for n in course_notebooks()) - set(whole))


def test_without_a_gpu_the_real_check_stops_with_one_sentence_naming_the_fix(monkeypatch, capsys):
    """A CPU build of torch (the lock's): the check says so, with torch.version.cuda, and what to do."""
    import torch

    monkeypatch.delenv(profiles.GPU_SHAPE_ON_CPU, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)  # as the lock's CPU build, also in a CUDA .venv
    assert gpu_check.run() == 2
    err = capsys.readouterr().err.strip()
    assert "a CPU build (torch.version.cuda is None)" in err and "COURSE_KEEP_TORCH=1 make setup" in err
    assert "SHAPE_ON_CPU=1" in err and "\n" not in err
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build that cannot use the GPU: why, in a sentence
    from helpers import environment

    why = "torch 2.13.0 is a CUDA 12.8 build, and this machine's NVIDIA driver 470.82 runs CUDA up to 11.4: ..."
    monkeypatch.setattr(environment, "cuda_problem", lambda: why)
    assert gpu_check.python_problem() == f"make gpu-check: {why}"
    monkeypatch.setattr(environment, "cuda_problem", lambda: "")  # nothing torch can name: it sees no GPU
    monkeypatch.setattr(profiles, "count_gpus", lambda: 0)
    assert "sees no GPU" in gpu_check.python_problem() and "nvidia-smi" in gpu_check.python_problem()
    monkeypatch.setattr(profiles, "count_gpus", lambda: 1)
    assert gpu_check.python_problem() is None


def test_a_python_without_the_course_packages_is_named(monkeypatch):
    """A venv that holds only a CUDA torch lacks papermill and SWIFT: say which, and how to add them."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("papermill", "swift") else real(name, *a))
    problem = gpu_check.python_problem()
    assert "lacks papermill, swift" in problem and "COURSE_KEEP_TORCH=1 make setup" in problem


def test_make_runs_the_check_with_its_own_flags():
    """`make gpu-check SHAPE_ON_CPU=1 NPROC=2` is the command a person runs and make test runs."""
    def make_n(*words):  # the recipe's lines, each with its words one space apart
        done = subprocess.run(["make", "-n", "gpu-check", *words], cwd=paths.ROOT, capture_output=True, text=True,
                              check=True)  # fmt: skip
        return "\n".join(" ".join(line.split()) for line in done.stdout.splitlines())

    assert ".venv/bin/python -m course.runner gpu-check --nproc 2 --shape-on-cpu" in make_n("SHAPE_ON_CPU=1", "NPROC=2")
    real = make_n()
    assert "PYTHONPATH=" in real and ".venv/bin/python -m course.runner gpu-check" in real
    assert "setup.sh" not in real  # set-up would put the lock's CPU torch into a CUDA .venv
    pretend = make_n("SHAPE_ON_CPU=1", "NPROC=2", "PRETEND=h100")
    assert "gpu-check --nproc 2 --shape-on-cpu --pretend h100" in pretend
    assert "gpu-check --nproc 1 --shape-on-cpu --only 09 11" in make_n("SHAPE_ON_CPU=1", "NPROC=1", "ONLY=09 11")
    for words in (["--pretend", "h100"], ["--shape-on-cpu", "--pretend", "a100"]):  # on a GPU; a card it lacks
        refused = subprocess.run([".venv/bin/python", "-m", "course.runner", "gpu-check", *words], cwd=paths.ROOT,
                                 capture_output=True, text=True)  # fmt: skip
        assert refused.returncode == 2 and "goes with SHAPE_ON_CPU=1 and names a card: rtx3090" in refused.stderr
    bad = subprocess.run([".venv/bin/python", "-m", "course.runner", "gpu-check", "--nproc", "two"],
                         cwd=paths.ROOT, capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "NPROC = 'two' must be a whole number" in bad.stderr

