"""Notebook 01's exercise checkers: shard gradients, all-reduce traffic, state bytes, sum losses in Adam."""

from __future__ import annotations

from torch import nn

from helpers.exercises import Wrong, call, checker, close, items, number, tensor, tensors_close
from helpers.parallelism import (
    BF16_MIXED_ADAM,
    QWEN25_7B_PARAMETERS,
    flat_params,
    gradient,
    make_classification,
    mlp,
    parameter_server_all_reduce,
    ring_all_reduce,
    simulate,
    traffic,
    train,
)


@checker("01.1")
def _combine_shards(combine):
    """A function (shard_grads, shard_sizes) -> the full-batch gradient of a mean loss."""
    import random

    loss_fn = nn.CrossEntropyLoss()
    rng = random.Random(1)
    layouts = [[4, 4, 4], [5, 3, 8], [1, 9], [2, 7, 1, 6], [6]]
    layouts += [[rng.randint(1, 9) for _ in range(rng.randint(2, 5))] for _ in range(3)]
    for case, sizes in enumerate(layouts):
        x, y = make_classification(sum(sizes), seed=10 + case)
        model = mlp(seed=case)
        workers = simulate(model, loss_fn, x, y, len(sizes), sizes=sizes)
        full = gradient(model, loss_fn, x, y)
        said = f"combine(<{len(sizes)} shard gradients>, {sizes})"
        got, said = call(combine, [g.clone() for g in workers.grads], list(sizes), show=said)
        got = tensor(got, said, full)
        if tensors_close(got, full):
            continue
        if tensors_close(got, workers.mean()):
            raise Wrong(
                f"with shard sizes {sizes} the plain mean is off: weight each shard's gradient by n_k / B."
            )
        if tensors_close(got, sum(workers.grads)):
            raise Wrong(
                f"with shard sizes {sizes} the sum of the shards' mean gradients is too large: weight each by n_k / B."
            )
        if tensors_close(got, sum(n * g for n, g in zip(sizes, workers.grads, strict=True))):
            raise Wrong(
                f"with shard sizes {sizes} the shards are weighted by n_k but not divided by B = {sum(sizes)}."
            )
        raise Wrong(f"with shard sizes {sizes} the result differs from the full-batch gradient.")
    return (
        True,
        "each shard's mean-loss gradient counts n_k / B: the weighted mean is the full-batch gradient.",
    )


@checker("01.2")
def _traffic_at_eight(answer):
    """(GB each ring worker sends, GB GPU0 receives in the original tutorial's scheme) for N = 8 and 1 GB of gradients."""
    ring_gb, ps_gb = items(answer, "your answer is", 2, what="a tuple (ring_gb, gpu0_gb)")
    ring_gb, ps_gb = number(ring_gb, "ring_gb is", "GB"), number(ps_gb, "gpu0_gb is", "GB")
    numel = 250_000_000  # 1 GB of fp32 gradients, simulated on the meta device: only sizes matter
    ring = traffic(ring_all_reduce, 8, numel, device="meta")
    ps = traffic(parameter_server_all_reduce, 8, numel, device="meta")
    want_ring, want_ps = ring["busiest_link"] / 1e9, ps["busiest_link"] / 1e9
    if close(ring_gb, want_ps, rel=1e-3) and close(ps_gb, want_ring, rel=1e-3):
        return False, "the two numbers are swapped: the ring worker's comes first, GPU0's second."
    if close(ring_gb, want_ring * 1e9, rel=1e-3) or close(ps_gb, want_ps * 1e9, rel=1e-3):
        return False, "that is in bytes; answer in GB (10^9 bytes)."
    if close(ps_gb, 8.0, rel=1e-3):
        return False, f"gpu0_gb = {ps_gb!r} GB: GPU0 keeps its own gradient and receives only the other 7."
    if not close(ps_gb, want_ps, rel=1e-3):
        return (
            False,
            f"gpu0_gb = {ps_gb!r} GB: GPU0 receives one full gradient from each of the other workers.",
        )
    if close(ring_gb, 2.0, rel=1e-3):
        return (
            False,
            "close: but a worker never sends the chunk it ends up owning; count 2(N-1) chunks of 1/N GB.",
        )
    if close(ring_gb, want_ring / 2, rel=1e-3):
        return (
            False,
            f"ring_gb = {ring_gb!r} GB counts the reduce-scatter only; the all-gather sends as much again.",
        )
    if not close(ring_gb, want_ring, rel=1e-3):
        return (
            False,
            f"ring_gb = {ring_gb!r} GB: a ring worker sends one 1/N chunk per step, in N-1 reduce-scatter and "
            "N-1 all-gather steps.",
        )
    return (
        True,
        f"ring: {want_ring:g} GB per worker and link; GPU0 in the original tutorial's scheme: {want_ps:g} GB in and out.",
    )


