"""Notebook 11's exercise checkers: ZeRO-3 bytes, SWIFT's GPU grouping, ZeRO-3's traffic ratio, ZeRO-1 by hand."""

from __future__ import annotations

from helpers.devicemap import swift_devices
from helpers.exercises import NotAnswered, Wrong, brief, call, checker, close, items, mistake_on_ranks, number
from helpers.parallelism import BF16_MIXED_ADAM, QWEN25_7B_PARAMETERS
from helpers.toys import mlp


@checker("11.1")
def _check_zero3_bytes(answer):
    """Bytes per rank under ZeRO-3 for 7.6 B parameters, bf16 mixed Adam, 8 ranks."""
    n, recipe = QWEN25_7B_PARAMETERS, BF16_MIXED_ADAM
    got = number(answer, "your answer is", "bytes")
    expected = n * recipe.total / 8
    if close(got, expected, rel=1e-3):
        return True, f"{expected / 1e9:.2f} GB: every part of the 16 bytes per parameter is divided by 8."
    if close(got, expected / 1e9, rel=1e-3) or close(got, expected / 2**30, rel=1e-3):
        return False, f"{got!r} is in GB or GiB; the question asks for bytes."
    if close(got, n * recipe.total, rel=1e-3):
        return False, "that is what DDP holds; ZeRO-3 divides every part by the number of ranks."
    zero2 = n * (recipe.weights + (recipe.total - recipe.weights) / 8)
    if close(got, zero2, rel=1e-3):
        return False, "that is ZeRO-2 (weights whole); ZeRO-3 also shards the weights."
    zero1 = n * (recipe.weights + recipe.gradients + recipe.optimizer_states / 8)
    if close(got, zero1, rel=1e-3):
        return (
            False,
            "that is ZeRO-1 (only the optimizer states sharded); ZeRO-3 also shards gradients and weights.",
        )
    return (
        False,
        f"{got!r} bytes: use parallelism.QWEN25_7B_PARAMETERS and parallelism.BF16_MIXED_ADAM.total.",
    )


def _gpu_lists(answer, said: str, ranks: int) -> list[list[int]]:
    """The GPU ids of every rank as lists of ints, or Wrong saying what shape they should have."""
    lists = items(answer, said, ranks, list, f"a list of {ranks} lists of GPU ids, rank 0 first")
    for ids in lists:
        items(ids, f"{said} a rank's GPUs as", None, list, "a list of GPU ids")
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int):
                raise Wrong(f"{said} a GPU id {brief(i)}; GPU ids are ints.")
    return lists


@checker("11.2")
def _check_grouping(fn):
    """A function (local_rank, n_gpu, nproc) -> the GPU ids SWIFT gives that rank under DDP + device_map,
    tried on layouts the notebook's table does not show."""
    layouts = [(2, 2), (4, 2), (8, 2), (8, 4), (6, 3), (12, 3), (16, 4), (4, 1), (6, 2), (12, 4)]
    for n_gpu, nproc in layouts:
        for rank in range(nproc):
            got, said = call(fn, rank, n_gpu, nproc)
            got = _gpu_lists([got], said, 1)[0]
            want = swift_devices(rank, n_gpu, nproc)
            if got == want:
                continue
            block = n_gpu // nproc
            if got == list(range(rank * block, (rank + 1) * block)):
                raise Wrong(f"{said} {got}, a block; SWIFT gives {want}: range(local_rank, n_gpu, nproc).")
            raise Wrong(
                f"{said} {got}; with {n_gpu} GPUs and NPROC_PER_NODE={nproc} SWIFT gives rank {rank} {want}."
            )
    return True, "SWIFT strides: rank r takes GPUs r, r + NPROC, r + 2·NPROC, ..."


