"""One place decides devices (helpers/devices.py), and the pretend mode (course/pretend/) that tests it: torch
believes a named card is there, so every branch a real GPU takes runs here, and a process meant for the CPU
that still sees the card fails at once, with the stack that used it."""

import json
import os
import subprocess
import sys

import pytest

from course import gpu_check
from helpers import devicemap, devices, launching, paths, profiles

PROBE = """
import json, os, sys, traceback
import torch
out = {"available": torch.cuda.is_available(), "count": torch.cuda.device_count()}
if out["count"]:
    out.update(name=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
               memory=torch.cuda.get_device_properties(0).total_memory, bf16=torch.cuda.is_bf16_supported(),
               bf16_native=torch.cuda.is_bf16_supported(including_emulation=False))
from helpers import devices
out["dtype"] = devices.gpu_dtype()[0]
if "--deepspeed" in sys.argv:  # what DeepSpeed does at start-up on a rank: pick its accelerator, take a device
    from deepspeed.accelerator import get_accelerator
    out["accelerator"] = get_accelerator().device_name()
    try:
        get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", 0)))
        out["set_device"] = "ok"
    except Exception as error:
        out["set_device"] = f"{type(error).__name__}: {error}"
if "--tensor" in sys.argv:
    try:
        torch.ones(1, device="cuda")
    except Exception as error:
        out["tensor"] = f"{type(error).__name__}: {error}"
print("PROBE " + json.dumps(out))
"""


def pretend_env(card: str | None, **extra) -> dict:
    """This process's environment as gpu-check's pretend mode gives it (without the card: as it is)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", devices.PRETEND_ENV, "DS_ACCELERATOR")}
    if card:
        env.update({devices.PRETEND_ENV: card, "PYTHONPATH": os.pathsep.join([str(gpu_check.PRETEND_SITE), str(paths.ROOT)])})
    return {**env, **extra}


def probe(card: str | None, *flags, **extra) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *flags], env=pretend_env(card, **extra), cwd=paths.ROOT,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    line = [x for x in done.stdout.splitlines() if x.startswith("PROBE ")]
    assert done.returncode == 0 and line, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(line[-1][6:])


@pytest.mark.parametrize(
    "card, name, capability, dtype",
    [("rtx3090", "NVIDIA GeForce RTX 3090", [8, 6], "bfloat16"), ("h100:2", "NVIDIA H100 80GB HBM3", [9, 0], "bfloat16"),
     ("t4", "Tesla T4", [7, 5], "float16"), ("v100", "Tesla V100-SXM2-32GB", [7, 0], "float16")],
)  # fmt: skip
def test_torch_reports_the_pretended_card_and_the_course_picks_its_dtype(card, name, capability, dtype):
    seen = probe(card, "--tensor")
    assert seen["available"] and seen["count"] == (2 if card.endswith(":2") else 1)
    assert (seen["name"], seen["capability"], seen["dtype"]) == (name, capability, dtype)
    assert seen["bf16_native"] == (capability[0] >= 8)  # torch's own function, from the capability
    assert seen["bf16"]  # torch's default counts emulation: True on a T4 too, which is why it is not asked
    assert seen["tensor"].startswith("RealCudaCall: pretend mode") and 'File "<string>"' in seen["tensor"]


def test_without_the_pretend_mode_nothing_changes():
    seen = probe(None)
    assert (seen["available"], seen["count"], seen["dtype"]) == (False, 0, "bfloat16")  # the CPU has bf16


def test_cuda_visible_devices_hides_pretended_cards_as_the_cuda_runtime_does():
    assert probe("h100:2", CUDA_VISIBLE_DEVICES="")["count"] == 0
    assert probe("h100:2", CUDA_VISIBLE_DEVICES="1")["count"] == 1
    assert probe("h100:2", CUDA_VISIBLE_DEVICES="0,5,1")["count"] == 1  # the list ends at a device that is not there


def test_a_process_meant_for_the_cpu_that_sees_a_gpu_fails_in_deepspeed_and_one_that_does_not_runs():
    """Item 2 of the gpu route: ranks that fall back to the CPU while a GPU exists. Seeing it, DeepSpeed picks
    CUDA (deepspeed/accelerator/real_accelerator.py) and takes a device: the pretend mode stops that at once.
    Given what devices.launch_env gives every launch not given GPUs, the same rank stays on the CPU."""
    seen = probe("rtx3090", "--deepspeed", LOCAL_RANK="1")
    assert seen["accelerator"] == "cuda" and seen["set_device"].startswith("RealCudaCall: pretend mode")
    hidden = probe("rtx3090", "--deepspeed", LOCAL_RANK="1", **devices.HIDE_GPUS)
    assert (hidden["available"], hidden["accelerator"], hidden["set_device"]) == (False, "cpu", "ok")


def test_a_launch_not_given_gpus_hides_them_and_one_given_gpus_keeps_them(monkeypatch):
    monkeypatch.setattr(devices, "count_gpus", lambda: 2)
    monkeypatch.setenv(devices.PRETEND_ENV, "h100:2")
    assert devices.launch_env({"A": "1"}) == {**devices.HIDE_GPUS, "A": "1"}
    given = devices.launch_env(devices.gpu_env(2))
    assert given == {"CUDA_VISIBLE_DEVICES": "0,1", "NPROC_PER_NODE": "2", devices.PRETEND_ENV: ""}
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    launch = launching.Launch(["python", "x.py"], env={"B": "2"})
    assert launch.command.startswith("CUDA_VISIBLE_DEVICES='' DS_ACCELERATOR=cpu B=2 python"), launch.command  # shown
    assert devices.PRETEND_ENV not in launching.Launch(["python"], env=devices.gpu_env(1)).command
    monkeypatch.setattr(devices, "count_gpus", lambda: 0)
    assert devices.launch_env({"A": "1"}) == {"A": "1"}  # no GPU: nothing to hide, nothing added to the command


def test_a_profiles_ranks_get_its_gpus_on_the_gpu_profile_and_none_elsewhere(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "count_gpus", lambda: 4)
    gpu = profiles.Profile("gpu", "gpu", "", "cuda", "nccl", 2, 4, None)
    assert gpu.env() == {"CUDA_VISIBLE_DEVICES": "0,1"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # a shared server's share: the first of its own
    assert gpu.env() == {"CUDA_VISIBLE_DEVICES": "4,5"}
    cpu = profiles.ranks_on_cpu(profiles.Profile("gpu", "gpu", "", "cuda", "nccl", 2, 2, None))
    assert cpu.name == "cpu" and cpu.env() == devices.HIDE_GPUS


def test_the_gpu_shape_under_the_pretend_mode_is_the_gpu_profile_on_the_cpu():
    code = "from helpers import profiles; p = profiles.resolve('gpu', nproc=1); print('PROBE', p.name, p.device, p.backend, p.gpus, p.dtype)"
    for card, dtype in (("t4", "float16"), ("rtx3090", "bfloat16")):
        env = pretend_env(card, **{profiles.GPU_SHAPE_ON_CPU: "1"})
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=paths.ROOT, capture_output=True, text=True, timeout=120)
        assert f"PROBE gpu cpu gloo 1 {dtype}" in done.stdout, done.stdout + done.stderr[-2000:]


def test_torchrun_is_this_pythons_own(tmp_path, monkeypatch):
    """A venv over a GPU image's Python has no torchrun of its own: the launcher module runs with this Python."""
    assert launching.torchrun_command() == ["torchrun"]  # .venv has one
    (tmp_path / "python").touch()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert launching.torchrun_command() == [str(tmp_path / "python"), "-m", "torch.distributed.run"]
    launch = launching.prepare_torchrun("x.py", nproc=1)
    assert launch.argv[:3] == [str(tmp_path / "python"), "-m", "torch.distributed.run"]


