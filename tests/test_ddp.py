"""Lessons 03-05's helpers: bucket packing, bandwidth maths, the simulated wire and timed hook of the
notebook's inside_overlap.py, checkers, and (on gloo ranks) 03's hand-written ring all-reduce and, read
with 04's inside_buckets.py, DDP's own buckets."""

import ast
import textwrap
import threading
import time

import launched
import pytest
from test_scripts import SCRIPTS, load_script

from helpers import bucketing, bytecount, collective, comm_hooks, compare, exercises, launching, toys
from helpers.errors import CourseError

MiB = bucketing.MiB
overlap_script = load_script("inside_overlap.py")  # the simulated link, timed hook and timed step live there


# --- bucket packing -------------------------------------------------------------------------------


def test_a_bucket_closes_once_it_reaches_its_cap():
    assert bucketing.expected_buckets([3, 3, 3, 3], 6) == [[0, 1], [2, 3]]
    assert bucketing.expected_buckets([3, 3, 3], 7) == [[0, 1, 2]]  # 6 < 7, then 9 >= 7
    assert bucketing.expected_buckets([10, 1, 1], 5) == [[0], [1, 2]]  # one big parameter fills a bucket alone
    assert bucketing.expected_buckets([1, 1, 1], 100) == [[0, 1, 2]]
    assert bucketing.expected_buckets([], 5) == []


def test_the_first_bucket_may_have_its_own_smaller_cap():
    assert bucketing.expected_buckets([2, 2, 2, 2, 2], 6, first_cap_bytes=2) == [[0], [1, 2, 3], [4]]


def test_a_bucket_holds_at_least_its_cap_not_at_most():
    # torch closes a bucket once it holds >= the cap; "close before the next tensor overflows" would give 6
    assert bucketing.expected_buckets([40, 120, 20, 200, 4, 400], 100) == [[0, 1], [2, 3], [4, 5]]


def _torch_assignment(tensors, cap, first_cap=None):
    import torch.distributed as dist

    limits = [cap] if first_cap is None else [first_cap, cap]
    return dist._compute_bucket_assignment_by_size(tensors, limits)[0]