@checker("11.3")
def _check_traffic_ratio(answer):
    """ZeRO-3 wire bytes per step divided by DDP's, for any N (ring algorithms)."""
    got = number(answer, "your answer is", "times DDP's bytes (a ratio)")
    if close(got, 1.5, rel=1e-6):
        return True, "3(N-1)/N·Φ against 2(N-1)/N·Φ: ZeRO-3 and FSDP2 send 1.5x DDP's bytes per step."
    if close(got, 1.0, rel=1e-6):
        return False, "that holds for ZeRO-2; ZeRO-3 gathers the weights a second time for backward."
    if close(got, 2 / 3, rel=1e-3):
        return False, f"{got!r} is DDP's bytes over ZeRO-3's; the question asks ZeRO-3's over DDP's."
    return (
        False,
        f"{got!r}: count the weight all-gathers (forward and backward) and the gradient reduce-scatter.",
    )


ZERO1_WIDTHS = (16,) * 7  # six 16x16 weights and six biases: no parameter is most of a rank's fair share
ZERO1_STEPS = 3
ZERO1_LR, ZERO1_EPS = 0.05, 1e-2  # an eps near the gradients' size makes Adam see a doubled gradient


def _zero1_batch(rank: int, step: int):
    import torch

    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, ZERO1_WIDTHS[0], generator=g), 0.1 * torch.randn(8, ZERO1_WIDTHS[-1], generator=g)


@checker("11.4")
def _check_zero1(fn):
    """A function (params, make_optimizer) -> step(): ZeRO-1 by hand, on 2 and on 3 ranks, against torch's
    ZeroRedundancyOptimizer (same parameters after every step) and against ZeRO-1's memory rule (each
    parameter's optimizer states on exactly one rank, no rank far above its fair share)."""
    import torch
    import torch._dynamo  # noqa: F401 - DDP imports it (seconds); once here, not in every forked rank
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def rank_part(rank, world):
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP

        made = []

        def make_optimizer(some_params):
            some_params = list(some_params)
            if not some_params:
                raise Wrong(
                    f"with {world} ranks, rank {rank} gave make_optimizer no parameters: every rank keeps a share "
                    "(is a world size written in, rather than dist.get_world_size()?)."
                )
            optimizer = torch.optim.Adam(some_params, lr=ZERO1_LR, eps=ZERO1_EPS)
            made.append(optimizer)
            return optimizer

        yours, ref, twice = (DDP(mlp(list(ZERO1_WIDTHS), seed=0)) for _ in range(3))
        params = list(yours.parameters())
        step = fn(params, make_optimizer)
        if step is None:
            raise NotAnswered("zero1 returned None: it should return step, the function that makes one step.")
        if not callable(step):
            raise Wrong(f"zero1 returned {brief(step)}; return step, a function taking no arguments.")
        built = len(made)
        reference = ZeroRedundancyOptimizer(
            ref.parameters(), optimizer_class=torch.optim.Adam, lr=ZERO1_LR, eps=ZERO1_EPS
        )
        doubled = torch.optim.Adam(twice.parameters(), lr=ZERO1_LR, eps=ZERO1_EPS)  # gradients summed again
        unchanged, gaps, gaps_twice = set(), [], []
        for k in range(ZERO1_STEPS):
            x, y = _zero1_batch(rank, k)
            for net in (yours, ref, twice):
                net.zero_grad(set_to_none=True)
                F.mse_loss(net(x), y).backward()
            before = [p.detach().clone() for p in params]
            step()
            reference.step()
            with torch.no_grad():
                for p in twice.parameters():
                    p.grad *= world
            doubled.step()
            unchanged |= {i for i, (p, b) in enumerate(zip(params, before, strict=True)) if torch.equal(p, b)}
            for other, into in ((ref, gaps), (twice, gaps_twice)):
                into.append(
                    max(
                        float((a - b).detach().abs().max())
                        for a, b in zip(params, other.parameters(), strict=True)
                    )
                )
        index = {id(p): i for i, p in enumerate(params)}
        owned = sorted({index.get(id(p), -1) for o in made for p, s in o.state.items() if s})
        state_bytes = sum(
            t.numel() * t.element_size()
            for o in made
            for s in o.state.values()
            for t in s.values()
            if torch.is_tensor(t) and t.dim() > 0
        )
        return {
            "built": built,
            "made": len(made),
            "unchanged": sorted(unchanged),
            "gap": max(gaps),
            "gap_twice": max(gaps_twice),
            "owned": owned,
            "state_bytes": state_bytes,
            "sizes": [p.numel() for p in params],
        }

    seen, wrong = mistake_on_ranks(rank_part, _zero1_mistake, timeout=60)
    if wrong:
        return False, wrong
    summaries = [
        f"{' + '.join(format(r['state_bytes'], ',') for r in results)} bytes on {world} ranks"
        for world, results in seen.items()
    ]
    return True, (
        "The same parameters as torch's ZeroRedundancyOptimizer after every step, each parameter's Adam states on "
        f"one rank only: {' and '.join(summaries)}, where plain DDP keeps all of them on every rank."
    )