@checker("01.3")
def _seven_b_memory(answer):
    """GB (10^9 bytes) of training state per GPU for Qwen2.5-7B, bf16 mixed-precision Adam, 8-way DDP."""
    want = QWEN25_7B_PARAMETERS * BF16_MIXED_ADAM.total / 1e9
    got = number(answer, "your answer is", "GB (10^9 bytes)")
    if close(got, want * 1e9, rel=0.01):
        return False, f"{got!r} is in bytes; the question asks for GB (10^9 bytes)."
    if close(got, want / 8, rel=0.01):  # also the bf16 weights alone: 16 / 8 = 2 bytes per parameter
        return False, (
            "that is 2 bytes per parameter: the bf16 weights alone, or the state divided over the 8 GPUs "
            "(ZeRO-3). Plain data parallelism holds weights, gradients and optimizer states whole on every GPU."
        )
    if close(got, want * 1e9 / 2**30, rel=0.01):
        return False, f"{got!r} is in GiB (2^30 bytes); the question asks for GB (10^9 bytes)."
    if close(got, QWEN25_7B_PARAMETERS * 12 / 1e9, rel=0.01):
        return (
            False,
            "that leaves out the fp32 master weights (4 bytes); count 2 + 2 + 4 + 8 bytes per parameter.",
        )
    if not close(got, want, rel=0.01):
        return False, f"{got!r} GB: count 16 bytes per parameter (2 + 2 + 4 + 8) times the 7.6 B parameters."
    return (
        True,
        f"{want:.1f} GB on every GPU, whatever N is: more than an 80 GB card, which is why ZeRO shards it.",
    )


def first_step_ratio(optimizer, workers: int = 4, lr: float = 1e-3) -> float:
    """The first update's size with a sum loss averaged over ``workers`` shards, over its size on one worker."""
    x, y = make_classification(64, seed=1)
    start, sizes = mlp(seed=1), []
    for n in (workers, 1):
        run = train(start, x, y, workers=n, steps=1, batch=64, lr=lr, optimizer=optimizer,
                    loss_fn=nn.CrossEntropyLoss(reduction="sum"))  # fmt: skip
        sizes.append((flat_params(run["replicas"][0]) - flat_params(start)).norm().item())
    return sizes[0] / sizes[1]


@checker("01.4")
def _sum_loss_under_adam_and_sgd(answer):
    """(Adam's ratio, SGD's ratio): first update with averaged sum-loss gradients over the right one, N = 4."""
    import torch

    pair = items(answer, "your answer is", 2, what="a tuple (adam_ratio, sgd_ratio)")
    adam, sgd = (number(v, "your answer holds", "(a ratio)") for v in pair)
    want_adam, want_sgd = first_step_ratio(torch.optim.Adam), first_step_ratio(torch.optim.SGD)
    if close(sgd, 1 / want_sgd, rel=1e-3):
        return False, "upside down: the averaged gradients are the smaller ones, so each ratio is at most 1."
    if close(adam, want_sgd, rel=1e-3) and close(sgd, want_adam, rel=1e-3):
        return False, "swapped: the first number is Adam's, the second SGD's."
    if not close(sgd, want_sgd, rel=1e-3):
        return False, f"SGD's step is lr × gradient: 4 times smaller gradients give {want_sgd:g}, not {sgd!r}."
    if not close(adam, want_adam, rel=1e-3):
        return False, (
            f"Adam's ratio is {want_adam:.6f}, not {adam!r}: its first step is lr · m / (√v + eps), and gradients "
            "4 times smaller make m and √v 4 times smaller alike."
        )
    return True, (
        "SGD: 1/N, as if the learning rate were divided by N. Adam: about 1, since it divides by the gradients' "
        "own size: the mistake hides under Adam and shows under SGD."
    )
