"""The hand-written DataParallel: its nine steps, its trace, its arithmetic, and the lesson's checkers."""

import argparse
import threading

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from helpers import bytecount, compare, dp_costs
from helpers import dataparallel as dp
from helpers.errors import CourseError

matplotlib.use("Agg")

SPEC = dp.ModelSpec(inputs=8, width=16, depth=2, classes=5)
BATCH = 24


@pytest.fixture
def batch():
    return dp.make_batch(SPEC, BATCH)


def test_same_seed_same_model_and_batch():
    a, b = dp.make_model(SPEC, seed=3), dp.make_model(SPEC, seed=3)
    assert compare.largest_difference(a, b) == 0
    assert compare.largest_difference(a, dp.make_model(SPEC, seed=4)) > 0
    (x1, y1), (x2, y2) = dp.make_batch(SPEC, 6, seed=9), dp.make_batch(SPEC, 6, seed=9)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (6, SPEC.inputs) and int(y1.max()) < SPEC.classes


def test_spec_round_trips_through_command_line_flags():
    parser = argparse.ArgumentParser()
    for name in ("inputs", "width", "depth", "classes"):
        parser.add_argument(f"--{name}", type=int)
    assert dp.ModelSpec(**vars(parser.parse_args(SPEC.args()))) == SPEC


def test_nine_steps_in_order_with_forward_and_backward_in_one_thread_per_device(batch):
    trace = dp.ThreadedDataParallel(dp.make_model(SPEC), 3).step(*batch)
    assert trace.step_names() == list(dp.STEPS)
    assert len(dp.STEPS) == 9
    for step in ("parallel forward", "parallel backward"):
        events = [e for e in trace.events if e.step == step]
        assert sorted(e.device for e in events) == [0, 1, 2]
        assert {e.thread for e in events} == {"worker-dev0", "worker-dev1", "worker-dev2"}
    serial = [e for e in trace.events if "parallel" not in e.step]
    assert serial and all(e.device == dp.MAIN and e.thread == threading.main_thread().name for e in serial)
    assert all(e.end >= e.start and e.cpu >= 0 for e in trace.events)


def test_one_device_runs_inline_without_threads(batch):
    with dp_costs.count_thread_starts() as started:
        trace = dp.ThreadedDataParallel(dp.make_model(SPEC), 1).step(*batch)
    assert started[0] == 0
    assert trace.moved() == [0]
    assert trace.step_names() == list(dp.STEPS)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_gradients_and_update_equal_a_single_device_step(k, batch):
    mine, reference = dp.make_model(SPEC), dp.make_model(SPEC)
    trace = dp.ThreadedDataParallel(mine, k).step(*batch)
    loss = dp.single_device_step(reference, *batch)
    assert abs(trace.loss - loss) < 1e-6
    assert compare.largest_difference(compare.gradients(mine), compare.gradients(reference)) < 1e-6
    assert compare.largest_difference(mine, reference) < 1e-6
    assert compare.largest_difference(mine, dp.make_model(SPEC)) > 1e-4  # the update did change the weights


@pytest.mark.parametrize("rows, k", [(9, 4), (10, 4), (5, 4), (7, 3)])
def test_an_uneven_batch_is_sliced_as_torch_chunk_slices_it_and_idle_devices_do_nothing(rows, k):
    """torch's scatter slices with Tensor.chunk (fewer slices than devices when the rows run out) and
    DataParallel replicates to device_ids[:len(inputs)]: the devices past the slices get no work at all."""
    mine, reference = dp.make_model(SPEC), dp.make_model(SPEC)
    x, y = dp.make_batch(SPEC, rows)
    trace = dp.ThreadedDataParallel(mine, k).step(x, y)
    want = [len(c) for c in x.chunk(k)]
    forwards = sorted((e.device, e.what) for e in trace.events if e.step == "parallel forward")
    assert forwards == [(d, f"forward of {n} rows") for d, n in enumerate(want)]
    idle = set(range(len(want), k))
    assert not [e for e in trace.events if e.device in idle or e.src in idle or e.dst in idle]
    assert all(trace.held_bytes()[d] == 0 and trace.moved()[d] == 0 for d in idle)
    loss = dp.single_device_step(reference, x, y)
    assert abs(trace.loss - loss) < 1e-6
    assert compare.largest_difference(mine, reference) < 1e-6


