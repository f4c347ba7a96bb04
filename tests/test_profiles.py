"""Profiles: good values resolve, every bad value stops with one sentence naming the parameter."""

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


def test_pick_by_profile():
    assert profiles.resolve("smoke").pick(cpu=48, smoke=4) == 4
    assert profiles.resolve("cpu").pick(cpu=48, smoke=4) == 48


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