@pytest.mark.parametrize(
    "sizes, dtypes, cap, first_cap",
    [
        ([40, 120, 20, 200, 4, 400], None, 100, None),
        ([40, 120, 20, 200, 4, 400], None, 100, 1000),
        ([400, 4, 4, 4, 4], None, 100, 8),
        ([8, 8, 8, 8], None, 16, None),  # exactly the cap: full
        ([4, 4, 4], None, 10**9, None),  # never full: one bucket
        ([4, 8, 12, 16, 20, 24], None, 0, None),  # cap 0: one tensor per bucket
        ([40, 80, 80, 40, 12, 200, 8], ["f32", "f64", "f32", "f64", "f32", "bf16", "bf16"], 60, None),
        ([40, 80, 80, 40, 12, 200, 8, 16], ["f32", "f64", "f32", "f64", "f32", "bf16", "bf16", "f64"], 60, 10),
        ([1 << 20, 4096, 1 << 21, 2048, 1 << 20, 2048, 1 << 18, 512, 5120, 40][::-1], None, 25 << 20, 1 << 20),
    ],
)
def test_our_packing_is_torchs(sizes, dtypes, cap, first_cap):
    import torch

    kinds = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16}
    dtypes = [kinds[d] for d in dtypes] if dtypes else [torch.float32] * len(sizes)
    tensors = [torch.empty(size // t.itemsize, dtype=t) for size, t in zip(sizes, dtypes, strict=True)]
    assert [t.numel() * t.element_size() for t in tensors] == sizes
    keys = [(t.dtype, t.device) for t in tensors]
    ours = bucketing.expected_buckets(sizes, cap, first_cap, kinds=keys)
    assert ours == _torch_assignment(tensors, cap, first_cap)


def test_a_random_mix_packs_as_torch_does():
    import random

    import torch

    rng = random.Random(5)
    for _ in range(50):
        dtypes = [rng.choice([torch.float32, torch.float64, torch.float16]) for _ in range(rng.randint(1, 14))]
        tensors = [torch.empty(rng.choice([1, 3, 50, 700, 4000]), dtype=t) for t in dtypes]
        sizes = [t.numel() * t.element_size() for t in tensors]
        cap, first = rng.choice([1, 100, 1000, 5000]), rng.choice([None, 10, 2000])
        ours = bucketing.expected_buckets(sizes, cap, first, kinds=[(t.dtype, t.device) for t in tensors])
        assert ours == _torch_assignment(tensors, cap, first), (sizes, dtypes, cap, first)


def test_predicted_buckets_follow_the_gradient_ready_order():
    sizes = [40, 10, 30, 20]  # model order
    # backward makes the last parameters ready first
    assert bucketing.predict_buckets(sizes, [3, 2, 1, 0], 50) == [[3, 2], [1, 0]]


def test_bucket_rows_and_layouts_describe_what_the_hook_saw():
    sizes = {"a.weight": 400, "a.bias": 4, "b.weight": 800, "b.bias": 8}
    seen = [
        {"bucket": 1, "params": ["a.bias", "a.weight"], "bytes": 404},
        {"bucket": 0, "params": ["b.bias", "b.weight"], "bytes": 808},
    ]
    rows = bucketing.bucket_rows(seen, sizes)
    assert [r["bucket"] for r in rows] == [0, 1]
    assert rows[0]["params' own bytes"] == 808 and rows[1]["tensors"] == 2
    found = {"0.001": {"first": [{"bucket": 0, "params": list(sizes), "bytes": 1212}], "later": seen}}
    rows = bucketing.layouts(found, sizes)
    assert list(rows) == ["first step, any cap (1 bucket)", "bucket_cap_mb=0.001 (2 buckets)"]
    assert rows["bucket_cap_mb=0.001 (2 buckets)"][0] == [("a.bias", 4), ("a.weight", 400)]


# --- bandwidth maths ------------------------------------------------------------------------------


@pytest.mark.parametrize("n, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_bandwidth_factor(n, factor):
    assert collective.bus_factor(n) == pytest.approx(factor)
    bw = collective.bandwidths(1e9, 0.5, n)
    assert bw["algbw"] == pytest.approx(2e9)
    assert bw["busbw"] == pytest.approx(2e9 * factor)


def test_bandwidth_table_takes_the_slowest_rank():
    def rank(seconds):
        return {"bandwidth": {"ring": [{"bytes": 1000, "seconds": seconds}]}}

    (row,) = collective.bandwidth_table([rank(0.001), rank(0.002)])
    assert row["ms"] == pytest.approx(2.0)
    assert row["algbw GB/s"] == pytest.approx(1000 / 0.002 / 1e9)
    assert row["busbw GB/s"] == pytest.approx(row["algbw GB/s"])  # n = 2: factor 1


def test_human_bytes():
    assert bytecount.human_bytes(4096) == "4 KiB" and bytecount.human_bytes(1.5 * MiB) == "1.5 MiB"
    assert bytecount.human_bytes(64 * MiB) == "64 MiB"
    assert bytecount.human_bytes(100) == "100 B"


# --- timelines and the simulated wire -------------------------------------------------------------


def test_a_serial_link_starts_each_message_when_ready_and_free():
    assert comm_hooks.link_finish_times([0, 0, 0], [1, 1, 1]) == [1, 2, 3]  # queued behind each other
    assert comm_hooks.link_finish_times([0, 5, 6], [1, 1, 1]) == [1, 6, 7]  # the link waits for readiness
    assert comm_hooks.link_finish_times([0, 0.5], [2, 0.1]) == [2, 2.1]


def step(overlap, buckets):
    return {
        "overlap": overlap,
        "start": 0.0,
        "forward_end": 1.0,
        "backward_end": 3.0,
        "comm_end": 4.0,
        "end": 4.5,
        "buckets": buckets,
    }


def test_step_spans_put_compute_on_one_lane_and_each_bucket_on_its_own():
    spans = comm_hooks.step_spans(step(True, [{"bucket": 0, "bytes": 2 * MiB, "ready": 1.5, "done": 2.5}]))
    assert [s["label"] for s in spans] == ["forward", "backward", "optimizer step", "all-reduce"]
    assert {s["lane"] for s in spans} == {"compute", "bucket 0 (2 MiB)"}


def test_typical_step_is_the_one_nearest_the_median():
    steps = [{"overlap": True, "seconds": s} for s in (1.0, 5.0, 2.0)] + [{"overlap": False, "seconds": 9.0}]
    assert comm_hooks.typical_step(steps, True)["seconds"] == 2.0
    assert comm_hooks.median_seconds(steps, False) == 9.0


def test_the_simulated_link_delivers_in_order_after_its_wire_time():
    import torch

    link = overlap_script.SimulatedLink(bandwidth=4 * 1000 / 0.05, latency=0.01)  # 1000 floats: 0.06 s each
    try:
        arrived = []
        start = time.perf_counter()
        futures = [link.send(torch.full((1000,), float(i))) for i in range(3)]
        for i, fut in enumerate(futures):
            fut.then(lambda f, i=i: arrived.append((i, time.perf_counter() - start)))
        values = [fut.wait()[0][0].item() for fut in futures]
    finally:
        link.close()
    assert values == [0.0, 1.0, 2.0]  # nothing travels: each rank keeps its own values
    assert [i for i, _ in sorted(arrived, key=lambda a: a[1])] == [0, 1, 2]
    assert link.wire_seconds(4000) == pytest.approx(0.06)
    assert max(t for _, t in arrived) >= 3 * 0.06 - 1e-3  # one wire: the three waited for each other
    assert "simulated link" not in {t.name for t in threading.enumerate()}  # close() stopped the wire


# --- small pieces ---------------------------------------------------------------------------------


def test_the_models_and_their_fingerprints():
    a, b = toys.mlp([4, 8, 2], seed=0), toys.mlp([4, 8, 2], seed=0)
    assert [n for n, _ in a.named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert compare.fingerprint(a) == compare.fingerprint(b)
    assert bytecount.nbytes(a) == 4 * (4 * 8 + 8 + 8 * 2 + 2)
    with __import__("torch").no_grad():
        next(b.parameters())[0, 0] += 1e-6
    assert compare.fingerprint(a) != compare.fingerprint(b)
    # 04's scripts share inside_common.py, torch only: its model and hash are the helpers' own
    assert overlap_script.timing_widths(512, 3) == [256, 1024, 512, 512, 512, 128, 10]
    assert overlap_script.fingerprint(overlap_script.mlp([4, 8, 2], seed=0)) == compare.fingerprint(a)


def test_show_source_returns_the_source(capsys):
    from helpers import report

    assert "def link_finish_times" in report.show_source(comm_hooks.link_finish_times)
    assert "def link_finish_times" in capsys.readouterr().out  # outside Jupyter it is printed


# --- the exercises --------------------------------------------------------------------------------


# --- two gloo ranks -------------------------------------------------------------------------------

def notebook_function(script: str, name: str):
    """The definition of ``name`` alone, compiled from a written script that does its work at module level."""
    tree = ast.parse(SCRIPTS[script])
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return compile(ast.Module([node], type_ignores=[]), script, "exec")


RING = notebook_function("ring_by_hand.py", "ring_all_reduce")  # 03's ring, by hand


def ring_against_the_library(rank, world):
    """On each rank: 03's ring and dist.all_reduce on the same data, equal for each length."""
    import torch
    import torch.distributed as dist

    space = {"torch": torch, "dist": dist, "rank": rank, "n": world}  # the script's globals
    exec(RING, space)
    same = []
    for numel in (1, 2, 3, 1001):  # fewer elements than ranks, uneven chunks
        data = torch.randint(-99, 99, (numel,), generator=torch.Generator().manual_seed(rank)).float()
        library = data.clone()
        dist.all_reduce(library)
        same.append(torch.equal(space["ring_all_reduce"](data.clone()), library))
    return same


@pytest.mark.parametrize("world", [2, 3])
def test_03s_ring_all_reduce_equals_the_library_on_every_rank(world):
    assert exercises.on_ranks(ring_against_the_library, world) == [[True] * 4] * world


SCRIPT = textwrap.dedent(
    """
    import types

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import inside_buckets  # the notebook's scripts, written beside this one
    import inside_overlap
    from helpers import bucketing, compare, toys
    from launched import exit_together, save_result

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    me = types.SimpleNamespace(rank=dist.get_rank(), world=dist.get_world_size(), device=torch.device("cpu"))

    x, y = inside_overlap.make_batch(bucketing.ANATOMY_WIDTHS, 4, me.rank, me.device)
    buckets = {}
    for cap in (0.1, 1.0):
        net = DDP(toys.mlp(bucketing.ANATOMY_WIDTHS, seed=0), bucket_cap_mb=cap)
        log = inside_overlap.HookLog.of(net.module, me.world)
        net.register_comm_hook(log, inside_overlap.timed_allreduce_hook)
        for _ in range(3):
            log.reset()
            F.mse_loss(net(x), y).backward()
        seen = sorted(({k: r[k] for k in ("bucket", "params", "bytes")} for r in log.records), key=lambda r: r["bucket"])
        buckets[cap] = {"seen": seen, "ddp": inside_buckets.ddp_buckets(net)}

    prints = {}
    for overlap in (True, False):  # one step each way from the same start: the same update
        net = DDP(toys.mlp(bucketing.ANATOMY_WIDTHS, seed=0), bucket_cap_mb=1.0)
        log = inside_overlap.HookLog.of(net.module, me.world)
        net.register_comm_hook(log, inside_overlap.timed_allreduce_hook)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        inside_overlap.timed_step(net, x, y, optimizer, log)  # warm-up: DDP rebuilds its buckets
        s = inside_overlap.timed_step(net, x, y, optimizer, log, overlap=overlap, buckets=inside_overlap.buckets_from_log(log, net.module))
        prints[overlap] = compare.fingerprint(net.module)
        assert any(b["ready"] < s["backward_end"] for b in s["buckets"]) == overlap  # sent while backward ran
    save_result({"buckets": buckets, "prints": prints})
    exit_together()
    """
)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp")
    mp = pytest.MonkeyPatch()
    mp.setenv("COURSE_BUILD_DIR", str(folder / "build"))
    script = folder / "ddp_under_test.py"
    script.write_text(SCRIPT)
    for name in ("inside_buckets.py", "inside_overlap.py", "inside_common.py"):
        (folder / name).write_text(SCRIPTS[name])
    launched.beside(script)
    try:
        yield launching.torchrun(script, nproc=2, timeout=120, show=False)
    finally:
        mp.undo()


def test_ddp_buckets_match_the_hook_and_the_packing_rule(two_ranks):
    for result in two_ranks.results:
        for cap, found in result["buckets"].items():
            own = found["ddp"]
            names = [n for n, _ in toys.mlp(bucketing.ANATOMY_WIDTHS).named_parameters()]
            sizes = [p.numel() * 4 for p in toys.mlp(bucketing.ANATOMY_WIDTHS).parameters()]
            seen = [[names.index(p) for p in b["params"]] for b in found["seen"]]
            assert own["rebuilt"] and seen == own["param_indices"]
            assert own["grad_ready_order"] == list(reversed(range(len(names))))
            assert seen == bucketing.predict_buckets(sizes, own["grad_ready_order"], int(float(cap) * MiB))
            assert sum(b["bytes"] for b in found["seen"]) == sum(sizes) == own["total_parameter_bytes"]
    counts = {cap: len(found["seen"]) for cap, found in two_ranks.results[0]["buckets"].items()}
    assert counts == {"0.1": 4, "1.0": 3}


def test_overlap_and_the_no_overlap_baseline_make_the_same_update(two_ranks):
    prints = [r["prints"] for r in two_ranks.results]
    assert prints[0] == prints[1]  # the ranks agree
    assert prints[0]["true"] == prints[0]["false"]  # and both ways of averaging give the same bits


def test_the_link_thread_does_not_block_the_caller():
    import torch

    link = overlap_script.SimulatedLink(bandwidth=8.0, latency=0.0)  # 4 bytes take half a second
    try:
        t = time.perf_counter()
        fut = link.send(torch.zeros(1))
        assert not fut.done()  # send returned with the message still on the wire
        assert "simulated link" in {t.name for t in threading.enumerate()}
        fut.wait()
        assert time.perf_counter() - t >= 0.5
    finally:
        link.close()


def test_summaries_of_the_measurements():
    steps = [
        {"overlap": True, "seconds": 0.2, "backward_seconds": 0.12},
        {"overlap": False, "seconds": 0.3, "backward_seconds": 0.1},
    ]
    (row,) = comm_hooks.overlap_table({"gloo": steps})
    assert row["speedup"] == pytest.approx(1.5) and row["backward alone (ms)"] == pytest.approx(100)
    sweep = [
        {"network": "gloo", "cap_mb": 1, "seconds": 0.3},
        {"network": "gloo", "cap_mb": 25, "seconds": 0.2},
        {"network": "simulated", "cap_mb": 1, "seconds": 0.1},
    ]
    assert comm_hooks.best_caps(sweep) == {"gloo": 25, "simulated": 1}
    apart, overlapping = [0.20, 0.21, 0.22, 0.23], [0.30, 0.31, 0.29, 0.32]
    assert comm_hooks.clearly_faster(apart, overlapping) and not comm_hooks.clearly_faster(overlapping, apart)
    assert not comm_hooks.clearly_faster([0.20, 0.25, 0.30, 0.35], [0.28, 0.33, 0.38, 0.43])  # quartiles overlap
    assert not comm_hooks.clearly_faster([0.1], [0.5])  # one sample has no spread
    for row, samples in zip(sweep, ([0.31, 0.30, 0.29], [0.2, 0.21, 0.19], [0.1, 0.1, 0.1]), strict=True):
        row["samples"] = samples
    assert comm_hooks.best_cap_is_clear(sweep) == {"gloo": True, "simulated": False}  # one cap: no runner-up
    rows = [{"implementation": "a", "busbw GB/s": 1.0}, {"implementation": "a", "busbw GB/s": 3.0}]
    assert collective.peak_busbw(rows) == {"a": 3.0}


def test_on_ranks_runs_a_notebook_function_on_real_ranks_and_reports_a_failed_or_hung_rank():
    import torch
    import torch.distributed as dist

    def total(rank, world):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        return (rank, world, t.item())

    assert exercises.on_ranks(total, 3) == [(0, 3, 6.0), (1, 3, 6.0), (2, 3, 6.0)]

    def fails_on_one(rank, world):
        if rank == 1:
            raise ValueError("bad shard")
        return rank

    with pytest.raises(
        CourseError, match=r"rank 1 failed: ValueError: bad shard \(line \d+, in fails_on_one\)"
    ):
        exercises.on_ranks(fails_on_one, 2)

    def loses_its_peer_first(rank, world):  # gloo's view when the other rank dies during set-up
        if rank == 0:
            raise RuntimeError("Gloo connectFullMesh failed with Connection closed by peer [127.0.0.1]:1")
        time.sleep(exercises.PEER_GRACE_S + 1)  # the cause comes late, as on a busy machine: it is still heard
        raise ValueError("bad shard")

    with pytest.raises(CourseError, match=r"rank 1 failed: ValueError: bad shard"):
        exercises.on_ranks(loses_its_peer_first, 2)

    def waits_alone(rank, world):
        if rank == 0:
            dist.all_reduce(torch.ones(1))  # rank 1 never joins this collective
        else:
            time.sleep(30)

    start = time.monotonic()
    with pytest.raises(CourseError, match="did not all finish within 3 s"):
        exercises.on_ranks(waits_alone, 2, timeout=3)
    assert time.monotonic() - start < 10


def test_on_ranks_brings_back_the_tensors_a_rank_returns_though_the_rank_has_exited(monkeypatch):
    """Through multiprocessing's own pickler a returned tensor's storage travels as a file descriptor that the
    parent fetches from the rank's process (torch's reduce_storage, multiprocessing's resource_sharer.DupFd);
    a rank exits as soon as it has sent, so a parent that read late (a busy machine) got EOFError or
    ConnectionResetError. Here the parent always reads late."""
    import multiprocessing.queues

    import torch

    real_get = multiprocessing.queues.Queue.get

    def late_get(self, *args, **kwargs):
        time.sleep(0.5)  # the ranks have sent and exited by now
        return real_get(self, *args, **kwargs)

    monkeypatch.setattr(multiprocessing.queues.Queue, "get", late_get)

    def tensors(rank, world):
        return [torch.full((3,), float(rank)), torch.tensor([rank, -rank], dtype=torch.float64)[1]]

    got = exercises.on_ranks(tensors, 3)
    assert [[t.tolist() for t in pair] for pair in got] == [[[r] * 3, -r] for r in (0.0, 1.0, 2.0)]

    def unpicklable(rank, world):
        return lambda: rank

    with pytest.raises(CourseError, match="rank 0 failed: its result could not be sent back"):
        exercises.on_ranks(unpicklable, 2)


def test_alpha_beta_fit_recovers_a_line_and_keeps_latency_non_negative():
    sizes = [2**18, 2**20, 2**22, 2**24]
    alpha, beta = collective.fit_alpha_beta(sizes, [1e-3 + s / 125e6 for s in sizes])  # 1 ms + 1 Gbit/s
    assert alpha == pytest.approx(1e-3, rel=1e-6) and 1 / beta == pytest.approx(125e6, rel=1e-6)
    alpha, beta = collective.fit_alpha_beta(sizes, [s / 125e6 - 1e-4 for s in sizes])  # "negative latency"
    assert alpha == 0.0 and 1 / beta == pytest.approx(125e6, rel=0.05)
    with pytest.raises(CourseError, match="two or more distinct"):
        collective.fit_alpha_beta([2**20, 2**20], [0.1, 0.2])
    with pytest.raises(CourseError, match="do not grow"):
        collective.fit_alpha_beta([2**20, 2**22], [0.2, 0.1])


def test_paired_speedups_and_quartiles():
    steps = [{"overlap": o, "seconds": t} for o, t in [(True, 1.0), (False, 1.5), (True, 2.0), (False, 2.0)]]
    assert comm_hooks.paired_speedups(steps) == [1.5, 1.0]
    assert comm_hooks.quartiles([3.0]) == (3.0, 3.0, 3.0)
    low, mid, high = comm_hooks.quartiles([1.0, 2.0, 3.0, 4.0, 5.0])
    assert low < mid == 3.0 < high


def test_plot_link_draws_the_fastest_repeat_and_the_fitted_line():
    import matplotlib

    matplotlib.use("Agg")
    sizes = (2**18, 2**20, 2**22)
    rows = [{"bytes": s, "samples": [s / 1e8 + 0.001, s / 1e8, s / 1e8 + 0.002]} for s in sizes]  # 800 Mbit/s
    fits = {1000.0: collective.fit_alpha_beta(list(sizes), [min(r["samples"]) for r in rows])}
    ax = collective.plot_link({1000.0: rows}, fits).axes[0]
    fitted = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(fitted) == 1
    assert list(fitted[0].get_ydata()) == pytest.approx([s / 1e8 * 1e3 for s in sizes])
    assert any("(800 Mbit/s)" in text.get_text() for text in ax.get_legend().get_texts())


