"""Unit tests for helpers.sharding: formulas, byte counting, collective counting, placement, SWIFT's grouping."""

import pytest
import torch
import torch.distributed as dist
from test_scripts import load_script
from torch import nn

from helpers import devicemap, parallelism, sharding
from helpers.errors import CourseError

script = load_script("sharded_train.py")  # 11's script: what a rank holds and sends, measured there

P = 1000


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_formulas_divide_the_right_parts(world):
    ddp = sharding.formula_bytes(P, world, "ddp")
    assert sum(ddp.values()) == P * parallelism.FP32_ADAM.total  # 16 bytes per parameter, whatever N
    z2 = sharding.formula_bytes(P, world, "zero2")
    assert z2["parameters"] == 4 * P
    assert z2["gradients"] == 4 * P / world and z2["Adam moments"] == 8 * P / world
    assert z2["fp32 master copy"] == parallelism.BF16_MIXED_ADAM.master_weights * P / world
    assert sum(sharding.formula_bytes(P, world, "zero3").values()) == pytest.approx(20 * P / world)
    assert sum(sharding.formula_bytes(P, world, "fsdp2").values()) == pytest.approx(16 * P / world)
    mixed = sharding.formula_bytes(P, world, "zero3", parallelism.BF16_MIXED_ADAM)
    assert sum(mixed.values()) == pytest.approx(parallelism.BF16_MIXED_ADAM.total * P / world)


def test_deepspeed_keeps_an_fp32_master_copy_even_of_an_fp32_model():
    """ZeRO's optimizer holds its own fp32 partition of the weights: fp32 Adam's 16 bytes plus 4."""
    r = sharding.DEEPSPEED_FP32
    assert (r.weights, r.gradients, r.master_weights, r.adam_moments) == (4, 4, 4, 8)
    assert r.total == parallelism.FP32_ADAM.total + 4 == 20


@pytest.mark.parametrize("world", [2, 3, 8, 64])
def test_traffic_theory(world):
    wire = {m: sharding.wire_bytes(sharding.theory_traffic(P, world, m), world) for m in sharding.METHODS}
    assert wire["ddp"] == pytest.approx(2 * (world - 1) / world * 4 * P)
    assert wire["zero2"] == pytest.approx(wire["ddp"])
    assert wire["zero3"] == pytest.approx(1.5 * wire["ddp"]) == pytest.approx(wire["fsdp2"])


def test_held_bytes_of_a_plain_model_match_ddp_formula():
    model = script.small_model(features=8, hidden=16, layers=2, classes=4)
    opt = torch.optim.Adam(model.parameters())
    x, y = script.dataset(8, features=8, classes=4)
    nn.CrossEntropyLoss()(model(x), y).backward()
    opt.step()  # creates Adam's moments; gradients are still there
    n = parallelism.count_parameters(model)
    held = script.held_bytes_torch(model, opt)
    assert held == {k: int(v) for k, v in sharding.formula_bytes(n, 1, "ddp").items()}


def test_the_scripts_model_is_the_one_the_notebook_pads_and_counts():
    """11 computes FSDP2's padding and the parameter count from ``sharding.small_model``: the same weights."""
    ours, theirs = script.small_model(hidden=64), sharding.small_model(hidden=64)
    assert [p.shape for p in ours.parameters()] == [p.shape for p in theirs.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters(), strict=True))
    x, y = script.dataset(16)
    assert x.shape == (16, 32) and torch.equal(script.dataset(16)[1], y) and len(set(y.tolist())) > 1


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_collective_counter_counts_outer_calls_once(one_rank_group, monkeypatch):
    for name in script.COLLECTIVES:  # the counter replaces these; put them back after the test
        for module in (dist, dist.distributed_c10d):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(module, name))
    counter = script.CollectiveCounter()
    t = torch.ones(10)
    dist.all_reduce(t)  # not counting yet
    with counter.count():
        dist.all_reduce(t)
        out = torch.empty(10)
        dist.all_gather_into_tensor(out, torch.ones(10))  # deprecated name calls all_gather_single
        dist.reduce_scatter_tensor(torch.empty(10), torch.ones(10))  # the full input is the payload
    assert dict(counter.calls) == {"all_reduce": 1, "all_gather": 1, "reduce_scatter": 1}
    assert dict(counter.payload) == {"all_reduce": 40, "all_gather": 40, "reduce_scatter": 40}


