"""helpers.training and helpers.checkpoints: deterministic toys, sampler shards, atomic checkpoints under SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from helpers import checkpoints, compare, paths, sampling, training
from helpers.errors import CourseError
from helpers.parallelism import count_parameters


def bit_equal(a: dict, b: dict) -> bool:
    """Two state dicts with the same keys and every tensor identical, bit for bit."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- deterministic toys -----------------------------------------------------------------------------


def test_toy_data_and_model_are_deterministic_and_leave_the_global_rng_alone():
    a, b = training.toy_dataset(64), training.toy_dataset(64)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors, strict=True))
    assert not torch.equal(training.toy_dataset(64, seed=1).tensors[0], a.tensors[0])
    labels = a.tensors[1]
    assert labels.dtype == torch.int64 and labels.min() >= 0 and labels.max() < training.CLASSES
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    m1, m2 = training.toy_model(32), training.toy_model(32)
    assert torch.equal(torch.rand(3), expected), "building a toy model must not consume the global RNG"
    assert bit_equal(m1.state_dict(), m2.state_dict())
    assert not bit_equal(m1.state_dict(), training.toy_model(32, seed=1).state_dict())
    assert count_parameters(m1) == 32 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10


# --- DistributedSampler ---------------------------------------------------------------------------------


def test_sampler_shards_are_disjoint_and_set_epoch_reshuffles():
    with_epoch = sampling.sampler_indices(40, 2, epochs=3, set_epoch=True)
    without = sampling.sampler_indices(40, 2, epochs=3, set_epoch=False)
    assert all(sampling.disjoint_cover(ranks, 40) for ranks in with_epoch)
    assert with_epoch != [with_epoch[0]] * 3, "set_epoch: a new order in a later epoch"
    assert without == [without[0]] * 3, "without it: epoch 0's order every epoch"
    assert with_epoch[0] == without[0], "epoch 0 is the same either way"
    table = sampling.sample_table(with_epoch, show=4)
    assert [row["epoch"] for row in table] == [0, 1, 2] and table[0]["rank 1"].endswith("…")


def test_sampler_pads_uneven_data_with_repeats():
    shards = sampling.sampler_indices(1000, 3, epochs=1)[0]
    assert [len(s) for s in shards] == [334, 334, 334]
    flat = [i for s in shards for i in s]
    assert set(flat) == set(range(1000)) and len(flat) - len(set(flat)) == 2
    assert not sampling.disjoint_cover(shards, 1000)


def test_knob_checks_stop_with_one_sentence():
    assert training.check_layout(64, 2, 8, 2) == 2
    for call, words in (
        (lambda: training.check_layout(60, 2, 8, 2), "multiple of 32"),
        (lambda: training.check_kill_at(3, 2, 12), "KILL_AT = 3"),
        (lambda: training.check_kill_at(2, 2, 12), "from 4 to 12"),
        (lambda: training.check_kill_at(14, 2, 12), "12 steps"),
        (lambda: training.check_world(1), "NPROC = 1"),
        (lambda: training.check_world(3), "even number"),
    ):
        with pytest.raises(CourseError) as info:
            call()
        message = str(info.value)
        assert words in message and "\n" not in message and message.endswith(".")
    training.check_kill_at(4, 2, 12)
    training.check_world(2)


# --- atomic checkpoints -------------------------------------------------------------------------------------


def test_atomic_save_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "latest.pt"
    checkpoints.atomic_save({"step": 1, "w": torch.ones(3)}, path)
    checkpoints.atomic_save({"step": 2, "w": torch.zeros(3)}, path)
    assert torch.load(path, weights_only=True)["step"] == 2
    assert checkpoints.partial_files(tmp_path) == []
    assert checkpoints.try_load(path) == (True, "step 2")


