"""Notebook 04's exercise checkers: padded shards, all-reduce volume, resuming, accumulation, epoch orders."""

from __future__ import annotations

import torch.nn.functional as F

from helpers import exercises
from helpers.checkpoints import resume_point
from helpers.errors import CourseError
from helpers.exercises import NotAnswered, Wrong, brief, call, checker, integer, items
from helpers.training import CLASSES, FEATURES, allreduce_bytes, toy_model


@checker("04.1")
def _padded_shards(answer):
    """1000 samples, 3 ranks, DistributedSampler defaults: (samples per rank, padded duplicates)."""
    per_rank, padded = items(answer, "your answer is", 2, what="a tuple (per_rank, padded)")
    per_rank = integer(per_rank, "per_rank is", "samples")
    padded = integer(padded, "padded is", "samples")
    if per_rank == 1002:
        return False, "1002 is the slots of all 3 ranks together; per_rank is what one rank gets."
    if per_rank != 334:
        return (
            False,
            f"per_rank = {per_rank!r}: DistributedSampler gives every rank ceil(1000 / 3) samples, so that ranks stay in step.",
        )
    if padded != 2:
        return (
            False,
            f"padded = {padded!r}: 3 x 334 = 1002 slots for 1000 samples, and the sampler repeats indices to fill them.",
        )
    return (
        True,
        "With drop_last=False the sampler pads by repeating indices; drop_last=True would give 333 each.",
    )


@checker("04.2")
def _allreduce_volume(fn):
    """A function (steps, accum, grad_bytes, no_sync) -> bytes all-reduced per rank."""
    import random

    rng = random.Random(4)
    cases = [
        (s, a, g, n) for s in (1, 3, 10) for a in (1, 2, 4, 8) for g in (4, 4_000_000) for n in (True, False)
    ]
    cases += [
        (rng.randint(1, 500), rng.randint(1, 64), rng.randint(1, 10**10), rng.random() < 0.5)
        for _ in range(20)
    ]
    for steps, accum, grad_bytes, no_sync in cases:
        want = allreduce_bytes(steps, accum, grad_bytes, no_sync)
        got = integer(*call(fn, steps, accum, grad_bytes, no_sync), "bytes")
        if got == want:
            continue
        shown_ = f"steps={steps}, accum={accum}, grad_bytes={grad_bytes}, no_sync={no_sync}"
        if no_sync and got == allreduce_bytes(steps, accum, grad_bytes, False):
            raise Wrong(
                f"{shown_}: DDP all-reduces {want!r} bytes, not {got!r}; under no_sync only the last micro-batch's backward syncs."
            )
        if not no_sync and got == allreduce_bytes(steps, accum, grad_bytes, True):
            raise Wrong(
                f"{shown_}: DDP all-reduces {want!r} bytes, not {got!r}; without no_sync every micro-batch's backward syncs."
            )
        raise Wrong(f"{shown_}: DDP all-reduces {want!r} bytes, your function says {got!r}.")
    return (
        True,
        "Every synchronised backward sends all gradients once; no_sync makes it once per optimizer step.",
    )


