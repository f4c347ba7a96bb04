"""Notebook 06's exercise checkers: a sampler fixed with set_epoch, a checkpoint saved and resumed on ranks, a training script from scratch, an evaluation under DDP."""

from __future__ import annotations

import functools
import pickle
import time

import torch.nn.functional as F

from helpers import exercises
from helpers.errors import CourseError
from helpers.exercises import NotAnswered, Wrong, brief, call, checker, integer, items, number
from helpers.training import CLASSES, FEATURES, toy_model

EPOCHS_TRIED = 64  # set_epoch values the checker recognises: epoch, epoch + 1, seed + epoch, ...


@checker("06.1")
def _epoch_orders(fn):
    """A function (n, rank, world, epochs, seed) -> the indices one rank trains on, epoch by epoch, from a
    DistributedSampler that is told the epoch: the same value on every rank, a new one each epoch (``epoch``
    itself, or ``epoch + 1`` told at the start or the end of an epoch, all meet that)."""
    from torch.utils.data import DistributedSampler

    for n, world, epochs, seed in ((20, 2, 3, 0), (17, 3, 4, 5), (8, 1, 3, 1), (30, 4, 2, 7), (3, 4, 2, 2)):
        shuffles = []  # shuffles[k][rank]: the order after set_epoch(k)
        for k in range(EPOCHS_TRIED):
            shuffles.append([])
            for rank in range(world):
                sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
                sampler.set_epoch(k)
                shuffles[-1].append(list(sampler))
        got = []
        for rank in range(world):
            orders, said = call(fn, n, rank, world, epochs, seed)
            orders = items(orders, said, epochs, list, f"a list with one list of indices per epoch ({epochs})")
            for order in orders:
                items(order, f"{said} an epoch's order", None, list, "a list of indices")
                if not all(isinstance(i, int) and not isinstance(i, bool) for i in order):
                    raise Wrong(f"{said} an epoch's order {brief(order)}; an order holds int indices.")
            got.append(orders)
        wrong = _epochs_told(got, shuffles, n, seed)
        for rank, orders in enumerate(got if wrong else ()):
            if len(orders) > 1 and all(order == orders[0] for order in orders):
                return False, (
                    f"n={n}, rank {rank} of {world}: every epoch repeats epoch 0's order {orders[0]!r}. The sampler "
                    "shuffles with seed + epoch, and only sampler.set_epoch(epoch) tells it the epoch."
                )
        if wrong:
            return False, wrong
    return True, (
        "One line: sampler.set_epoch(epoch) at the top of each epoch. Every rank calls it with the same "
        "epoch, so the shards stay disjoint while the order changes."
    )


def _epochs_told(got: list, shuffles: list, n: int, seed: int) -> str | None:
    """None when each epoch's orders (``got[rank][epoch]``) are the sampler's after one ``set_epoch(k)`` told to
    every rank, a different k each epoch; else what is wrong, in a sentence."""
    world, epochs = len(got), len(got[0])
    told = []  # for each epoch, the values k that explain every rank's order
    for epoch in range(epochs):
        each = [{k for k, orders in enumerate(shuffles) if orders[rank] == got[rank][epoch]} for rank in range(world)]
        for rank, ks in enumerate(each):
            if not ks:
                return (
                    f"n={n}, rank {rank} of {world}, seed {seed}: epoch {epoch}'s order {got[rank][epoch]!r} is "
                    f"none of this sampler's shuffles (after set_epoch({epoch}) it gives "
                    f"{shuffles[epoch][rank]!r}): keep the DistributedSampler and its seed, and tell it the epoch."
                )
        common = set.intersection(*each)
        if not common:
            return (
                f"n={n}, {world} ranks: in epoch {epoch} the ranks' samplers were told different epochs, so their "
                "shards overlap (and miss samples). Every rank calls set_epoch with the same epoch."
            )
        told.append(common)

    def distinct(epoch: int, used: set) -> bool:  # one k per epoch, never twice
        return epoch == epochs or any(distinct(epoch + 1, used | {k}) for k in told[epoch] - used)

    if not distinct(0, set()):
        return (
            f"n={n}, {world} ranks: some epochs were told the same epoch, so they repeat an order. Tell the "
            "sampler a new epoch each time: sampler.set_epoch(epoch)."
        )
    return None


