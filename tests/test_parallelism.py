"""helpers.parallelism: shard gradients, the two all-reduce schemes and their byte counts, memory per parameter."""

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from torch import nn

from helpers import compare
from helpers import parallelism as par
from helpers.errors import CourseError


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one thread is much faster on a shared 2-core machine; restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


LOSS = nn.CrossEntropyLoss()


# --- shards and gradients -------------------------------------------------------------------------


def test_shard_splits_near_equally_or_by_sizes():
    t = torch.arange(10)
    assert [len(s) for s in par.shard(t, 4)] == [3, 3, 2, 2]
    assert [len(s) for s in par.shard(t, 3, sizes=[1, 4, 5])] == [1, 4, 5]
    assert torch.equal(torch.cat(par.shard(t, 4)), t)


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 8])
def test_mean_of_equal_shard_gradients_is_the_full_batch_gradient(workers):
    x, y = par.make_classification(6 * workers, seed=workers)
    model = par.mlp(seed=workers)
    run = par.simulate(model, LOSS, x, y, workers)
    assert run.sizes == [6] * workers
    assert all(par.same_weights(r, model) and r is not model for r in run.replicas)
    assert compare.largest_difference(run.mean(), par.gradient(model, LOSS, x, y)) < 1e-10


def test_mlp_is_reproducible_and_leaves_the_global_random_state_alone():
    state = torch.random.get_rng_state()
    assert par.same_weights(par.mlp(seed=5), par.mlp(seed=5))
    assert not par.same_weights(par.mlp(seed=5), par.mlp(seed=6))
    assert torch.equal(torch.random.get_rng_state(), state)


def test_gradient_leaves_the_models_own_grad_alone():
    x, y = par.make_classification(8)
    model = par.mlp()
    g = par.gradient(model, LOSS, x, y)
    assert g.shape == (par.count_parameters(model),) and g.dtype == torch.float64
    assert all(p.grad is None for p in model.parameters())


def test_unequal_shards_need_weights():
    sizes = [2, 5, 9]
    x, y = par.make_classification(sum(sizes), seed=3)
    model = par.mlp()
    run = par.simulate(model, LOSS, x, y, 3, sizes=sizes)
    full = par.gradient(model, LOSS, x, y)
    assert run.sizes == sizes
    assert compare.largest_difference(run.mean(), full) > 1e-4
    assert compare.largest_difference(run.weighted_mean(), full) < 1e-10
    with pytest.raises(ValueError):
        par.simulate(model, LOSS, x, y, 2, sizes=sizes)


def test_sum_loss_averaged_is_n_times_too_small_and_summed_is_right():
    x, y = par.make_classification(12)
    model = par.mlp()
    sum_loss = nn.CrossEntropyLoss(reduction="sum")
    run = par.simulate(model, sum_loss, x, y, 3)
    full = par.gradient(model, sum_loss, x, y)
    assert compare.largest_difference(run.total(), full) < 1e-10
    assert compare.largest_difference(run.mean() * 3, full) < 1e-10
    assert compare.largest_difference(run.mean(), full) > 1e-3


def test_synced_statistics_are_the_full_batch_statistics():
    h = torch.randn(20, 7, dtype=torch.float64)
    mean, var = par.synced_statistics(list(torch.split(h, [3, 8, 9])))
    want_var, want_mean = torch.var_mean(h, dim=0, unbiased=False)
    assert compare.largest_difference(mean, want_mean) < 1e-12 and compare.largest_difference(var, want_var) < 1e-12


