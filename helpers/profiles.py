"""Profiles: one notebook for every environment (cpu, gpu, smoke), picked by a papermill parameter.

Each notebook's ``parameters`` cell holds ``PROFILE = "auto"`` and its own knobs; the cell after
it calls :func:`resolve`, which checks every value and stops with one sentence when one is wrong.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from helpers import devices, environment, models
from helpers.devices import count_gpus, gpu_dtype  # noqa: F401 (the names notebooks use)
from helpers.errors import CourseError, install_notebook_handler

PROFILES = ("auto", "cpu", "gpu", "smoke")
GPU_DEFAULT_MODEL = "Qwen/Qwen2.5-7B-Instruct"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_MISSING = object()  # Profile.pick's gpu= was left out
# Tests only: PROFILE = "gpu" without a GPU runs the gpu recipe (picks, dtype, templates, file names) on the
# CPU over gloo, so that everything but CUDA and nccl is exercised where no GPU exists.
GPU_SHAPE_ON_CPU = "COURSE_GPU_SHAPE_ON_CPU"


@dataclass(frozen=True)
class Profile:
    """Everything a notebook needs to know about where and how it runs."""

    name: str  # cpu | gpu | smoke
    requested: str  # what the parameter said (may be "auto")
    reason: str  # why this profile was chosen, in words
    device: str  # "cpu" or "cuda"
    backend: str  # torch.distributed backend: gloo or nccl
    nproc: int  # processes per launch (ranks on this machine)
    gpus: int  # CUDA devices visible
    model: str | None  # a local model directory or a ModelScope id; None: the profile's default
    knobs: dict = field(default_factory=dict)
    dtype: str = "float32"  # the weights' dtype in training, merging and inference: see :func:`gpu_dtype`
    note: str = ""  # a sentence for the learner when the profile had to adapt (:func:`ranks_on_cpu`)
    cpu_only: bool = False  # never runs a gpu value (:func:`ranks_on_cpu`): its picks take no gpu=

    @property
    def smoke(self) -> bool:
        return self.name == "smoke"

    def pick(self, cpu, *, gpu=_MISSING, smoke=None):
        """Choose a value by profile: ``profile.pick(cpu=48, smoke=4, gpu=200)``.

        On a profile that can be gpu, ``gpu`` must always be given, even where it equals ``cpu``: left out, a
        CPU-sized step count, size or timeout would silently run on a GPU. On a ``cpu_only`` profile (a lesson
        whose ranks run on the CPU on every machine, :func:`ranks_on_cpu`) it must be left out: it would never
        be used. ``smoke`` left out (or None) means the cpu value.
        """
        if self.cpu_only:
            if gpu is not _MISSING:
                raise TypeError(
                    f"profile.pick() was given gpu={gpu!r} on a profile that runs on the CPU on every machine "
                    "(profiles.ranks_on_cpu); leave gpu= out, as that value would never be used."
                )
        elif gpu is _MISSING:
            raise TypeError(
                f"profile.pick() was given cpu={cpu!r} but no gpu= value; name the gpu profile's value, even "
                "when it is the cpu value, so that a CPU-sized value never runs on a GPU unnoticed."
            )
        if self.name == "gpu":
            return gpu
        if self.name == "smoke" and smoke is not None:
            return smoke
        return cpu

    def knob(self, name: str, value, *, cpu, gpu=_MISSING, smoke=None, lo: int = 1, hi: int | None = None) -> int:
        """A whole-number parameter: ``value`` when the learner set one, else the profile's choice, checked
        against ``[lo, hi]``: ``STEPS = profile.knob("STEPS", STEPS, cpu=48, smoke=4, gpu=200)``."""
        chosen = self.pick(cpu, gpu=gpu, smoke=smoke) if value is None else value
        return check_int(name, chosen, lo, hi)

    def env(self) -> dict:
        """The environment of this profile's ranks, for a launch: on the gpu profile one GPU per rank, the
        first of this process's own (:func:`devices.gpu_env`); elsewhere none (:func:`devices.cpu_env`: where
        GPUs exist, they are hidden). The gpu shape on the CPU gets the gpu profile's, as a GPU machine would."""
        if self.name == "gpu":
            return {"CUDA_VISIBLE_DEVICES": ",".join(devices.visible_gpus(self.nproc))}
        return devices.cpu_env()

    def summary(self) -> dict:
        """A plain dict for tables and the run report."""
        return {
            "profile": self.name,
            "requested": self.requested,
            "why": self.reason,
            "device": self.device,
            "backend": self.backend,
            "processes": self.nproc,
            "GPUs visible": self.gpus,
            "dtype": self.dtype,
            "model": self.model or "(profile default)",
        }

    def _repr_markdown_(self) -> str:
        rows = "\n".join(f"| {k} | {v} |" for k, v in self.summary().items())
        return f"| setting | value |\n|---|---|\n{rows}"