@checker("06.2")
def _checkpoint(fn):
    """A function (path, model, optimizer, step=None): with a step, save (rank 0 writes, every rank returns once
    the file is complete); without, load into the bare model and optimizer and return the step saved.
    Resumed training must equal straight training bit for bit, on 2 ranks with DDP and Adam."""
    import shutil
    import tempfile
    from pathlib import Path

    import torch
    import torch._dynamo  # noqa: F401 - DDP imports it (seconds); once here, not in every forked rank
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps, saved_at = 4, 2
    folder = Path(tempfile.mkdtemp(prefix="course-04.7-"))
    path = folder / "latest.pt"

    def train(net, optimizer, batches):
        for x, y in batches:
            optimizer.zero_grad()
            F.cross_entropy(net(x), y).backward()
            optimizer.step()

    def rank_part(rank, world):
        g = torch.Generator().manual_seed(rank)
        batches = [
            (torch.randn(8, FEATURES, generator=g), torch.randint(0, CLASSES, (8,), generator=g))
            for _ in range(steps)
        ]
        straight = toy_model(hidden=32)  # the run that never stops; wrapped anew where the other resumes, for
        straight_optimizer = torch.optim.Adam(straight.parameters(), lr=0.01)  # a new DDP sums its first buckets
        train(DDP(straight), straight_optimizer, batches[:saved_at])  # in another order, which on 3 ranks
        train(DDP(straight), straight_optimizer, batches[saved_at:])  # rounds differently

        first = toy_model(hidden=32)
        net, optimizer = DDP(first), torch.optim.Adam(first.parameters(), lr=0.01)
        train(net, optimizer, batches[:saved_at])
        writers = []
        real_save = torch.save
        if rank != 0:  # this forked rank only: note a torch.save here, then do it

            def noted_save(*args, **kwargs):
                writers.append(rank)
                return real_save(*args, **kwargs)

            torch.save = noted_save
        else:
            time.sleep(0.5)  # rank 0 comes late: a rank that does not wait for it finds no file
            torch.save = functools.partial(_slow_save, real_save)  # and writes slowly: one that reads early tears it
        try:
            fn(path, net, optimizer, saved_at)
        finally:
            if writers:
                raise Wrong(
                    f"rank {rank} wrote the checkpoint too: every rank holds the same state, and ranks writing one "
                    "file at once can leave it torn. Write on rank 0 only (dist.get_rank() == 0)."
                ) from None
        torch.save = real_save

        fresh = toy_model(hidden=32, seed=1)  # other weights than the run's: resuming must load them
        fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.01)
        try:
            step = fn(path, fresh, fresh_optimizer)
        except Exception as exc:
            text = str(exc)
            if "module." in text:
                raise Wrong(
                    "the checkpoint's weights are named 'module.…' (the state_dict of the DDP wrapper) and do not "
                    "load into the bare model: save net.module.state_dict(), the model DDP wraps."
                ) from None
            if rank != 0 and (isinstance(exc, TORN) or any(mark in text for mark in TORN_MARKS)):
                raise Wrong(
                    f"rank {rank} read the checkpoint before rank 0 had finished writing it ({type(exc).__name__}): "
                    "after rank 0's write (not before it), every rank waits at dist.barrier()."
                ) from None
            raise
        if step is None:
            raise NotAnswered(
                "resuming returned None (is a `return` missing?); it returns the step the checkpoint was saved at."
            )
        return {
            "step": step.tolist()
            if isinstance(step, torch.Tensor)
            else step,  # a tensor would leave with this rank
            "optimizer_state": len(fresh_optimizer.state),
            "weights_loaded": all(
                torch.equal(a, b)
                for a, b in zip(fresh.state_dict().values(), first.state_dict().values(), strict=True)
            ),
            "gap": None
            if step != saved_at
            else _resumed_gap(fresh, fresh_optimizer, batches[saved_at:], straight, train),
        }

    try:
        for world in (2, 3):
            path.unlink(missing_ok=True)
            results = exercises.on_ranks(rank_part, world, timeout=40)
            wrong = _resumed_mistake(results, world, steps, saved_at)
            if wrong:
                return False, wrong
    except CourseError as error:
        return False, str(error)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return True, (
        f"{saved_at} steps, a checkpoint, a fresh model and optimizer, {steps - saved_at} more steps: the "
        f"weights of {steps} steps straight, bit for bit, on every rank, with 2 ranks and with 3."
    )


