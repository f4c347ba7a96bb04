"""Notebook 03's exercise checkers: ring time, all-reduce in two, a ring all-reduce."""

from __future__ import annotations

import random

from helpers.bucketing import MiB
from helpers.errors import CourseError
from helpers.exercises import NotAnswered, Wrong, brief, call, checker, close, number, on_ranks
from helpers.exercises.watch import forbid

REDUCE_SCATTERS = ("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")
ALL_GATHERS = ("all_gather", "all_gather_single", "all_gather_into_tensor", "_all_gather_base")
OTHER_ROUTES = ("all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "gather", "scatter", "all_to_all",
                "all_to_all_single", "all_gather_coalesced", "all_gather_object", "gather_object",
                "broadcast_object_list", "scatter_object_list", "send", "recv", "isend", "irecv",
                "batch_isend_irecv", "send_object_list", "recv_object_list")  # fmt: skip


def _piece(name: str, arguments: dict) -> int:
    """The numbers one rank contributes to an all-gather, or keeps from a reduce-scatter."""
    if name == "all_gather":
        return arguments["tensor"].numel()
    if name in ALL_GATHERS:
        return arguments["input_tensor"].numel()
    return arguments["output"].numel()


def _in_two_mistake(world: int, length: int, rank: int, calls: list) -> str | None:
    """What is wrong with the collectives one rank called for ``length`` numbers; None when they are one
    reduce-scatter to pieces of length / world and one all-gather of them."""
    said, piece = f"with {world} ranks and {length} numbers each, rank {rank}", length // world
    scattered = [n for name, n in calls if name in REDUCE_SCATTERS]
    gathered = [n for name, n in calls if name in ALL_GATHERS]
    if not calls:
        return (
            f"{said} called no collective: the other ranks' numbers reach it only through one (a reduce-scatter, "
            "then an all-gather)."
        )
    if not scattered and length in gathered:
        return (
            f"{said} all-gathered the whole tensor and summed the {world} copies itself: every rank receives n "
            "whole tensors, n times the data. Reduce-scatter first, so that each rank sums one piece of 1/n, then "
            "all-gather the summed pieces."
        )
    if len(scattered) != 1 or len(gathered) != 1:
        return (
            f"{said} called {len(scattered)} reduce-scatter(s) and {len(gathered)} all-gather(s); the sum is built from "
            "one of each: a reduce-scatter leaves each rank one summed piece, an all-gather hands every piece to everyone."
        )
    if scattered != [piece] or gathered != [piece]:
        return (
            f"{said} reduce-scattered to a piece of {scattered[0]} and all-gathered a piece of {gathered[0]} numbers; "
            f"each rank's piece is 1/n of the tensor, {piece} numbers."
        )
    return None


def _sum_on_rank(fn, name: str, rank: int, world: int, lengths, seen: list) -> dict:
    """On one rank, the learner's all-reduce ``fn`` (``name``) of this rank's input (``_ring_input``) for each of
    ``lengths``: what it returned, whether it left the input as it was, and what its watch put in ``seen``."""
    import torch

    got = {}
    for length in lengths:
        mine = torch.tensor(_ring_input(rank, length), dtype=torch.float64)
        before = mine.clone()
        seen.clear()
        out = fn(mine)
        if out is None:
            raise NotAnswered(f"on rank {rank} of {world}, {name} returned None (is a `return` missing?).")
        if not isinstance(out, torch.Tensor) or out.dtype == torch.bool:
            raise Wrong(f"on rank {rank} of {world}, {name} returned {brief(out)}, not a tensor.")
        got[length] = (out.detach().double().tolist(), torch.equal(mine, before), list(seen))
    return got


@checker("03.2")
def _all_reduce_in_two(fn):
    """A function (tensor) -> the sum of every rank's ``tensor``, made of a reduce-scatter and an all-gather."""

    from helpers.exercises.watch import watch

    def rank_part(rank, world):
        forbid(OTHER_ROUTES, lambda name: (
            f"rank {rank} called dist.{name}: build the sum from one dist.reduce_scatter and one dist.all_gather "
            "(section 2), and no other collective."
        ))  # fmt: skip
        calls = []
        watch(REDUCE_SCATTERS + ALL_GATHERS, lambda name, arguments: calls.append((name, _piece(name, arguments))))
        return _sum_on_rank(fn, "all_reduce_in_two", rank, world, (world, 4 * world, 12 * world), calls)

    for world in (2, 3):
        try:
            per_rank = on_ranks(rank_part, world, timeout=30)
        except CourseError as error:
            return False, str(error)
        for length in (world, 4 * world, 12 * world):
            want = _ring_input(0, length, range(world))
            for rank, got in enumerate(per_rank):
                values, untouched, calls = got[length]
                wrong = _in_two_mistake(world, length, rank, calls)
                if wrong:
                    return False, wrong
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
                  "all_gather_single", "reduce_scatter_single", "reduce", "broadcast", "gather", "scatter",
                  "all_to_all", "all_to_all_single")  # fmt: skip
P2P_WAIT_S = 5.0  # a ring's step waits milliseconds for its neighbour; this long means no neighbour is coming


class _WatchedWork:
    """A send's or a receive's work, whose ``wait()`` gives up after :data:`P2P_WAIT_S` naming what it waited for."""

    def __init__(self, work, said: str, why: str):
        self._work, self._said, self._why = work, said, why

    def wait(self, timeout=None):
        return _wait(self._work, self._said, self._why)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _wait(work, said: str, why: str):
    """``work.wait()``, or :class:`Wrong` (``said``, then ``why``) when nothing has matched it after P2P_WAIT_S."""
    from datetime import timedelta

    try:
        return work.wait(timedelta(seconds=P2P_WAIT_S))
    except RuntimeError as error:
        if "Timed out" not in str(error):
            raise  # e.g. the neighbour has gone: its own report says why
        raise Wrong(f"{said} waited {P2P_WAIT_S:g} s and nothing matched it: {why}") from None