def test_batchnorm_per_shard_is_wrong_and_synced_matches_full_batch():
    x, y = par.make_classification(16, seed=4)
    model = par.mlp(batchnorm=True)
    one = par.replicate(model, 1)[0]
    full = par.gradient(one, LOSS, x, y)
    local = par.simulate(model, LOSS, x, y, 4)
    synced = par.simulate(model, LOSS, x, y, 4, sync_batchnorm=True)
    assert compare.largest_difference(local.mean(), full) > 1e-4
    assert compare.largest_difference(synced.mean(), full) < 1e-10
    for r in synced.replicas:
        assert compare.largest_difference(r[1].running_mean, one[1].running_mean) < 1e-12
        assert compare.largest_difference(r[1].running_var, one[1].running_var) < 1e-12
        assert r[1].num_batches_tracked.item() == 1
    means = par.batchnorm_means(local)
    assert not torch.equal(means[0], means[1])


def test_sync_batchnorm_without_batchnorm_equals_plain_simulation():
    x, y = par.make_classification(9)
    model = par.mlp()
    plain = par.simulate(model, LOSS, x, y, 3)
    lockstep = par.simulate(model, LOSS, x, y, 3, sync_batchnorm=True)
    for a, b in zip(plain.grads, lockstep.grads, strict=True):
        assert compare.largest_difference(a, b) < 1e-12


def test_sync_batchnorm_needs_a_sequential():
    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = par.mlp(batchnorm=True)

        def forward(self, x):
            return self.inner(x)

    x, y = par.make_classification(8)
    with pytest.raises(TypeError, match="nn.Sequential"):
        par.simulate(Wrapped(), LOSS, x, y, 2, sync_batchnorm=True)


# --- the network and the two schemes ---------------------------------------------------------------


def test_network_counts_bytes_per_link_and_copies():
    net = par.Network(3)
    t = torch.ones(10, dtype=torch.float32)
    got = net.send(0, 2, t)
    net.send(1, 2, torch.ones(5, dtype=torch.float64))
    assert torch.equal(got, t) and got.data_ptr() != t.data_ptr()
    assert net.sent == [40, 40, 0] and net.received == [0, 0, 80]
    assert net.busiest_link == 80 and net.total == 80 and net.messages == 2
    assert net.pairs == {(0, 2): 40, (1, 2): 40}
    with pytest.raises(ValueError):
        net.send(1, 1, t)


@pytest.mark.parametrize("scheme", list(par.SCHEMES.values()), ids=list(par.SCHEMES))
@pytest.mark.parametrize("workers", [2, 3, 4, 7, 8])
@pytest.mark.parametrize("numel", [840, 841])  # 840 splits evenly for every N here, 841 does not
def test_both_schemes_leave_the_sum_on_every_worker(scheme, workers, numel):
    grads = [torch.randn(numel, dtype=torch.float64) for _ in range(workers)]
    originals = [g.clone() for g in grads]
    results = scheme(grads, par.Network(workers))
    want = torch.stack(originals).sum(0)
    assert len(results) == workers
    assert all(compare.largest_difference(r, want) < 1e-12 for r in results)
    assert all(torch.equal(r, results[0]) for r in results)
    assert all(torch.equal(g, o) for g, o in zip(grads, originals, strict=True)), "inputs must stay untouched"


@pytest.mark.parametrize("workers", range(2, 17))
def test_counted_bytes_match_the_formulas_when_chunks_are_equal(workers):
    numel = 720_720
    model_bytes = numel * 4
    ps = par.traffic(par.parameter_server_all_reduce, workers, numel)
    ring = par.traffic(par.ring_all_reduce, workers, numel)
    assert ps["model_bytes"] == ring["model_bytes"] == model_bytes
    assert (
        ps["busiest_link"]
        == par.parameter_server_formula(workers, model_bytes)
        == (workers - 1) * model_bytes
    )
    assert ring["busiest_link"] == par.ring_formula(workers, model_bytes)
    assert ring["busiest_link"] < 2 * model_bytes
    assert ps["total"] == ring["total"] == 2 * (workers - 1) * model_bytes
    assert ps["messages"] == 2 * (workers - 1) and ring["messages"] == 2 * (workers - 1) * workers
    assert ps["network"].received[0] == ps["network"].sent[0] == (workers - 1) * model_bytes
    assert all(0 in pair for pair in ps["network"].pairs)
    assert set(ring["network"].pairs) == {(w, (w + 1) % workers) for w in range(workers)}
    assert len(set(ring["network"].sent)) == 1, "every ring link carries the same load"