def test_stage_spans_follow_the_device_map():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    device_map = {"0": 0, "1": 0, "2": 1}

    spans = devicemap.stage_spans(model, device_map, {"input": torch.ones(2, 4)}, batches=2)
    assert len(spans) == 6
    assert {s["lane"] for s in spans} == {"device 0", "device 1"}
    assert devicemap.overlapping(spans) == 0
    shares = devicemap.busy_fractions(spans)
    assert 0 < sum(shares.values()) <= 1 + 1e-9


def test_overlapping_counts_only_other_lanes():
    spans = [
        {"lane": "a", "start": 0, "end": 2},
        {"lane": "a", "start": 1, "end": 3},
        {"lane": "b", "start": 2.5, "end": 4},
    ]
    assert devicemap.overlapping(spans) == 1


def test_planner_on_a_meta_model():
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    total = devicemap.module_bytes(model)[""]
    caps = {0: total * 8 // 10, 1: total * 8 // 10}  # accelerate keeps room for the largest layer
    plan = devicemap.plan_device_map(model, caps)
    assert devicemap.plan_fits(model, plan, caps)
    assert set(plan.values()) == {0, 1}
    layers = [d for n, d in plan.items() if ".layers." in n]
    assert layers == sorted(layers) and len(layers) == 6
    rows = devicemap.placement_rows(model, plan, caps)
    assert sum(r["count"] for r in rows) == len(plan)
    assert not devicemap.plan_fits(model, plan, {0: caps[0]})  # a device without a cap is not allowed


def test_swift_grouping_uses_swift_rules():
    assert devicemap.swift_devices(1, 8, 2) == [1, 3, 5, 7]
    four_two = devicemap.swift_grouping(4, 2)
    assert four_two["GPUs per rank"] == [[0, 2], [1, 3]]
    assert four_two["DDP + device_map (is_mp_ddp)"] is True
    plain = devicemap.swift_grouping(2, 2)
    assert plain["device_map (is_mp)"] is False and plain["GPUs per rank"] == [[0], [1]]
    assert "refused" in devicemap.swift_grouping(6, 4)["GPUs per rank"][0]


def one_sentence(message: str) -> bool:
    return message.endswith(".") and "\n" not in message and message.count(". ") == 0


@pytest.mark.parametrize("nproc", range(1, 9))
@pytest.mark.parametrize("n_gpu", range(1, 9))
def test_swift_layout_rule_on_1_to_8_gpus(n_gpu, nproc):
    """The helpers refuse exactly what SWIFT's own is_mp() refuses, in one sentence naming the rule."""
    row = devicemap.swift_grouping(n_gpu, nproc)  # SWIFT's own functions decide here
    swift_refuses = isinstance(row["GPUs per rank"][0], str)
    assert swift_refuses == (n_gpu % nproc != 0)
    if swift_refuses:
        with pytest.raises(CourseError) as info:
            devicemap.swift_devices(0, n_gpu, nproc)
        message = str(info.value)
        assert one_sentence(message), message
        assert "multiple of NPROC_PER_NODE" in message and "swift/utils/env.py" in message, message
        assert message == devicemap.swift_layout_problem(n_gpu, nproc)
        fewer = max(n for n in range(1, nproc + 1) if n_gpu % n == 0)
        assert f"NPROC_PER_NODE = {fewer}" in message, message
        assert devicemap.swift_layout_problem(n_gpu, fewer) is None  # the layout it names is one SWIFT accepts
        return
    assert devicemap.swift_layout_problem(n_gpu, nproc) is None
    groups = [devicemap.swift_devices(r, n_gpu, nproc) for r in range(nproc)]
    assert groups == row["GPUs per rank"]
    assert sorted(g for group in groups for g in group) == list(range(n_gpu))  # every GPU once
    assert {len(group) for group in groups} == {n_gpu // nproc}  # the same share for every rank


@pytest.mark.parametrize("n_gpu", range(1, 9))
@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_mp_ddp_layout_picks_the_nearest_layout_swift_accepts(n_gpu, nproc, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # GPUs 0..n-1 (test_gpu_route: an inherited list)
    if nproc < 2 or n_gpu < 2 * nproc:
        with pytest.raises(CourseError) as info:
            devicemap.mp_ddp_layout(n_gpu, nproc)
        message = str(info.value)
        assert one_sentence(message) and "DDP + device_map" in message, message
        assert ("at least 2 processes" if nproc < 2 else f"at least {2 * nproc} GPUs") in message, message
        return
    layout = devicemap.mp_ddp_layout(n_gpu, nproc)
    used = n_gpu // nproc * nproc
    assert layout["GPUs"] == used and layout["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(used)))
    swift = devicemap.swift_grouping(used, nproc)  # SWIFT's own is_mp / is_mp_ddp on the chosen GPUs
    assert swift["DDP + device_map (is_mp_ddp)"] is True
    assert layout["GPUs per rank"] == swift["GPUs per rank"]
    if used == n_gpu:
        assert layout["note"] is None
    else:
        note = layout["note"]
        assert one_sentence(note) and f"first {used}" in note and "multiple of NPROC_PER_NODE" in note, note


def test_curves_agree():
    assert sharding.curves_agree({"a": [1.0, 0.5], "b": [1.0, 0.50001]}, 1e-4) == (True, pytest.approx(1e-5))
    assert not sharding.curves_agree({"a": [1.0], "b": [1.1]}, 1e-4)[0]


def test_saved_shards_without_checkpoint(tmp_path):
    assert sharding.saved_shards(tmp_path) == {"checkpoint": None}


def fake_zero_checkpoint(output_dir, prefix: str, ranks: int, partition_count):
    """A checkpoint folder laid out as DeepSpeed writes one: ``global_step*/{prefix}zero_pp_rank_R_mp_rank_00_*``."""
    step = output_dir / "checkpoint-2" / "global_step2"
    step.mkdir(parents=True)
    for rank in range(ranks):
        state = {"optimizer_state_dict": {"partition_count": partition_count}, "ds_version": "0.0"}
        torch.save(state, step / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
        (step / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_bytes(b"")  # ZeRO-3 names these so
    return step


@pytest.mark.parametrize("prefix", ["", "bf16_"])
@pytest.mark.parametrize("ranks, partition_count", [(2, [2]), (4, [4, 4]), (3, 3)])
def test_saved_shards_reads_plain_and_bf16_zero_shards(tmp_path, prefix, ranks, partition_count):
    """DeepSpeed in bf16 names its shards bf16_zero_pp_rank_*; both names are ZeRO shards."""
    fake_zero_checkpoint(tmp_path, prefix, ranks, partition_count)
    assert sharding.saved_shards(tmp_path) == {
        "checkpoint": "checkpoint-2",
        "kind": "DeepSpeed ZeRO",
        "ranks sharded over": ranks,
    }


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_fsdp2_padding_counts_what_torchs_own_chunking_gives_every_rank(world):
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    model = sharding.small_model(hidden=256)
    per_rank = sum(_chunk_with_empty(p.detach(), world, dim=0)[0].numel() for p in model.parameters())
    n_params = sum(p.numel() for p in model.parameters())
    assert sharding.fsdp2_padded_params(model, world) == world * per_rank
    assert (sharding.fsdp2_padded_params(model, world) == n_params) == (world in (1, 2))  # 8 rows: 3, 7 pad


def test_lora_on_qwen25_7b_and_swifts_published_memory_per_strategy():
    model = parallelism.qwen25_7b_on_meta()
    lora = parallelism.lora_parameters(model, 8)
    assert lora == 28 * 8 * (
        2 * (3584 + 3584) + 2 * (3584 + 512) + 3 * (3584 + 18944)
    )  # q o, k v, gate up down
    rows = {r["method"]: r for r in sharding.lora_7b_rows(parallelism.QWEN25_7B_PARAMETERS, lora)}
    assert list(rows) == ["DDP", "DDP + device_map", "ZeRO-2", "ZeRO-3", "FSDP2"]
    whole = (2 * parallelism.QWEN25_7B_PARAMETERS + 16 * lora) / 2**30
    assert rows["DDP"]["weights + LoRA state, GiB/GPU (formula)"] == round(whole, 1)
    half = rows["ZeRO-3"]["weights + LoRA state, GiB/GPU (formula)"]
    assert half == rows["FSDP2"]["weights + LoRA state, GiB/GPU (formula)"] and abs(half - whole / 2) < 0.1
    assert (
        rows["DDP"]["weights + LoRA state, GiB/GPU (formula)"]
        - rows["ZeRO-2"]["weights + LoRA state, GiB/GPU (formula)"]
        < 0.2
    )  # LoRA's state is small
    assert all(
        r["source"].startswith("SWIFT examples/train/multi-gpu/") and r["GiB/GPU (SWIFT's example)"] > 0
        for r in rows.values()
    )