def test_bytes_moved_follow_the_nine_steps(batch):
    k = 4
    model = dp.make_model(SPEC)
    trace = dp.ThreadedDataParallel(model, k).step(*batch)
    weights = bytecount.nbytes(model)
    by_step = {s: sum(e.nbytes for e in trace.events if e.step == s) for s in dp.STEPS}
    x, _ = batch
    rows_elsewhere = BATCH - len(x.chunk(k)[0])
    assert by_step["scatter inputs"] == rows_elsewhere * SPEC.inputs * 4
    assert by_step["replicate model"] == (k - 1) * weights
    assert by_step["gather outputs"] == rows_elsewhere * SPEC.classes * 4
    assert by_step["loss gradient"] == rows_elsewhere * SPEC.classes * 4
    assert by_step["reduce gradients"] == (k - 1) * weights
    for step in ("parallel forward", "loss on main", "parallel backward", "update"):
        assert by_step[step] == 0
    moved = trace.moved()
    assert moved[dp.MAIN] == sum(moved[1:])  # dev0 is at one end of every copy
    assert len(set(moved[1:])) == 1  # equal slices: every other device moves the same
    held = trace.held_bytes()
    assert all(held[dp.MAIN] > h for h in held[1:])


def test_held_bytes_count_a_shared_storage_once():
    trace = dp.Trace(1)
    t = torch.zeros(10)
    trace.hold(0, t, t[:5], [t])
    assert trace.held_bytes() == [40]


def test_replicas_get_the_main_weights_every_step(batch):
    model = dp.make_model(SPEC)
    parallel = dp.ThreadedDataParallel(model, 2)
    parallel.step(*batch)
    parallel.step(*batch)  # step 2 of this step copied the weights after the first update
    before_update = parallel.replicas[1]
    assert before_update is not model and parallel.replicas[0] is model
    assert compare.largest_difference(before_update, model) > 0  # the second update happened after replication
    parallel.step(*batch)
    reference = dp.make_model(SPEC)
    optimizer = dp.make_optimizer(reference)
    for _ in range(3):
        dp.single_device_step(reference, *batch, optimizer)
    assert compare.largest_difference(model, reference) < 1e-6


def test_threads_errors_reach_the_caller():
    parallel = dp.ThreadedDataParallel(dp.make_model(SPEC), 2)
    with pytest.raises(RuntimeError):
        parallel.step(torch.zeros(4, SPEC.inputs + 1), torch.zeros(4, dtype=torch.long))


def test_bad_sizes_are_course_errors():
    with pytest.raises(CourseError, match="k = 0"):
        dp.ThreadedDataParallel(dp.make_model(SPEC), 0)
    with pytest.raises(CourseError, match="cannot be split over 4"):
        dp.ThreadedDataParallel(dp.make_model(SPEC), 4).step(*dp.make_batch(SPEC, 3))
    with pytest.raises(CourseError, match="BATCH = 3 cannot be split over K_MAX = 4"):
        dp.check_batch(3, 4, 2)
    with pytest.raises(CourseError, match="multiple of 2"):
        dp.check_batch(9, 4, 2)
    dp.check_batch(8, 4, 2)


def test_trace_tables_and_timeline_spans(batch):
    trace = dp.ThreadedDataParallel(dp.make_model(SPEC), 2).step(*batch)
    rows = trace.rows()
    assert len(rows) == len(trace.events)
    assert rows[0]["step"] == "1. scatter inputs" and rows[0]["start ms"] == 0
    per_step = trace.per_step()
    assert [r["step"].split(". ", 1)[1] for r in per_step] == list(dp.STEPS)
    assert sum(r["bytes moved"] for r in per_step) == sum(e.nbytes for e in trace.events)
    spans = trace.spans()
    assert {s["lane"] for s in spans} == {"dev0 (main)", "dev1"}
    assert {s["label"] for s in spans} == set(dp.STEPS) <= set(dp.STEP_COLORS)
    assert trace.wall() >= max(trace.busy()[1:])
    ax = dp.plot_timeline(trace, title="t")
    assert len(ax.patches) == len(trace.events)