def ranks_on_cpu(profile: Profile, gpu_section: int | None = None) -> Profile:
    """The profile of a lesson whose point is a mechanism (01-07): its ranks run on the CPU over gloo on every
    machine, GPUs hidden from them (a launch not given GPUs is, :func:`devices.launch_env`). On the gpu profile
    that is the cpu profile's values (2 ranks, float32, named "cpu") with a ``note`` saying so and naming the
    lesson's one GPU cell, section ``gpu_section``, which runs the same script on the GPUs; ``gpus`` keeps the
    count for that cell, and the lesson keeps the resolved profile for its launch. cpu and smoke keep their
    values. Every profile it returns is ``cpu_only``: its picks take no ``gpu=``."""
    if profile.name != "gpu":
        return replace(profile, cpu_only=True)
    cell = f"; section {gpu_section} runs the same script on the GPUs, given two or more." if gpu_section else "."
    note = f"This lesson's ranks run on the CPU over gloo on every machine, GPUs hidden from them{cell}"
    return replace(
        profile, name="cpu", device="cpu", backend="gloo", nproc=2, dtype="float32", note=note, cpu_only=True,
        reason=f"{profile.reason}; {note}",
    )  # fmt: skip


def on_gpus(profile: Profile) -> bool:
    """Whether a lesson's GPU cell runs: the resolved profile is gpu with two ranks or more (one GPU holds one
    nccl rank, and one rank talks to nobody)."""
    return profile.name == "gpu" and profile.nproc >= 2


def no_gpu_run(profile: Profile, command: str, runs: str = "the same script over NCCL",
               why: str = "one GPU holds one nccl rank") -> str:  # fmt: skip
    """The sentence a lesson's GPU cell prints where it does not run: what it ``runs`` on 2 or more GPUs, and
    the ``command``."""
    here = "Only one GPU rank here" if profile.name == "gpu" else "No GPUs here"
    return f"{here} ({why}): on 2 or more GPUs this cell runs {runs}, `{command}`."


def gpu_run(profile: Profile, model_info, hub_id: str = GPU_DEFAULT_MODEL) -> tuple:
    """The model and dtype of a command the gpu profile runs, for a lesson to print as text to copy: on the gpu
    profile this run's own (``model_info``, ``profile.dtype``); on any other, the original ModelScope
    tutorial's model by its hub id (``hub_id``, never downloaded here) in bfloat16."""
    if profile.name == "gpu":
        return model_info, profile.dtype
    return models.ModelInfo(name=hub_id, path=hub_id, source="ModelScope", hub_id=hub_id), "bfloat16"


def _choices(values) -> str:
    quoted = [repr(v) for v in values]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]


