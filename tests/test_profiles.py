"""Profiles: good values resolve, every bad value stops with one sentence naming the parameter."""

import json
import re
from pathlib import Path

import pytest

from helpers import profiles
from helpers.errors import CourseError


@pytest.fixture(autouse=True)
def no_forced_profile(monkeypatch):
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    monkeypatch.setattr(profiles, "count_gpus", lambda: 0)


def one_sentence(message: str) -> bool:
    return message.endswith(".") and "\n" not in message and message.count(". ") == 0


def test_auto_without_gpu_is_cpu():
    p = profiles.resolve("auto")
    assert (p.name, p.backend, p.device, p.nproc) == ("cpu", "gloo", "cpu", 2)
    assert "no CUDA GPU" in p.reason


def test_auto_with_gpus_is_gpu_one_process_per_gpu(monkeypatch):
    monkeypatch.setattr(profiles, "count_gpus", lambda: 4)
    p = profiles.resolve("auto")
    assert (p.name, p.backend, p.nproc) == ("gpu", "nccl", 4)


def test_environment_forces_auto(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    assert profiles.resolve("auto").name == "smoke"
    assert profiles.resolve("cpu").name == "cpu"  # an explicit choice wins


def test_pick_by_profile(monkeypatch):
    assert profiles.resolve("smoke").pick(cpu=48, smoke=4, gpu=200) == 4
    assert profiles.resolve("cpu").pick(cpu=48, smoke=4, gpu=200) == 48
    assert profiles.resolve("cpu").pick(cpu=48, gpu=200) == 48
    assert profiles.resolve("smoke").pick(cpu=48, gpu=200) == 48  # no smoke value: smoke runs the cpu value
    monkeypatch.setattr(profiles, "count_gpus", lambda: 1)
    assert profiles.resolve("gpu").pick(cpu=48, smoke=4, gpu=200) == 200


@pytest.mark.parametrize("name", ["cpu", "smoke", "gpu"])
def test_pick_without_a_gpu_value_is_an_error_on_every_profile(name, monkeypatch):
    monkeypatch.setattr(profiles, "count_gpus", lambda: 1)
    with pytest.raises(TypeError) as info:
        profiles.resolve(name).pick(cpu=48, smoke=4)
    message = str(info.value)
    assert one_sentence(message), message
    assert "gpu=" in message and "cpu value" in message, message


ROOT = Path(__file__).resolve().parents[1]


def _pick_calls(source: str):
    """The argument text of every ``.pick(...)`` call in ``source`` (parentheses balanced)."""
    for match in re.finditer(r"\.pick\(", source):
        depth, end = 1, match.end()
        while depth and end < len(source):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        yield source[match.end() : end - 1]


def _picks_without_gpu(source: str) -> list[str]:
    return [
        " ".join(args.split())
        for args in _pick_calls(source)
        if re.search(r"\bcpu\s*=", args) and not re.search(r"\bgpu\s*=", args)
    ]


def test_the_scan_sees_a_gpu_value_in_a_pick_or_a_knob():
    assert _calls_with_gpu(
        'x = p.knob("X", X, cpu=1, gpu=2)\ny = p.pick(cpu=3)\nz = p.pick(cpu=f(4), gpu=5)'
    ) == ['"X", X, cpu=1, gpu=2', "cpu=f(4), gpu=5"]


def test_the_scan_sees_a_pick_without_gpu():
    assert _picks_without_gpu("x = profile.pick(\n    cpu=4,\n    smoke=(1, 2),\n)") == [
        "cpu=4, smoke=(1, 2),"
    ]
    assert _picks_without_gpu("x = profile.pick(cpu=f(1), gpu=g(2))") == []


def _calls_with_gpu(source: str) -> list[str]:
    """The ``.pick(...)`` and ``.knob(...)`` calls of ``source`` that name a gpu= value."""
    calls = _pick_calls(source.replace(".knob(", ".pick("))
    return [" ".join(args.split()) for args in calls if re.search(r"\bgpu\s*=", args)]


def test_every_pick_names_its_gpu_value():
    """A pick without gpu= would run a CPU-sized value on the gpu profile: every notebook and helper names it,
    except a notebook whose profile is ``profiles.ranks_on_cpu``'s (it never runs a gpu value), which names none."""
    sources, missing, cpu_only, dead = 0, [], 0, []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = [(index, cell) for index, cell in enumerate(cells) if cell["cell_type"] == "code"]
        on_cpu = any("profiles.ranks_on_cpu(" in "".join(cell["source"]) for _, cell in code)
        cpu_only += on_cpu
        for index, cell in code:
            source = "".join(cell["source"])
            sources += ".pick(" in source
            where = f"{path.name} cell {index} ({cell.get('id')})"
            if on_cpu:
                dead += [f"{where}: ({a})" for a in _calls_with_gpu(source)]
            else:
                missing += [f"{where}: .pick({a})" for a in _picks_without_gpu(source)]
    assert cpu_only >= 7, "the lessons of ranks (01-07) take profiles.ranks_on_cpu"
    assert not dead, "gpu= values on a profile that runs on the CPU everywhere:\n" + "\n".join(dead)
    for path in sorted([*(ROOT / "helpers").glob("*.py"), *(ROOT / "course").glob("*.py")]):
        missing += [
            f"{path.relative_to(ROOT)}: .pick({a})"
            for a in _picks_without_gpu(path.read_text(encoding="utf-8"))
        ]
    assert sources >= 9, "the scan found too few cells with picks: has the notebook format changed?"
    assert not missing, "picks without a gpu= value:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"profile": "tpu"}, ["PROFILE", "'tpu'", "'auto'", "'cpu'", "'gpu'", "'smoke'"]),
        ({"profile": "gpu"}, ["PROFILE", "'gpu'", "needs a CUDA GPU", "'cpu'", "'smoke'"]),
        ({"profile": "cpu", "nproc": 0}, ["NPROC", "0", "at least 1"]),
        ({"profile": "cpu", "nproc": -3}, ["NPROC", "at least 1"]),
        ({"profile": "cpu", "nproc": 1.5}, ["NPROC", "whole number"]),
        ({"profile": "cpu", "nproc": "2"}, ["NPROC", "whole number"]),
        (
            {"profile": "cpu", "model": "/no/such/model"},
            ["MODEL", "/no/such/model", "local model directory", "None"],
        ),
        (
            {"profile": "smoke", "model": "Qwen/Qwen2.5-7B-Instruct"},
            ["MODEL", "not an existing model directory"],
        ),
    ],
)
def test_bad_values_give_one_clear_sentence(kwargs, words):
    with pytest.raises(CourseError) as info:
        profiles.resolve(kwargs.pop("profile"), **kwargs)
    message = str(info.value)
    assert one_sentence(message), message
    for word in words:
        assert word in message, (word, message)


