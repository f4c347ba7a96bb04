"""Notebook 03's exercise checkers: ring time, all-reduce in two, a ring all-reduce."""

from __future__ import annotations

import random

from helpers.bucketing import MiB
from helpers.errors import CourseError
from helpers.exercises import NotAnswered, Wrong, brief, call, checker, close, number, on_ranks


def _forbidden(name: str, instead: str):
    def refuse(*args, **kwargs):
        raise CourseError(f"this exercise is built from {instead}, without dist.{name}")

    return refuse


@checker("03.2")
def _all_reduce_in_two(fn):
    """A function (tensor) -> the sum of every rank's ``tensor``, made of a reduce-scatter and an all-gather."""
    import torch
    import torch.distributed as dist

    def rank_part(rank, world):
        dist.all_reduce = _forbidden("all_reduce", "a reduce-scatter and an all-gather")  # this child only
        got = {}
        for length in (world, 4 * world, 12 * world):
            mine = torch.arange(length, dtype=torch.float64) * (rank + 1) + 0.5 * rank
            before = mine.clone()
            out = fn(mine)
            if out is None:
                raise NotAnswered(
                    f"on rank {rank} of {world}, all_reduce_in_two returned None (is a `return` missing?)."
                )
            if not isinstance(out, torch.Tensor) or out.dtype == torch.bool:
                raise Wrong(
                    f"on rank {rank} of {world}, all_reduce_in_two returned {brief(out)}, not a tensor."
                )
            got[length] = (out.detach().double().tolist(), torch.equal(mine, before))
        return got

    for world in (2, 3):
        try:
            per_rank = on_ranks(rank_part, world, timeout=30)
        except CourseError as error:
            return False, str(error)
        for length in (world, 4 * world, 12 * world):
            want = sum(
                torch.arange(length, dtype=torch.float64) * (r + 1) + 0.5 * r for r in range(world)
            ).tolist()
            for rank, got in enumerate(per_rank):
                values, untouched = got[length]
                if not close(values, want, rel=1e-12):
                    return (
                        False,
                        f"with {world} ranks and {length} numbers each, rank {rank} got {values}, not {want}.",
                    )
                if not untouched:
                    return (
                        False,
                        "return a new tensor and leave the input as it was (the caller may still need it).",
                    )
    return True, (
        "Reduce-scatter leaves each rank with one summed piece; all-gather hands every piece to everyone. "
        "That is the ring all-reduce's two phases, and why ZeRO and FSDP can stop after the first one."
    )