def check_choice(parameter: str, value, choices) -> None:
    """Stop unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise CourseError(f"{parameter} = {value!r} is not valid; choose {_choices(choices)}.")


def check_int(parameter: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    """Stop unless ``value`` is a whole number in [minimum, maximum]."""
    bounds = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise CourseError(f"{parameter} = {value!r} must be a whole number {bounds}.")
    if value < minimum or (maximum is not None and value > maximum):
        raise CourseError(f"{parameter} = {value!r} is out of range; use a whole number {bounds}.")
    return value


def check_seeds(parameter: str, value, most: int = 10) -> list[int]:
    """Stop unless ``value`` is a list of 1 to ``most`` different whole numbers (random seeds)."""
    if (
        not isinstance(value, (list, tuple))
        or not 1 <= len(value) <= most
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value)
        or len(set(value)) != len(value)
    ):
        raise CourseError(
            f"{parameter} = {value!r} must be a list of 1 to {most} different whole numbers, e.g. [1, 2, 3]."
        )
    return list(value)


def _choose(requested: str, gpus: int) -> tuple[str, str]:
    if requested != "auto":
        return requested, f"asked for by PROFILE = {requested!r}"
    forced = os.environ.get("COURSE_PROFILE", "").strip()
    if forced:
        check_choice("COURSE_PROFILE (environment)", forced, PROFILES[1:])
        return forced, f"PROFILE = 'auto' and the environment sets COURSE_PROFILE={forced}"
    if gpus:
        return "gpu", f"PROFILE = 'auto' and {gpus} CUDA GPU(s) are visible"
    return "cpu", "PROFILE = 'auto' and no CUDA GPU is visible"


def _check_model(model, profile: str) -> str | None:
    if model is None or model == "":
        return None
    if not isinstance(model, (str, os.PathLike)):
        raise CourseError(f"MODEL = {model!r} must be a model directory, a ModelScope id or None.")
    text = str(model)
    path = Path(text).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise CourseError(
                f"MODEL = {text!r} is a folder without a config.json; give a transformers model "
                "directory, or None for the profile's default model."
            )
        return str(path.resolve())
    if profile == "gpu" and _HUB_ID.fullmatch(text):
        return text
    hint = "a ModelScope id such as 'Qwen/Qwen2.5-7B-Instruct', " if profile == "gpu" else ""
    raise CourseError(
        f"MODEL = {text!r} is not an existing model directory; give a local model directory, "
        f"{hint}or None for the {profile} profile's default model."
    )


def resolve(profile: str = "auto", *, nproc: int | None = None, model=None, **knobs) -> Profile:
    """Turn a notebook's parameters into a checked :class:`Profile`.

    ``nproc`` None means the profile's default: 2 ranks on cpu/smoke, one per GPU on gpu.
    Extra keyword arguments are kept, unchanged, in ``Profile.knobs``. In a notebook it also has a
    :class:`~helpers.errors.CourseError` shown as its one sentence, without a traceback.
    """
    install_notebook_handler()  # from here on a CourseError shows as its one sentence, without a traceback
    check_choice("PROFILE", profile, PROFILES)
    note = environment.check_torch()  # a GPU image's own torch: stop with one sentence if it is too old
    if note:
        print(note)
    unusable = environment.cuda_problem()  # a CUDA torch that cannot use the GPU (driver, card): why, in a sentence
    if unusable:
        print(unusable)
    gpus = count_gpus()
    name, reason = _choose(profile, gpus)
    pretended = bool(os.environ.get(devices.PRETEND_ENV))  # tests: torch believes in a GPU that is not there
    stand_in = name == "gpu" and (not gpus or pretended) and os.environ.get(GPU_SHAPE_ON_CPU) == "1"
    if name == "gpu" and not gpus and not stand_in:
        raise CourseError(
            "PROFILE = 'gpu' needs a CUDA GPU and none is visible here; choose 'cpu', 'smoke' or 'auto'."
        )
    if stand_in:
        here = f"torch pretends {gpus} GPU(s) ({devices.PRETEND_ENV})" if pretended else "no GPU here"
        reason += f"; {here}, so it runs in its gpu shape on the CPU ({GPU_SHAPE_ON_CPU}=1: gloo, no CUDA)"

    if nproc is None:
        nproc = gpus if name == "gpu" and not stand_in else 2
    elif name == "gpu" and not stand_in:
        check_int("NPROC", nproc, 1, gpus)
    else:
        check_int("NPROC", nproc, 1)
    on_cuda = name == "gpu" and not stand_in
    dtype = gpu_dtype()[0] if name == "gpu" else "float32"
    return Profile(
        name=name,
        requested=profile,
        reason=reason,
        device="cuda" if on_cuda else "cpu",
        backend="nccl" if on_cuda else "gloo",
        nproc=nproc,
        gpus=gpus,
        model=_check_model(model, name),
        knobs=dict(knobs),
        dtype=dtype,
    )
