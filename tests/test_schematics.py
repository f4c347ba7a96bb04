"""Schematic figures are computed from the algorithm they draw: the ring's chunk bookkeeping and the overlap
timeline are checked here, the drawings only for what they label."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from helpers import schematics  # noqa: E402


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_the_ring_sums_every_chunk_in_world_minus_one_steps_then_spreads_it(world):
    states = schematics.ring_steps(world)
    assert len(states) == 1 + 2 * (world - 1)
    scattered = states[world - 1]  # the end of reduce-scatter
    for rank in range(world):
        assert scattered["held"][rank][(rank + 1) % world] == frozenset(range(world))
        partial = [c for c in range(world) if len(scattered["held"][rank][c]) < world]
        assert len(partial) == world - 1  # only its own chunk is complete
    assert all(chunk == frozenset(range(world)) for row in states[-1]["held"] for chunk in row)
    for state in states[1:]:  # every rank sends one chunk per step, and every rank receives one
        assert sorted(r for r, _ in state["sent"]) == list(range(world))


def test_overlap_starts_each_all_reduce_when_its_bucket_is_ready_one_at_a_time():
    compute, comm = [1.0, 1.0, 1.0], [1.5, 0.5, 0.5]
    after = schematics.overlap_spans(compute, comm, overlap=False)
    during = schematics.overlap_spans(compute, comm, overlap=True)
    network = [s for s in during if s["lane"] == "network"]
    assert [s["start"] for s in network] == [1.0, 2.5, 3.0]  # bucket 1 waits for bucket 0's all-reduce
    assert max(s["end"] for s in during) == 3.5 < max(s["end"] for s in after) == 5.5


def test_the_figures_say_they_are_schematic():
    fig = schematics.plot_ring(3)
    assert "schematic" in fig.axes[0].get_title()
    ax = schematics.plot_bucket_filling([40, 120, 20, 200, 4, 400], [[5, 4], [3, 2], [1, 0]])
    assert "schematic" in ax.get_title()
    assert sum("full" in t.get_text() for t in ax.texts) == 3  # one launch per bucket
    fig = schematics.plot_overlap([1, 1], [1, 1])
    assert "schematic" in fig.axes[-1].get_xlabel()


def test_the_schematic_draws_both_data_flows():
    fig = schematics.plot_dp_vs_ddp(3)
    left, right = fig.axes
    assert "DataParallel" in left.get_title() and "DDP" in right.get_title()
    assert "Schematic" in fig._suptitle.get_text()


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("method", ["ddp", "zero1", "zero2", "zero3", "fsdp2"])
def test_the_sharding_picture_holds_what_the_formulas_say_and_loses_nothing(world, method):
    from helpers import sharding

    slices = schematics.shard_slices(world, method)
    per_param = sharding.formula_bytes(1, 1, method)
    for rank in range(world):  # what the picture colours for a rank is the formula's bytes for it
        held = {p: per_param[p] * (e - s) for p, (s, e) in slices[rank].items()}
        assert held == pytest.approx(sharding.formula_bytes(1, world, method))
    for part in sharding.PARTS:  # together the ranks hold every parameter's share of every part, once if sharded
        spans = sorted(slices[r][part] for r in range(world))
        if part in sharding.SHARDED[method]:
            assert spans[0][0] == 0 and spans[-1][1] == 1 and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        else:
            assert set(spans) == {(0.0, 1.0)}


def test_the_sharding_picture_has_one_row_per_method_and_says_it_is_schematic():
    fig = schematics.plot_sharding(4)
    assert [ax.get_ylabel() for ax in fig.axes] == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP2"]
    assert "Schematic" in fig._suptitle.get_text()
    labels = [t.get_text() for t in fig.axes[3].texts]
    assert labels[0] == "rank 0: 5 B per parameter"  # ZeRO-3 on 4 ranks: (4 + 4 + 4 + 8) / 4