def test_env_override_is_validated_too(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "fast")
    with pytest.raises(CourseError, match="COURSE_PROFILE"):
        profiles.resolve("auto")


def test_gpu_nproc_cannot_exceed_gpus(monkeypatch):
    monkeypatch.setattr(profiles, "count_gpus", lambda: 2)
    with pytest.raises(CourseError, match="NPROC = 3 is out of range; use a whole number from 1 to 2"):
        profiles.resolve("gpu", nproc=3)


def test_model_folder_without_config(tmp_path):
    with pytest.raises(CourseError, match="without a config.json"):
        profiles.resolve("cpu", model=str(tmp_path))


def test_model_directory_and_hub_id_accepted(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    assert profiles.resolve("cpu", model=str(tmp_path)).model == str(tmp_path.resolve())
    monkeypatch.setattr(profiles, "count_gpus", lambda: 1)
    assert profiles.resolve("gpu", model="Qwen/Qwen2.5-0.5B-Instruct").model == "Qwen/Qwen2.5-0.5B-Instruct"


def test_knob_checks():
    assert profiles.check_int("STEPS", 3) == 3
    with pytest.raises(CourseError, match=r"STEPS = 0 is out of range; use a whole number at least 1\."):
        profiles.check_int("STEPS", 0)
    with pytest.raises(CourseError, match="MODE = 'x' is not valid; choose 'a' or 'b'."):
        profiles.check_choice("MODE", "x", ("a", "b"))


def test_the_gpu_shape_runs_on_the_cpu_only_when_asked(monkeypatch):
    """Without a GPU, PROFILE = 'gpu' stops, unless a test asks for its gpu shape on the CPU."""
    with pytest.raises(CourseError, match="needs a CUDA GPU"):
        profiles.resolve("gpu")
    monkeypatch.setenv(profiles.GPU_SHAPE_ON_CPU, "1")
    p = profiles.resolve("gpu")
    assert (p.name, p.device, p.backend, p.nproc, p.gpus) == ("gpu", "cpu", "gloo", 2, 0)
    assert "gpu shape on the CPU" in p.reason
    assert p.pick(cpu=40, smoke=2, gpu=60) == 60  # the gpu recipe's values
    assert profiles.resolve("gpu", nproc=3).nproc == 3  # any process count, not bounded by GPUs
    assert profiles.resolve("cpu").device == "cpu" and profiles.resolve("smoke").name == "smoke"


def test_seeds_are_a_short_list_of_different_whole_numbers():
    assert profiles.check_seeds("SEEDS", [1, 2, 3]) == [1, 2, 3]
    for bad in (3, [], [1, 1], [1, "2"], [True], [-1], list(range(11))):
        with pytest.raises(
            CourseError, match=r"SEEDS = .* must be a list of 1 to 10 different whole numbers"
        ):
            profiles.check_seeds("SEEDS", bad)


def test_knob_takes_the_learners_value_or_the_profiles_and_checks_its_range():
    cpu, smoke = profiles.resolve("cpu"), profiles.resolve("smoke")
    assert cpu.knob("STEPS", None, cpu=48, smoke=4, gpu=200) == 48
    assert smoke.knob("STEPS", None, cpu=48, smoke=4, gpu=200) == 4
    assert smoke.knob("STEPS", 7, cpu=48, smoke=4, gpu=200) == 7  # the learner's value wins
    with pytest.raises(CourseError, match=r"STEPS = 0 is out of range; use a whole number from 1 to 9"):
        cpu.knob("STEPS", 0, cpu=48, gpu=200, hi=9)
    with pytest.raises(TypeError, match="no gpu= value"):
        cpu.knob("STEPS", None, cpu=48)


def test_a_lesson_of_ranks_runs_them_on_the_cpu_and_its_picks_take_no_gpu_value(monkeypatch):
    """01-07: on the gpu profile the lesson's ranks are the cpu profile's, GPUs counted for its one GPU cell;
    cpu and smoke keep their values. No pick of such a profile takes gpu=, none may leave it out elsewhere."""
    monkeypatch.setattr(profiles, "count_gpus", lambda: 4)
    gpu = profiles.resolve("gpu")
    lesson = profiles.ranks_on_cpu(gpu, gpu_section=5)
    assert (lesson.name, lesson.device, lesson.backend, lesson.nproc, lesson.dtype) == (
        "cpu",
        "cpu",
        "gloo",
        2,
        "float32",
    )
    assert lesson.gpus == 4 and lesson.cpu_only and lesson.model == gpu.model
    assert (
        one_sentence(lesson.note)
        and "CPU over gloo on every machine" in lesson.note
        and "section 5" in lesson.note
    )
    assert lesson.note in lesson.reason
    assert lesson.pick(cpu=48, smoke=4) == 48 and lesson.knob("STEPS", None, cpu=48, smoke=4) == 48
    assert "section" not in profiles.ranks_on_cpu(gpu).note  # 01 and 07: no GPU cell to name
    with pytest.raises(TypeError) as info:
        lesson.pick(cpu=48, gpu=200)  # a value that would never run
    assert (
        one_sentence(str(info.value)) and "gpu=200" in str(info.value) and "leave gpu= out" in str(info.value)
    )
    with pytest.raises(TypeError):
        lesson.knob("STEPS", None, cpu=48, gpu=200)
    with pytest.raises(TypeError):
        gpu.pick(cpu=48, smoke=4)  # the profile that can be gpu still needs its gpu value
    monkeypatch.setattr(profiles, "count_gpus", lambda: 0)
    for name, value in (("cpu", 48), ("smoke", 4)):
        resolved = profiles.resolve(name, nproc=3)
        on_cpu = profiles.ranks_on_cpu(resolved, gpu_section=5)
        assert on_cpu == profiles.Profile(**{**vars(resolved), "cpu_only": True}), (
            name
        )  # its values unchanged
        assert on_cpu.nproc == 3 and on_cpu.note == "" and on_cpu.pick(cpu=48, smoke=4) == value
        with pytest.raises(TypeError):
            resolved.pick(cpu=48, smoke=4)


def test_a_lessons_gpu_cell_runs_on_two_gpus_or_more_and_otherwise_says_what_it_would_run(monkeypatch):
    monkeypatch.setattr(profiles, "count_gpus", lambda: 2)
    assert profiles.on_gpus(profiles.resolve("gpu")) and not profiles.on_gpus(
        profiles.resolve("gpu", nproc=1)
    )
    assert not profiles.on_gpus(profiles.resolve("cpu")) and not profiles.on_gpus(profiles.resolve("smoke"))
    command = "torchrun --nproc-per-node N x.py --backend nccl"
    for profile, opening in (
        (profiles.resolve("gpu", nproc=1), "Only one GPU rank here"),
        (profiles.resolve("cpu"), "No GPUs here"),
    ):
        sentence = profiles.no_gpu_run(profile, command)
        assert sentence.startswith(opening) and f"`{command}`" in sentence and "over NCCL" in sentence, (
            sentence
        )
        assert sentence.endswith(".") and "\n" not in sentence