@pytest.mark.parametrize("workers", [3, 7, 16])
def test_ring_bytes_with_uneven_chunks_stay_within_one_element_per_step(workers):
    numel = 1001  # 7 x 11 x 13: even chunks for 7 workers, uneven for 3 and 16
    run = par.traffic(par.ring_all_reduce, workers, numel, dtype=torch.float64)
    formula = par.ring_formula(workers, numel * 8)
    assert formula - 2 * (workers - 1) * 8 <= run["busiest_link"] <= formula + 2 * (workers - 1) * 8
    assert run["total"] == 2 * (workers - 1) * numel * 8


def test_traffic_runs_on_meta_tensors_for_real_model_sizes():
    run = par.traffic(par.ring_all_reduce, 8, par.QWEN25_7B_PARAMETERS, dtype=torch.bfloat16, device="meta")
    m = par.QWEN25_7B_PARAMETERS * 2
    assert run["busiest_link"] == par.ring_formula(8, m)
    assert run["results"][0].device.type == "meta"
    ps = par.traffic(par.parameter_server_all_reduce, 8, par.QWEN25_7B_PARAMETERS, torch.bfloat16, "meta")
    assert ps["busiest_link"] == 7 * m


def test_traffic_table_rows():
    rows = par.traffic_table(range(2, 5), 120)
    assert [r["N"] for r in rows] == [2, 3, 4]
    assert [r["ps_busiest"] for r in rows] == [480, 960, 1440]
    assert [r["ring_busiest"] for r in rows] == [480, 640, 720]
    assert all(r["ps_total"] == r["ring_total"] for r in rows)


# --- training --------------------------------------------------------------------------------------


def test_training_with_n_workers_follows_one_worker():
    x, y = par.make_classification(48, seed=1)
    start = par.mlp(seed=1)
    one = par.train(start, x, y, workers=1, steps=12, batch=12)
    four = par.train(start, x, y, workers=4, steps=12, batch=12)
    assert max(abs(a - b) for a, b in zip(one["losses"], four["losses"], strict=True)) < 1e-10
    assert compare.largest_difference(par.flat_params(one["replicas"][0]), par.flat_params(four["replicas"][0])) < 1e-10
    assert all(par.same_weights(r, four["replicas"][0]) for r in four["replicas"])
    assert not par.same_weights(four["replicas"][0], start), "training changed the copies"
    assert par.same_weights(par.mlp(seed=1), start), "the starting model itself is left alone"
    assert four["losses"][-1] < four["losses"][0]
    assert four["bytes_sent_per_worker"][0] > 0 and one["bytes_sent_per_worker"] == [0]


def test_training_refuses_shards_that_do_not_split_evenly():
    x, y = par.make_classification(30)
    with pytest.raises(ValueError):
        par.train(par.mlp(), x, y, workers=4, steps=1, batch=10)


# --- memory ----------------------------------------------------------------------------------------


def test_bytes_per_parameter():
    assert par.FP32_ADAM.total == 16 and par.FP32_ADAM.optimizer_states == 8
    assert par.BF16_MIXED_ADAM.total == 16 and par.BF16_MIXED_ADAM.optimizer_states == 12
    for recipe in par.RECIPES:
        assert sum(recipe.parts().values()) == recipe.total
        assert recipe.total == 16
    assert [r.key for r in par.RECIPES] == ["fp32_adam", "autocast_bf16_adam", "bf16_mixed_adam"]
    assert par.AUTOCAST_BF16_ADAM.parts() == par.FP32_ADAM.parts()  # autocast keeps every state in fp32