def _watch_ring(sent: list, rank: int, world: int):
    """In this forked rank: note every send the learner makes, once (``dist.send`` posts an ``isend``), as
    (peer, numbers sent), and let no send or receive wait for a neighbour that never comes (a deadlock)."""
    import torch.distributed.distributed_c10d as c10d

    from helpers.exercises.watch import peer, watch

    post = {"send": c10d.isend, "recv": c10d.irecv, "isend": c10d.isend, "irecv": c10d.irecv}
    send_first = (
        "gloo's send returns only once the receiver has posted its recv, so when every rank sends first no rank "
        "ever reaches its recv. Post the send with dist.isend (or pair it with its receive in "
        "dist.batch_isend_irecv), then recv, then wait for the send."
    )
    receive_first = (
        "a rank that waits for its receive before posting its own send holds up its neighbour, and so on round "
        "the ring. Post the send with dist.isend first, and check that each rank receives from the neighbour "
        "that sends to it."
    )

    def note(name, arguments):
        if name in ("send", "isend"):
            sent.append((peer(arguments, "dst"), arguments["tensor"].numel()))

    def instead(real, name, arguments):
        sending = name in ("send", "isend")
        other = peer(arguments, "dst" if sending else "src")
        arguments = {k: v for k, v in arguments.items() if k in ("tensor", "group", "tag")} | {
            ("dst" if sending else "src"): other
        }
        work = post[name](**arguments)
        said = f"with {world} ranks, rank {rank}'s dist.{name} {'to' if sending else 'from'} rank {other}"
        why = send_first if sending else receive_first
        if name in ("send", "recv"):
            _wait(work, said, why)
            return None if sending else other
        return _WatchedWork(work, f"{said}, then .wait(),", why)

    watch(("send", "isend", "recv", "irecv"), note, instead)


@checker("03.3")
def _ring_all_reduce(fn):
    """A function (tensor) -> the sum of every rank's ``tensor``, as a ring of sends and receives."""

    def rank_part(rank, world):
        forbid(RING_FORBIDDEN, lambda name: (
            f"rank {rank} called dist.{name}: a ring is built from sends and receives between neighbours only "
            "(send, recv, isend, irecv, batch_isend_irecv)."
        ))  # fmt: skip
        sent = []
        _watch_ring(sent, rank, world)
        return _sum_on_rank(fn, "ring_all_reduce", rank, world, (world, 3 * world, 10 * world), sent)

    for world in (2, 3, 4):
        try:
            per_rank = on_ranks(rank_part, world, timeout=30)
        except CourseError as error:
            return False, str(error)
        for length in (world, 3 * world, 10 * world):
            for rank, got in enumerate(per_rank):
                wrong = _ring_mistake(world, length, rank, *got[length])
                if wrong:
                    return False, wrong
    return True, (
        "Every rank sent 2(n - 1) chunks of 1/n of the tensor to one neighbour: 2(n - 1)/n of the data, whatever "
        "the number of ranks. That is why NCCL's ring keeps its bus bandwidth as the world grows."
    )


def _ring_input(rank: int, length: int, ranks=None) -> list[float]:
    """What rank ``rank`` all-reduces in 03.3 (and 03.2); with ``ranks``, the sum of those ranks' inputs instead."""
    return [sum(i * (r + 1) + 0.5 * r for r in ([rank] if ranks is None else ranks)) for i in range(length)]


def _ring_mistake(world: int, length: int, rank: int, values, untouched: bool, sent: list) -> str | None:
    """What is wrong with one rank's ring all-reduce of ``length`` numbers, in a sentence; None when nothing is."""
    import itertools

    said = f"with {world} ranks and {length} numbers each, rank {rank}"
    if not untouched:
        return "return a new tensor and leave the input as it was (the caller may still need it)."
    peers, chunk = {peer for peer, _ in sent}, length // world
    if not sent:
        shape = f"{said} sent nothing; a ring sends 2(n - 1) = {2 * (world - 1)} chunks of {chunk} to a neighbour."
    elif len(peers) != 1 or not peers <= {(rank + 1) % world, (rank - 1) % world}:
        shape = f"with {world} ranks, rank {rank} sent to ranks {sorted(peers, key=str)}; in a ring each rank sends to one neighbour only."
    elif len(sent) != 2 * (world - 1) or any(n != chunk for _, n in sent):
        shape = (
            f"{said} sent {len(sent)} message{'s' * (len(sent) != 1)} of {sorted({n for _, n in sent})} numbers; "
            f"a ring sends 2(n - 1) = {2 * (world - 1)} chunks of {chunk} (reduce-scatter, then all-gather)."
        )
    else:
        shape = None
    want = _ring_input(0, length, range(world))
    if close(values, want, rel=1e-12):
        return shape
    if shape:  # the wrong sum comes from the wrong messages: say which
        return shape
    pieces = range(world) if len(values) == length else ()
    for c in pieces:  # the right messages, a wrong sum: which chunk holds which ranks' numbers
        part = slice(c * chunk, (c + 1) * chunk)
        for size in range(1, world):
            for ranks in itertools.combinations(range(world), size):
                if close(values[part], _ring_input(0, length, ranks)[part], rel=1e-12):
                    return (
                        f"{said} ends with chunk {c} summed over {size} of the {world} ranks: a chunk index is off by one. "
                        "After the n - 1 reduce-scatter steps each rank holds one chunk summed over every rank, and "
                        "the all-gather starts by passing that chunk on."
                    )
    return f"{said} got {values}, not {want}."