def _zero1_mistake(results: list, world: int) -> str | None:
    """What is wrong with the learner's ZeRO-1 on ``world`` ranks; None when nothing is."""
    said = f"with {world} ranks"
    idle = [rank for rank, r in enumerate(results) if r["built"] == 0]
    if len(idle) == world:
        return (
            f"{said}, no rank built an optimizer with make_optimizer(...) inside zero1: give it this rank's share of "
            "the parameters (the checker counts the states of the optimizers it builds)."
        )
    if idle:
        return (
            f"{said}, rank(s) {idle} built no optimizer: every one of the {world} ranks keeps a share (is a world "
            "size written in, rather than dist.get_world_size()?)."
        )
    for rank, r in enumerate(results):
        if r["made"] > r["built"]:
            return (
                f"{said}, step() built {r['made'] - r['built']} new optimizer(s): a new Adam starts its moments from "
                "zero every step. Build this rank's optimizer once, in zero1, and keep it."
            )
        if -1 in r["owned"]:
            return f"{said}, rank {rank} stepped tensors that are not the parameters it was given: step params themselves."
    for rank, r in enumerate(results):
        if r["unchanged"]:
            return (
                f"{said}, on rank {rank} parameters {r['unchanged']} did not move in a step: a rank updates only its "
                "own share, so every parameter must come back from the rank that stepped it "
                "(dist.broadcast(p, src=owner)), for every parameter and from its own owner."
            )
    if all(r["gap"] > 1e-6 and r["gap_twice"] <= 1e-6 for r in results):
        return (
            f"{said}, the parameters are those of gradients {world} times too large: DDP's backward already "
            "averaged them over the ranks, so step() must not reduce them again."
        )
    for rank, r in enumerate(results):
        if r["gap"] > 1e-6:
            return (
                f"{said}, rank {rank}'s parameters differ from torch's ZeroRedundancyOptimizer by up to {r['gap']:.3g} "
                "after the same steps: does each parameter come from the rank whose optimizer stepped it?"
            )
    holders: dict[int, list[int]] = {}
    for rank, r in enumerate(results):
        for i in r["owned"]:
            holders.setdefault(i, []).append(rank)
    for i, ranks in sorted(holders.items()):
        if len(ranks) > 1:
            return (
                f"{said}, parameter {i} has Adam states on ranks {ranks}: under ZeRO-1 each parameter's states "
                "live on one rank only; the others get the updated parameter from it."
            )
    sizes = results[0]["sizes"]
    total, largest = sum(sizes), max(sizes)
    for rank, r in enumerate(results):
        held = sum(sizes[i] for i in r["owned"])
        if held > total / world + largest:
            return (
                f"{said}, rank {rank} keeps states for {held} of the {total} parameter entries, more than its "
                f"share ({total / world:.0f}) plus one parameter ({largest}): balance by size, e.g. largest first, "
                "each to the rank holding least so far."
            )
    return None