@checker("04.3")
def _resume(fn):
    """A function (step, steps_per_epoch, accum) -> (epoch, micro-batches to skip)."""
    cases = [
        (step, spe, accum) for spe in (1, 3, 4, 7) for accum in (1, 2, 4) for step in range(0, 3 * spe + 1)
    ]
    cases += [(1000, 7, 3), (999, 1000, 16)]
    for step, spe, accum in cases:
        want = resume_point(step, spe, accum)
        got, said = call(fn, step, spe, accum)
        epoch, skip = items(got, said, 2, what="a tuple (epoch, micro_batches_to_skip)")
        got = (integer(epoch, f"{said} an epoch", "epochs"), integer(skip, f"{said} a skip", "micro-batches"))
        if got == want:
            continue
        shown_ = f"after step {step} with {spe} steps/epoch and accum {accum}"
        if accum > 1 and got == (want[0], want[1] // accum):
            raise Wrong(
                f"{shown_}: {want}, not {got}; the skip counts micro-batches, and each step used {accum}."
            )
        if got[0] == want[0] + 1:
            raise Wrong(
                f"{shown_}: {want}, not {got}; epochs count from 0, and step // steps_per_epoch of them are done."
            )
        raise Wrong(f"{shown_}: {want}, not {got}.")
    return True, "divmod gives the epoch and the steps done in it; each step used `accum` micro-batches."


@checker("04.4")
def _accumulation_step(fn):
    """A function (net, optimizer, micro_batches) -> None: one optimizer step over the micro-batches, with
    DDP's all-reduce once, at the last one."""
    import torch._dynamo  # noqa: F401 - DDP imports it (seconds); once here, not in every forked rank

    def rank_part(rank, world):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        g = torch.Generator().manual_seed(rank)
        micro = [
            (torch.randn(8, FEATURES, generator=g), torch.randint(0, CLASSES, (8,), generator=g))
            for _ in range(4)
        ]
        reduced = []

        def counting(state, bucket):
            reduced.append(bucket.index())
            return default_hooks.allreduce_hook(state, bucket)

        yours, reference = DDP(toy_model(hidden=64)), DDP(toy_model(hidden=64))
        yours.register_comm_hook(None, counting)
        opt_yours = torch.optim.SGD(yours.parameters(), lr=0.1)
        opt_reference = torch.optim.SGD(reference.parameters(), lr=0.1)
        fn(yours, opt_yours, micro)  # it steps the model in place; whatever it returns is not used
        x, y = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])  # one batch of them all
        opt_reference.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        opt_reference.step()
        gap = max(
            float((a - b).detach().abs().max())
            for a, b in zip(yours.parameters(), reference.parameters(), strict=True)
        )
        moved = max(
            float((a - b).detach().abs().max())
            for a, b in zip(yours.parameters(), toy_model(hidden=64).parameters(), strict=True)
        )
        if moved == 0:
            raise NotAnswered("the weights did not change: accumulation_step must call optimizer.step().")
        return {
            "all_reduces": len(reduced),
            "buckets": len(set(reduced)),
            "gap": gap,
        }

    try:
        results = exercises.on_ranks(rank_part, 2, timeout=30)
    except CourseError as error:
        return False, str(error)
    first = results[0]
    if first["all_reduces"] > first["buckets"]:
        return False, (
            f"DDP all-reduced {first['all_reduces']} buckets for one optimizer step, not {first['buckets']}: the "
            "forward pass must be inside no_sync() as well, since DDP decides in forward whether backward syncs."
        )
    if not all(r["gap"] <= 1e-6 for r in results):  # NaN weights fail too
        return False, (
            f"the weights differ from one step on all the micro-batches at once by {max(r['gap'] for r in results):.3g}: "
            "divide each micro-batch's loss by their number, zero the gradients once, and step once at the end."
        )
    return True, "One all-reduce per optimizer step, and the same update as one large batch."


@checker("04.5")
def _epoch_orders(fn):
    """A function (n, rank, world, epochs, seed) -> the indices one rank trains on, epoch by epoch, from a
    DistributedSampler that is told the epoch."""
    from torch.utils.data import DistributedSampler

    for n, world, epochs, seed in ((20, 2, 3, 0), (17, 3, 4, 5), (8, 1, 3, 1), (30, 4, 2, 7), (3, 4, 2, 2)):
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
            want = []
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                want.append(list(sampler))
            got, said = call(fn, n, rank, world, epochs, seed)
            orders = items(got, said, None, list, "a list with one list of indices per epoch")
            for order in orders:
                items(order, f"{said} an epoch's order", None, list, "a list of indices")
                if not all(isinstance(i, int) and not isinstance(i, bool) for i in order):
                    raise Wrong(f"{said} an epoch's order {brief(order)}; an order holds int indices.")
            if got == want:
                continue
            if len(got) == epochs and len(got) > 1 and all(order == got[0] for order in got):
                return False, (
                    f"n={n}, rank {rank} of {world}: every epoch repeats epoch 0's order {got[0]!r}. The sampler "
                    "shuffles with seed + epoch, and only sampler.set_epoch(epoch) tells it the epoch."
                )
            return (
                False,
                f"n={n}, rank {rank} of {world}, seed {seed}: the sampler gives {want!r}, not {got!r}.",
            )
    return True, (
        "One line: sampler.set_epoch(epoch) at the top of each epoch. Every rank calls it with the same "
        "epoch, so the shards stay disjoint while the order changes."
    )