def _resumed_mistake(results: list, world: int, steps: int, saved_at: int) -> str | None:
    """What is wrong with the resumed run on ``world`` ranks, from every rank's report; None when nothing is."""
    first = results[0]
    step = integer(first["step"], "resuming returned", "optimizer steps")
    if step != saved_at:
        return (
            f"resuming returned step {step}, but the checkpoint was saved after {saved_at} steps: keep the step in "
            "the checkpoint and return it, or the run redoes (or skips) steps and their data."
        )
    if not all(r["weights_loaded"] for r in results):
        return "after resuming, the model does not hold the saved weights: load_state_dict into the model given."
    if not all(r["optimizer_state"] for r in results):
        return (
            "after resuming, the optimizer holds no state: Adam's moments (and its step count) decide the next "
            "updates, so save optimizer.state_dict() and load it with optimizer.load_state_dict()."
        )
    gaps = [r["gap"] for r in results]
    if not all(gap == 0 for gap in gaps):
        return (
            f"after resuming and training the remaining {steps - saved_at} steps, the weights differ from "
            f"{steps} steps straight by up to {max(gaps, key=lambda v: v if v == v else float('inf'))!r}: save and "
            "restore the weights, the optimizer's state and the step, all from one moment."
        )
    return None


TORN = (OSError, EOFError, pickle.UnpicklingError)  # what torch.load raises on a file not yet whole (or not there)
TORN_MARKS = ("zip archive", "Stream", "central directory")