WRITER = textwrap.dedent(
    """
    import os, signal, sys, torch
    from pathlib import Path
    from helpers import checkpoints, sampling, swiftcli, training


    class KillAfterBytes:  # a file wrapper that lets `limit` bytes through, then SIGKILLs its own process
        def __init__(self, handle, limit):
            self.handle, self.limit, self.written = handle, limit, 0

        def write(self, data):
            data = bytes(data)
            if self.written + len(data) >= self.limit:
                self.handle.write(data[: self.limit - self.written])
                self.handle.flush()  # the half-written file really is on disk when the process dies
                os.kill(os.getpid(), signal.SIGKILL)
            self.handle.write(data)
            self.written += len(data)
            return len(data)

        def flush(self):
            self.handle.flush()


    folder, mode = Path(sys.argv[1]), sys.argv[2]
    big = {"step": 2, "w": torch.randn(1_000_000)}  # about 4 MB
    if mode == "atomic":  # dies halfway through an atomic write
        checkpoints.atomic_save(big, folder / "latest.pt", wrap=lambda f: KillAfterBytes(f, 2_000_000))
    elif mode == "plain":  # dies halfway through a plain torch.save over the only checkpoint
        with open(folder / "latest.pt", "wb") as f:
            torch.save(big, KillAfterBytes(f, 2_000_000))
    else:  # saves again and again until it is killed from outside
        step = 2
        while True:
            checkpoints.atomic_save({"step": step, "w": torch.full((1_000_000,), float(step))}, folder / "latest.pt")
            step += 1
    """
)


def _writer(tmp_path, mode):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path), mode], cwd=paths.ROOT)


def test_a_kill_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    checkpoints.atomic_save({"step": 1, "w": torch.zeros(10)}, tmp_path / "latest.pt")
    proc = _writer(tmp_path, "atomic")
    assert proc.wait(timeout=120) == -signal.SIGKILL
    partial = checkpoints.partial_files(tmp_path)
    assert len(partial) == 1 and partial[0].stat().st_size == 2_000_000
    assert checkpoints.try_load(partial[0])[0] is False
    assert torch.load(tmp_path / "latest.pt", weights_only=True)["step"] == 1


def test_a_kill_mid_plain_save_destroys_the_only_checkpoint(tmp_path):
    checkpoints.atomic_save({"step": 1, "w": torch.zeros(10)}, tmp_path / "latest.pt")
    proc = _writer(tmp_path, "plain")
    assert proc.wait(timeout=120) == -signal.SIGKILL
    ok, why = checkpoints.try_load(tmp_path / "latest.pt")
    assert not ok and why, "a half-written plain torch.save must not load"


def test_sigkill_from_outside_during_repeated_saves_never_breaks_latest(tmp_path):
    proc = _writer(tmp_path, "loop")
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "latest.pt").exists() or not checkpoints.partial_files(tmp_path):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)  # a temporary file exists: most likely mid-write
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    state = torch.load(tmp_path / "latest.pt", weights_only=True)
    assert state["step"] >= 2 and torch.all(state["w"] == float(state["step"]))


# --- small pieces --------------------------------------------------------


def test_the_fault_story_reads_the_event_log(tmp_path):
    with open(tmp_path / "events.jsonl", "a") as log:  # as the training script writes them
        for event in (
            dict(event="start", attempt=0, step=0),
            dict(event="step", attempt=0, step=1, loss=2.0),
            dict(event="saved", attempt=0, step=1),
            dict(event="crash", attempt=0, step=2),
            dict(event="start", attempt=1, step=1),
            dict(event="done", attempt=1, step=3),
        ):
            log.write(json.dumps({"time": 0.0, **event}) + "\n")
    events = checkpoints.read_events(tmp_path / "events.jsonl")
    assert len(events) == 6
    first, second = checkpoints.fault_story(events)
    assert first["saved"] == [1] and "SIGKILL" in first["ended"] and first["last step"] == 1
    assert second["started at step"] == 1 and second["ended"] == "finished"


def test_comparisons_and_throughput():
    a = {"w": torch.tensor([1.0, 2.0])}
    b = {"w": torch.tensor([1.0, 2.5])}
    assert bit_equal(a, a) and not bit_equal(a, b)
    assert compare.largest_difference(a, b) == 0.5
    assert training.slowest_rank_steps([[1, 4], [2, 3]]) == [2, 4]
    assert training.samples_per_second([0.5, 1.0, 2.0], 10, 2) == 20.0
    assert {"cores", "load average (1 min)"} <= set(training.machine_load())