def test_memory_rows():
    rows = par.memory_rows({"seven": 7_000_000_000})
    assert [r["recipe"] for r in rows] == [r.name for r in par.RECIPES]
    assert all(abs(r["total GB per worker"] - 112.0) < 1e-9 for r in rows)
    assert rows[1]["optimizer states GB"] == pytest.approx(56.0)  # autocast: Adam's fp32 moments only
    assert rows[2]["optimizer states GB"] == pytest.approx(84.0)  # + DeepSpeed's fp32 master copy
    assert rows[0]["parameters"] == "7.00 B"


def test_qwen_counted_on_meta_matches_the_published_size():
    qwen = par.qwen25_7b_on_meta()
    assert par.count_parameters(qwen) == par.QWEN25_7B_PARAMETERS
    assert {p.device.type for p in qwen.parameters()} == {"meta"}
    h, kv, ff = 3584, 512, 18944  # 4 KV heads x 128
    per_layer = 8 * ((h + h) * 2 + (h + kv) * 2 + (h + ff) * 3)
    assert par.lora_parameters(qwen, 8) == 28 * per_layer == 20_185_088


def test_tied_embeddings_are_counted_once():
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=100,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    tied = par.count_parameters(par.on_meta(config))
    config.tie_word_embeddings = False
    assert par.count_parameters(par.on_meta(config)) == tied + 100 * 16


def test_plots_draw_what_they_are_given():
    fig = par.plot_training_state({"small": 1_000_000, "big": 2_000_000_000})
    assert len(fig.axes) == 3
    per_param = fig.axes[0].containers  # one BarContainer per kind of state, stacked
    totals = [sum(c.patches[k].get_height() for c in per_param) for k in range(len(par.RECIPES))]
    assert totals == [16, 16, 16]
    assert fig.axes[2].get_title().startswith("big\n(2.00 B")
    from helpers import plots

    fig2 = plots.agreeing_runs([1.0, 0.5, 0.25], [1.0, 0.5, 0.2500001])
    assert fig2.axes[1].get_title(loc="left").startswith("max 1e-07; 2 of 3 steps exactly equal")
    matplotlib.pyplot.close("all")


# --- exercise checkers ------------------------------------------------------------------------------




# --- comparing results ------------------------------------------------------------------------------


def test_largest_difference_takes_tensors_lists_state_dicts_and_models():
    a = torch.tensor([1.0, 2.0, 3.0])
    assert compare.largest_difference(a, a + torch.tensor([0.0, -0.5, 0.25])) == 0.5
    assert compare.largest_difference([a, a], [a, a * 2]) == 3.0
    m1, m2 = nn.Linear(2, 2), nn.Linear(2, 2)
    assert compare.largest_difference(m1, m1) == 0
    assert compare.largest_difference(m1.state_dict(), m2.state_dict()) == compare.largest_difference(m1, m2) > 0
    x = torch.ones(3, 2)
    m1(x).sum().backward()
    m2(x).sum().backward()
    assert compare.largest_difference(compare.gradients(m1), compare.gradients(m2)) == 0  # dL/dW = x for both
    small = torch.tensor([1.0], dtype=torch.float32)
    assert compare.largest_difference(small, small + 2**-23) == 2**-23  # float64: not rounded again


@pytest.mark.parametrize(
    "a, b, words",
    [
        ([torch.ones(2)], [torch.ones(2), torch.ones(2)], "not have the same parts"),
        ({"w": torch.ones(2)}, {"v": torch.ones(2)}, "not have the same parts"),
        (torch.ones(3), torch.ones(1), "shape (3,) in one result and (1,)"),
        (1.0, torch.ones(1), "is a float"),
        ([None], [torch.ones(1)], "run backward() first"),
    ],
)
def test_largest_difference_refuses_results_that_do_not_match_in_one_sentence(a, b, words):
    with pytest.raises(CourseError) as info:
        compare.largest_difference(a, b)
    message = str(info.value)
    assert words in message and message.endswith(".") and "\n" not in message, message