def test_burden_and_step_times_measure_every_k():
    rows = dp_costs.burden(SPEC, BATCH, 3, repeats=2)
    assert [r["K"] for r in rows] == [1, 2, 3]
    assert rows[0]["main MB moved"] == 0 and rows[0]["main share of CPU time"] == 1
    for r in rows[1:]:
        assert r["main MB moved"] == pytest.approx((r["K"] - 1) * r["other MB moved"])
        assert r["main share of bytes moved"] == pytest.approx(0.5)
        assert r["main MB held"] > r["other MB held"]
        assert 0 < r["main share of CPU time"] < 1
    times = dp_costs.step_times(SPEC, BATCH, 2, steps=2)
    assert [r["K"] for r in times] == [0, 1, 2]
    assert all(r["step ms"] > 0 for r in times)
    assert all(r["fwd+bwd wall ms"] > 0 and r["fwd+bwd thread CPU ms"] > 0 for r in times[1:])
    assert all(r["q1 ms"] <= r["step ms"] <= r["q3 ms"] for r in times)
    dp_costs.plot_burden(rows)
    dp_costs.plot_step_times({"tiny": times})


def test_spread_is_median_and_quartiles_in_ms():
    assert dp_costs.spread_ms([0.004, 0.001, 0.002, 0.003, 0.005]) == pytest.approx((3.0, 2.0, 4.0))
    assert dp_costs.spread_ms([0.002]) == (2.0, 2.0, 2.0)


@pytest.mark.parametrize(
    ("a", "b", "said"),
    [
        ((10, 9, 11), (20, 18, 22), "A faster by 2.00x, outside the spread"),
        ((20, 18, 22), (10, 9, 11), "B faster by 2.00x, outside the spread"),
        ((10, 8, 13), (10.5, 9, 14), "within the spread of single steps: not a finding"),
        ((10, 9, 12), (11, 10, 13), "within the spread"),  # 10% apart, but the middle halves overlap
    ],
)
def test_a_difference_is_a_finding_only_outside_the_spread(a, b, said):
    assert said in dp_costs.verdict("A", a, "B", b)


def test_threaded_training_equals_one_device_training():
    threaded, t1 = dp_costs.train_threaded(SPEC, BATCH, steps=3, k=2)
    single, t2 = dp_costs.train_single_device(SPEC, BATCH, steps=3)
    assert len(t1) == len(t2) == 3
    assert compare.largest_difference(threaded, single) < 1e-6
    dp_costs.plot_dp_vs_ddp({"threads": t1, "one device": t2})


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, nn.DataParallel uses it")
def test_torch_dataparallel_is_a_pass_through_on_cpu():
    seen = dp_costs.torch_dataparallel_on_cpu(SPEC, BATCH)
    assert seen["device_ids"] == [] and seen["wraps the module itself"]
    assert seen["calls"] == {
        "module.forward": 1,
        "scatter": 0,
        "replicate": 0,
        "parallel_apply": 0,
        "gather": 0,
    }
    assert seen["threads started"] == 0
    assert seen["max output difference"] == 0 and seen["max gradient difference"] == 0


def test_count_thread_starts_counts_and_restores():
    original = threading.Thread.start
    with dp_costs.count_thread_starts() as started:
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
    assert started[0] == 1 and threading.Thread.start is original


def test_loss_of_gathered_outputs_is_what_the_main_device_computes(batch):
    model = dp.make_model(SPEC)
    x, y = batch
    expected = F.cross_entropy(model(x), y).item()
    trace = dp.ThreadedDataParallel(model, 3).step(x, y)
    assert trace.loss == pytest.approx(expected, abs=1e-6)


