"""`make gpu-check`: the gpu profile of 03-06 and 09-12 on a tiny Qwen2, as steps that DRY=1 prints and the run executes.

The check is data, a :class:`Plan`: the environment every notebook runs in, and one :class:`~course.runner.Job`
per notebook of :data:`GPU_CHECK` (its parameters, cell timeout, kernel folder). ``DRY=1`` prints the plan as
the shell commands that do the same (``export`` and one ``papermill`` line per step, :meth:`Plan.text`); the
run prints that text too, then executes the very same steps with the runner. ``SHAPE_ON_CPU=1`` runs the plan
in its gpu shape on the CPU (``COURSE_GPU_SHAPE_ON_CPU=1``: gloo instead of nccl, no CUDA), and ``PRETEND`` there
has torch believe a card is present (course/pretend/).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from course.lessons import course_notebooks
from course.runner import Job, run_course
from helpers import paths

# `make gpu-check`: the gpu profile of 03-06 and 09-12 on a tiny Qwen2 built on the spot (no download,
# no network), a few steps each, on a machine with CUDA. MODEL is added where a notebook has it.
GPU_CHECK = {
    # 04 and 05: 12 MiB of gradients, 3 buckets of 4 MiB (fewer would leave nothing to overlap); 03-06 run
    # their ranks on the CPU on every machine, and their one GPU cell with these sizes on 2 GPUs or more.
    # 01, 02 and 07 have no gpu path worth the minutes: 02's DataParallel cell needs torch's own CUDA.
    "03": {"LARGEST_MIB": 16},
    "04": {"WIDTH": 512, "DEPTH": 12, "ITERS": 3, "BATCH": 64},
    "05": {"WIDTH": 512, "DEPTH": 12, "ITERS": 3, "BATCH": 64, "BENCH_STEPS": 8},
    "06": {"BATCH": 32, "HIDDEN": 512, "BENCH_STEPS": 8},
    # 09: the path, not the finding; the Web-UI has no gpu path (the notebooks stage starts it on smoke)
    "09": {"DATASETS": "course", "STEPS": 4, "ABLATION_STEPS": 1, "SEEDS": [1], "WEBUI": False},
    "10": {"MAX_TOKENS": 16},
    # 11: the tiny model needs smoke's headroom; the ZeRO-2 preset's failure without --use_cpu happens only on
    # CPUs (a GPU skips that cell; the shape on a CPU would run it, for nothing gpu-check looks at)
    "11": {"HEADROOM_PERCENT": 150, "STEPS": 4, "SWIFT_STEPS": 2, "SHOW_CPU_PITFALL": False},
    "12": {"SWIFT_STEPS": 2, "HUB_WAIT": 2},  # the hub wait has no device in it
}
# The notebooks of GPU_CHECK whose gpu path on one GPU is not their path on two or more: 09 trains once
# without its DDP run (NPROC = 1), 11 shards its sections 3-4 over two CPU ranks instead of its own, skips
# FSDP2 and runs ZeRO on one rank, 12 launches SWIFT without torchrun and keeps reentrant checkpointing.
# 03-06 run their lesson on two CPU ranks whatever the GPUs, and on one GPU only print that their GPU cell
# needs two (profiles.on_gpus, no_gpu_run: tests/test_profiles.py); 10 merges and answers on one GPU however
# many there are. make test's 1-process gpu shape runs these; its 2-process one runs every notebook.
ONE_GPU_PATHS = ("09", "11", "12")
GPU_CHECK_BUDGET = 8 * 60  # seconds on one GPU
PRETEND_SITE = Path(__file__).parent / "pretend"  # its sitecustomize makes torch believe in a GPU (tests)
# Its own limits: a hang in an 8-minute check must cost minutes, not the hour a full gpu run allows a launch.
GPU_CHECK_LAUNCH_TIMEOUT = 300  # seconds any one launch may run (COURSE_LAUNCH_TIMEOUT caps every launch)
GPU_CHECK_CELL_TIMEOUT = 900  # seconds a cell may run: longer than a launch, so a launch's own timeout fires first
_PAPERMILL_TYPES = (bool, int, float, type(None))


def parameter_names(notebook: Path) -> set[str]:
    """The names a notebook's ``parameters`` cell assigns."""
    import ast

    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    return {
        t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign) for t in node.targets
    }


def parameters(notebook: Path, nproc: int, model: str) -> dict:
    """The papermill parameters ``make gpu-check`` gives ``notebook`` for ``nproc`` GPUs."""
    names = parameter_names(notebook)
    given = {"PROFILE": "gpu", "NPROC": nproc, "MODEL": model, **GPU_CHECK[notebook.name[:2]]}
    unknown = set(GPU_CHECK[notebook.name[:2]]) - names
    if unknown:
        raise ValueError(
            f"{notebook.name} has no parameter {sorted(unknown)}; GPU_CHECK must name real ones."
        )
    return {k: v for k, v in given.items() if k in names}