def ring_seconds(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """A ring all-reduce under the alpha-beta model: 2(n - 1) steps, each one message of nbytes / n."""
    return 2 * (n - 1) * (alpha + nbytes / n * beta)


@checker("03.1")
def _ring_time(fn):
    """A function (nbytes, n, alpha, beta) -> seconds of a ring all-reduce under the alpha-beta model."""
    links = ((0.0, 1 / 12.5e9), (5e-6, 1 / 12.5e9), (1e-3, 8 / 1e9), (2e-4, 0.0))
    rng = random.Random(31)
    cases = [
        (nbytes, n, a, b)
        for n in (1, 2, 3, 4, 8, 64)
        for nbytes in (1024, 4 * MiB, 100 * MiB)
        for a, b in links
    ]
    cases += [
        (rng.randint(1, 10**9), rng.randint(1, 512), rng.uniform(0, 1e-3), rng.uniform(0, 1e-8))
        for _ in range(30)
    ]
    for nbytes, n, alpha, beta in cases:
        want = ring_seconds(nbytes, n, alpha, beta)
        got = number(*call(fn, nbytes, n, alpha, beta), "seconds")
        if close(got, want, rel=1e-9, abs_=1e-15):
            continue
        shown_ = f"n={n}, nbytes={nbytes}, alpha={alpha!r} s, beta={beta!r} s/byte"
        if alpha > 0 and close(got, ring_seconds(nbytes, n, 0.0, beta), rel=1e-9):
            raise Wrong(
                f"with {shown_}: {got!r} seconds leaves out the latency; each of the 2(n-1) messages pays alpha."
            )
        if close(got, ring_seconds(nbytes, n, alpha, beta) / 2, rel=1e-9):
            raise Wrong(
                f"with {shown_}: {got!r} seconds is half of it; the reduce-scatter's n-1 steps are followed by n-1 all-gather steps."
            )
        raise Wrong(f"with {shown_} a ring all-reduce takes {want!r} seconds, not {got!r}.")
    return True, (
        "2(n-1) steps, each paying alpha once and moving nbytes/n: the bandwidth term approaches "
        "2 x nbytes x beta whatever n (busbw's 2(n-1)/n), but the latency term grows with n. That is why "
        "NCCL switches to trees for small messages on many ranks, and why DDP packs gradients into buckets."
    )


RING_FORBIDDEN = ("all_reduce", "all_gather", "reduce_scatter", "all_gather_into_tensor", "reduce_scatter_tensor",
                  "reduce", "broadcast", "gather", "scatter", "all_to_all", "all_to_all_single")  # fmt: skip


def _counting_sends(log: list):
    """Replace dist.send and dist.isend (in this forked rank only) by versions that log (peer, elements)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in ("send", "isend"):
        real = getattr(c10d, name)

        def counted(tensor, dst=None, group=None, tag=0, group_dst=None, _real=real):
            log.append((dst if dst is not None else group_dst, tensor.numel()))
            return _real(tensor, dst, group, tag, group_dst=group_dst)

        setattr(c10d, name, counted)  # batch_isend_irecv and P2POp compare with c10d's own isend
        setattr(dist, name, counted)


@checker("03.3")
def _ring_all_reduce(fn):
    """A function (tensor) -> the sum of every rank's ``tensor``, as a ring of sends and receives."""
    import torch
    import torch.distributed as dist

    def rank_part(rank, world):
        for name in RING_FORBIDDEN:
            setattr(dist, name, _forbidden(name, "sends and receives between neighbours"))
        sent, got = [], {}
        _counting_sends(sent)
        for length in (world, 3 * world, 10 * world):
            mine = torch.arange(length, dtype=torch.float64) * (rank + 1) + 0.5 * rank
            before = mine.clone()
            sent.clear()
            out = fn(mine)
            if out is None:
                raise NotAnswered(
                    f"on rank {rank} of {world}, ring_all_reduce returned None (is a `return` missing?)."
                )
            if not isinstance(out, torch.Tensor) or out.dtype == torch.bool:
                raise Wrong(
                    f"on rank {rank} of {world}, ring_all_reduce returned {brief(out)}, not a tensor."
                )
            got[length] = (out.detach().double().tolist(), torch.equal(mine, before), list(sent))
        return got

    for world in (2, 3, 4):
        try:
            per_rank = on_ranks(rank_part, world, timeout=30)
        except CourseError as error:
            return False, str(error)
        for length in (world, 3 * world, 10 * world):
            want = sum(
                torch.arange(length, dtype=torch.float64) * (r + 1) + 0.5 * r for r in range(world)
            ).tolist()
            for rank, got in enumerate(per_rank):
                values, untouched, sent = got[length]
                if not close(values, want, rel=1e-12):
                    return (
                        False,
                        f"with {world} ranks and {length} numbers each, rank {rank} got {values}, not {want}.",
                    )
                if not untouched:
                    return (
                        False,
                        "return a new tensor and leave the input as it was (the caller may still need it).",
                    )
                peers = {peer for peer, _ in sent}
                if len(peers) != 1 or not peers <= {(rank + 1) % world, (rank - 1) % world}:
                    return False, (
                        f"with {world} ranks, rank {rank} sent to ranks {sorted(peers, key=str)}; in a ring "
                        "each rank sends to one neighbour only."
                    )
                chunk = length // world
                if len(sent) != 2 * (world - 1) or any(n != chunk for _, n in sent):
                    return False, (
                        f"with {world} ranks and {length} numbers, rank {rank} sent {len(sent)} message{'s' * (len(sent) != 1)} of "
                        f"{sorted({n for _, n in sent})} numbers; a ring sends 2(n - 1) = {2 * (world - 1)} "
                        f"chunks of {chunk} (reduce-scatter, then all-gather)."
                    )
    return True, (
        "Every rank sent 2(n - 1) chunks of 1/n of the tensor to one neighbour: 2(n - 1)/n of the data, whatever "
        "the number of ranks. That is why NCCL's ring keeps its bus bandwidth as the world grows."
    )