def test_a_measured_device_map_timeline_waits_for_every_gpu_it_uses(monkeypatch):
    import torch

    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    devicemap.sync_devices({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "lm_head": 1})()
    assert waited == [0, 1]


def test_a_cuda_torch_that_cannot_use_the_gpu_says_why_before_the_profile_falls_back_to_the_cpu(monkeypatch, capsys):
    from helpers import environment

    why = "torch 2.13.0 is a CUDA 13.0 build, and this machine's NVIDIA driver 550.54 runs CUDA up to 12.4: ..."
    monkeypatch.setattr(environment, "cuda_problem", lambda: why)
    monkeypatch.setattr(profiles, "count_gpus", lambda: 0)
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    assert profiles.resolve("auto").name == "cpu"
    assert why in capsys.readouterr().out


def test_an_adapter_is_loaded_on_its_base_models_device(monkeypatch):
    """peft left to itself puts adapter weights on cuda wherever a GPU is visible (peft/utils/other.py,
    infer_device); the pretend mode stopped 09 there, with the base model on the CPU."""
    import types

    import peft
    import torch

    from helpers import answering

    seen = {}

    class Loaded:
        def unload(self):
            return base

    def from_pretrained(model, adapter, **kwargs):
        seen.update(kwargs, adapter=adapter)
        return Loaded()

    base = torch.nn.Linear(2, 2)
    monkeypatch.setattr(peft.PeftModel, "from_pretrained", from_pretrained)
    monkeypatch.setattr(answering, "check_adapter", lambda adapter: None)
    chat = object.__new__(answering.Chat)
    chat.engine = types.SimpleNamespace(model=base)
    with chat.adapter_on("some/adapter"):
        assert seen == {"torch_device": "cpu", "adapter": "some/adapter"}
    assert chat.engine.model is base