def papermill_options(values: dict) -> list[str]:
    """``-p NAME value`` where papermill's command line reads the value back as it is (numbers, True/False,
    None, plain words), else ``-y 'NAME: <JSON>'`` (lists, and strings papermill would read as numbers):
    ``-p SEEDS '[1]'`` would reach the notebook as the string '[1]'."""
    from papermill.cli import _resolve_type

    words = []
    for name, value in values.items():
        if isinstance(value, _PAPERMILL_TYPES) and _resolve_type(str(value)) == value:
            words += ["-p", name, str(value)]
        elif isinstance(value, str) and _resolve_type(value) == value:
            words += ["-p", name, value]
        else:
            words += ["-y", f"{name}: {json.dumps(value, ensure_ascii=False)}"]
    return words


def folder() -> Path:
    """Where ``make gpu-check`` writes everything (executed notebooks, outputs, its tiny model): a folder of
    its own, so that it never touches the learner's own gpu record, adapters or models."""
    return paths.build_dir() / "gpu-check"


def check_env(shape_on_cpu: bool = False, pretend: str | None = None, nproc: int = 1) -> dict[str, str]:
    """The environment every notebook of ``make gpu-check`` runs in (paths relative to the repository).
    ``pretend`` (the gpu shape only): torch believes ``nproc`` such cards are there (course/pretend/) in the
    kernel and in every process meant for the CPU."""
    from helpers import devices, launching, profiles

    where = Path(paths.relative(folder()))
    env = {
        "COURSE_BUILD_DIR": str(where),
        "COURSE_OUTPUTS_DIR": str(where / "outputs"),
        "COURSE_MODELS_DIR": str(where / "models"),
        launching.LAUNCH_TIMEOUT_CAP: str(GPU_CHECK_LAUNCH_TIMEOUT),
    }
    if shape_on_cpu:
        env[profiles.GPU_SHAPE_ON_CPU] = "1"
    if pretend:
        env[devices.PRETEND_ENV] = f"{pretend}:{nproc}"
        env["PYTHONPATH"] = os.pathsep.join([str(PRETEND_SITE), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def command(step: Job) -> str:
    """The ``papermill`` command that runs ``step`` from the repository root, as a shell reads it."""
    argv = [
        "papermill",
        os.path.relpath(step.notebook, paths.ROOT),
        paths.relative(step.out),
        "--cwd",
        os.path.relpath(step.cwd, paths.ROOT),  # the kernel starts there, as in JupyterLab; MODEL is relative to it
        "--execution-timeout",
        str(step.cell_timeout),
        "-k",
        step.kernel,
        *papermill_options(step.parameters),
    ]
    return shlex.join(argv)


@dataclass(frozen=True)
class Plan:
    """What ``make gpu-check`` runs: a heading saying where, the environment, one step per notebook, and (as
    comments) the ``swift sft`` notebook 09 runs with the original tutorial's model and recipe on as many GPUs."""

    heading: str
    env: dict[str, str]
    steps: list[Job]
    seed: list[str]

    def text(self) -> str:
        """The plan as a shell script to run from the repository root: what ``DRY=1`` prints, and the run
        before it executes the steps."""
        lines = [f"# {self.heading}", "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())]
        lines += [command(step) for step in self.steps]
        return "\n".join(lines + self.seed) + "\n"


def plan(nproc: int, shape_on_cpu: bool = False, pretend: str | None = None, only=None,
         illustrate_tutorial: bool = True) -> Plan:  # fmt: skip
    """The :class:`Plan` of ``make gpu-check`` on ``nproc`` GPUs (or in its gpu shape on the CPU), for every
    notebook of GPU_CHECK or ``only`` those numbers. ``illustrate_tutorial`` adds the original tutorial's ``swift sft``."""
    from helpers import models, profiles, sft

    env = check_env(shape_on_cpu, pretend, nproc)
    where = "in its gpu shape on the CPU" if shape_on_cpu else f"on {nproc} GPU{'s' if nproc > 1 else ''}"
    if pretend:
        where += f", torch pretending {nproc} {pretend} card{'s' if nproc > 1 else ''}"
    heading = f"make gpu-check {where}: the gpu profile on a tiny Qwen2 built on the spot, from the repository root"
    executed = paths.ROOT / env["COURSE_BUILD_DIR"] / "executed"  # absolute where it lies outside
    model = paths.ROOT / env["COURSE_MODELS_DIR"] / models.TINY_QWEN2_DIR
    model = os.path.relpath(model, paths.NOTEBOOKS) if model.is_relative_to(paths.ROOT) else str(model)
    numbers = [o.zfill(2) for o in only] if only else sorted(GPU_CHECK)
    steps = [
        Job(notebook, executed / notebook.name, parameters(notebook, nproc, model), GPU_CHECK_CELL_TIMEOUT,
            paths.NOTEBOOKS, "python3")  # fmt: skip
        for notebook in course_notebooks(GPU_CHECK)
        if notebook.name[:2] in numbers
    ]
    seed = []
    if illustrate_tutorial:
        info = models.ModelInfo(
            name=profiles.GPU_DEFAULT_MODEL, path=profiles.GPU_DEFAULT_MODEL, source="ModelScope"
        )
        recipe, note = sft.tutorial_recipe(
            info, nproc, output_dir="build/outputs/self-cognition-seed", model_name=("小课", "XiaoKe"),
            model_author=("并行训练营", "Parallel Training Camp"), inherit=False,
        )  # fmt: skip
        shown = f"# and what notebook 09 runs on {nproc} GPU{'s' if nproc > 1 else ''} with the original tutorial's model and recipe"
        seed.append(shown + (f" ({note})" if note else "") + ":")
        seed += ["#   " + line for line in sft.shell_command(recipe).splitlines()]
    return Plan(heading, env, steps, seed)


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """``os.environ`` with ``env`` set within the block, as it was after."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def python_problem() -> str | None:
    """Why this Python cannot run ``make gpu-check`` on a GPU, in one sentence with the fix; None if it can."""
    import importlib.util

    from helpers import profiles

    missing = [name for name in ("papermill", "nbformat", "swift", "deepspeed") if importlib.util.find_spec(name) is None]
    if importlib.util.find_spec("torch") is None:
        missing.insert(0, "torch")
    if missing:
        return (
            f"make gpu-check: {sys.executable} lacks {', '.join(missing)}; install the course beside a CUDA build "
            "of torch with `COURSE_KEEP_TORCH=1 make setup` (docs/gpu.md), or set GPU_PYTHON to a python that "
            "has them."
        )
    import torch

    if torch.version.cuda is None:
        return (
            f"make gpu-check: the torch of {sys.executable} is {torch.__version__}, a CPU build "
            "(torch.version.cuda is None), so it sees no GPU; make .venv with the image's CUDA torch "
            "(`COURSE_KEEP_TORCH=1 make setup`, docs/gpu.md), or check the gpu path on the CPU with "
            "`make gpu-check SHAPE_ON_CPU=1 NPROC=1`."
        )
    from helpers import environment as machine

    unusable = machine.cuda_problem()  # first: torch says why only the first time it is asked
    if unusable:
        return f"make gpu-check: {unusable}"
    if not profiles.count_gpus():
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        return (
            f"make gpu-check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"
            + (f" (CUDA_VISIBLE_DEVICES={shown!r})" if shown is not None else "")
            + "; check `nvidia-smi`, or check the gpu path on the CPU with `make gpu-check SHAPE_ON_CPU=1 NPROC=1`."
        )
    return None


def run(dry: bool = False, nproc: int | None = None, shape_on_cpu: bool = False, only=None,
        pretend: str | None = None) -> int:  # fmt: skip
    """``make gpu-check``: print the :func:`plan` and execute its steps (the gpu profile on the tiny Qwen2),
    with the report in the check's own folder. ``dry``: print the plan only, for 1 and 8 GPUs unless ``nproc``
    is given (needs no GPU). ``shape_on_cpu``: the same plan in the gpu shape on the CPU, with ``nproc``
    processes per launch (default 1). ``only``: some of the notebook numbers (make test's 1-process shape runs
    ONE_GPU_PATHS; make gpu-check runs them all). ``pretend``: with ``shape_on_cpu``, torch believes that card
    is there, ``nproc`` of them (course/pretend/sitecustomize.py)."""
    from helpers import models, profiles

    if pretend:
        from course.pretend.sitecustomize import CARDS

        if not shape_on_cpu or pretend not in CARDS:
            print(f"error: PRETEND = {pretend!r} goes with SHAPE_ON_CPU=1 and names a card: {', '.join(CARDS)}.",
                  file=sys.stderr)  # fmt: skip
            return 2
    unknown = sorted({o.zfill(2) for o in only or ()} - set(GPU_CHECK))
    if unknown:
        print(f"error: ONLY = {' '.join(only)!r} names {', '.join(unknown)}, not in make gpu-check; choose among "
              f"{' '.join(sorted(GPU_CHECK))}.", file=sys.stderr)  # fmt: skip
        return 2
    if dry:
        for count in [nproc] if nproc else [1, 8]:
            print(plan(count, shape_on_cpu, pretend, only).text())
        return 0
    if not shape_on_cpu:
        problem = python_problem()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    nproc = nproc or (1 if shape_on_cpu else profiles.count_gpus())
    build = folder()  # before its own COURSE_BUILD_DIR is set, which names this very folder
    check = plan(nproc, shape_on_cpu, pretend, only)
    print(check.text(), flush=True)
    with environment(check.env):
        models.tiny_qwen2()  # the model every notebook is given (MODEL): built here, once, in seconds
        status = run_course("gpu", build=build, jobs=check.steps)
    print(f"gpu-check: budget {GPU_CHECK_BUDGET} s on one GPU; the report above gives each notebook's time.")
    return status