def _slow_save(real_save, obj, f, *args, **kwargs):
    """``torch.save``, with the file left half written for half a second: a rank that reads it before the writer
    is done finds it torn (or missing), as it would with a large checkpoint; an atomic rename hides it."""
    import io
    import os

    buffer = io.BytesIO()
    real_save(obj, buffer, *args, **kwargs)
    data = buffer.getvalue()
    handle = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f  # noqa: SIM115 - closed below when ours
    try:
        handle.write(data[: len(data) // 2])
        handle.flush()
        time.sleep(0.5)
        handle.write(data[len(data) // 2 :])
        handle.flush()
    finally:
        if handle is not f:
            handle.close()


def _resumed_gap(model, optimizer, batches, straight, train) -> float:
    """Wrap the resumed model in DDP, train it on the batches after the checkpoint, and return the largest difference
    from the run that never stopped."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    train(DDP(model), optimizer, batches)
    return max(
        float((a - b).detach().abs().max())
        for a, b in zip(model.parameters(), straight.parameters(), strict=True)
    )


# 06.4: (samples, ranks) the evaluation is checked on: 10 on 3 ranks and 7 on 2 make DistributedSampler pad its
# last shard with the first indices again, 3 on 4 gives one rank nothing but padding, 12 on 3 pads nothing
EVAL_LAYOUTS = ((10, 3), (7, 2), (3, 4), (12, 3))
# the samples the model gets right: the first two among them, which the sampler repeats as padding, and chosen so
# that on each padded layout the right accuracy, each mistake's and each rank's own shard's are all different
EVAL_RIGHT = (0, 1, 4, 5, 8)
TOLERANCE = 1e-6  # float32 counts divided are within it; two accuracies over at most 12 samples are 1/144 apart


def _eval_data(n: int):
    """``n`` samples a fixed toy model classifies right at the indices of ``EVAL_RIGHT`` and wrong elsewhere: the
    dataset and those indices."""
    import torch
    from torch.utils.data import TensorDataset

    x = torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(n))
    with torch.no_grad():
        predicted = toy_model(hidden=16)(x).argmax(dim=1)
    right = {i for i in EVAL_RIGHT if i < n}
    y = torch.tensor([int(p) if i in right else (int(p) + 1) % CLASSES for i, p in enumerate(predicted)])
    return TensorDataset(x, y), right


def _eval_mistakes(n: int, world: int, right: set) -> dict:
    """What the usual mistakes return for ``n`` samples on ``world`` ranks, each with what to say."""
    from torch.utils.data import DistributedSampler

    shards = [list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False)) for r in range(world)]
    kept = [list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False, drop_last=True))
            for r in range(world)]  # fmt: skip
    hits = [sum(i in right for i in shard) for shard in shards]
    said = f"with {n} samples on {world} ranks"
    padding = (f"DistributedSampler pads: it repeats the first {-n % world} index(es) so that every rank gets "
               f"{len(shards[0])}, and those samples were counted twice (the mean of the ranks' accuracies over these equal "
               "shards is the same number). Count each sample once (a rank's k-th index "
               "is padding when rank + k * world >= len(dataset)), or split the indices yourself.")  # fmt: skip
    split = [range(r, n, world) for r in range(world)]  # each sample once, shards of unequal sizes
    found = {  # over padded shards of equal size, the mean of the ranks' accuracies is this same number
        sum(hits) / sum(map(len, shards)): f"{said}, the accuracy counts {sum(map(len, shards)) - n} sample(s) twice: {padding}",
    }
    if all(split):
        found.setdefault(sum(sum(i in right for i in s) / len(s) for s in split) / world, (
            f"{said}, the answer is the mean of the ranks' accuracies, and the shards differ in size, so a sample of a "
            "smaller shard weighs more. Sum the correct answers and the samples over the ranks (dist.all_reduce of "
            "both), then divide."
        ))  # fmt: skip
    if sum(map(len, kept)):
        found.setdefault(sum(sum(i in right for i in k) for k in kept) / sum(map(len, kept)), (
            f"{said}, drop_last=True left {n - sum(map(len, kept))} sample(s) out of the evaluation: keep every "
            "sample, and count each once."
        ))  # fmt: skip
    return found


@checker("06.4")
def _evaluate(fn):
    """A function (net, dataset) -> the accuracy over every sample of ``dataset``, the same on every rank, each
    rank running the model on its own share only (at most ceil(n / world) samples)."""
    import math

    from torch import nn

    class Counted(nn.Module):
        """The model, counting the samples it sees on this rank."""

        def __init__(self):
            super().__init__()
            self.model, self.seen = toy_model(hidden=16), 0

        def forward(self, x):
            self.seen += int(x.shape[0]) if x.dim() > 1 else 1
            return self.model(x)

    for n, world in EVAL_LAYOUTS:
        dataset, right = _eval_data(n)

        def rank_part(rank, world, dataset=dataset):
            model = Counted()
            answer, said = call(fn, model, dataset, show=f"on rank {rank}, evaluate(net, dataset)")
            return number(answer, said, "accuracy (between 0 and 1)"), model.seen

        try:
            per_rank = exercises.on_ranks(rank_part, world, timeout=40)
        except CourseError as error:
            return False, str(error)
        want, share = len(right) / n, math.ceil(n / world)
        for rank, (got, seen) in enumerate(per_rank):
            if seen > share:
                return False, (f"with {n} samples on {world} ranks, rank {rank} ran the model on {seen} samples; its "
                               f"share is at most {share}. Give each rank its own part (a DistributedSampler), then "
                               "combine the counts.")  # fmt: skip
            if abs(got - want) > TOLERANCE:
                mistakes = _eval_mistakes(n, world, right)
                for value, why in mistakes.items():
                    if abs(got - value) <= TOLERANCE:
                        return False, why
                if len({round(g, 9) for g, _ in per_rank}) > 1:
                    return False, (f"with {n} samples on {world} ranks, the ranks returned {[g for g, _ in per_rank]}: "
                                   "each its own shard's accuracy. All-reduce the correct answers and the samples "
                                   "counted, so that every rank returns the whole dataset's.")  # fmt: skip
                return False, f"with {n} samples on {world} ranks, rank {rank} returned {got:.6g}; the accuracy is {want:.6g}."
    return True, ("Every sample counted once: each rank evaluates its shard and leaves out the sampler's padding, "
                  "and one all-reduce of (correct, counted) gives every rank the whole dataset's accuracy.")


from helpers.exercises import nb06_script  # noqa: E402, F401 - registers 06.3, the script written from scratch
