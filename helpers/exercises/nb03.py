"""Notebook 03's exercise checkers: ring time, bucket packing, link finish, all-reduce in two, a comm hook."""

from __future__ import annotations

import math
import random

from helpers.bucketing import ANATOMY_WIDTHS, MiB, expected_buckets
from helpers.comm_hooks import link_finish_times, make_batch
from helpers.errors import CourseError
from helpers.exercises import (
    NotAnswered,
    Wrong,
    brief,
    call,
    checker,
    close,
    items,
    number,
    on_ranks,
    tensors_close,
)
from helpers.toys import mlp


def _forbidden(name: str, instead: str):
    def refuse(*args, **kwargs):
        raise CourseError(f"this exercise is built from {instead}, without dist.{name}")

    return refuse


@checker("03.4")
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


@checker("03.5")
def _averaging_hook(fn):
    """A DDP comm hook (state, bucket) -> Future that averages the bucket over the ranks."""
    import torch
    import torch._dynamo  # noqa: F401 - DDP imports it (seconds); once here, not in every forked rank
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    unanswered = []

    def yours(state, bucket):
        """The learner's hook; one whose body is still `...` returns None: pass the bucket on unchanged."""
        future = fn(state, bucket)
        if future is None:
            unanswered.append(True)
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
        elif not isinstance(future, (torch.futures.Future, torch._C.Future)):
            raise Wrong(
                f"average_hook returned {brief(future)}; DDP needs a torch.futures.Future of the bucket."
            )
        return future

    def rank_part(rank, world):
        grads = {}
        for name, hook in (("theirs", None), ("yours", yours)):
            net = DDP(mlp(ANATOMY_WIDTHS, seed=0), bucket_cap_mb=1)
            if hook is not None:
                net.register_comm_hook(None, hook)
            x, y = make_batch(ANATOMY_WIDTHS, 8, rank, "cpu")
            F.mse_loss(net(x), y).backward()
            grads[name] = [p.grad.clone() for p in net.parameters()]
        if unanswered:
            raise NotAnswered("average_hook returned None (is a `return` missing?); DDP needs a Future.")
        return max(float((a - b).abs().max()) for a, b in zip(grads["theirs"], grads["yours"], strict=True))

    try:
        gaps = on_ranks(rank_part, 2, timeout=30)
    except CourseError as error:
        return False, str(error)
    if not all(gap <= 1e-6 for gap in gaps):  # a NaN gap fails too
        return False, (
            f"the gradients differ from DDP's own by up to {max(gaps, key=lambda g: g if g == g else math.inf)!r}: average, do not just add "
            "(divide by dist.get_world_size()), and return the future of the all-reduce."
        )
    return True, (
        "A comm hook gets each bucket as one flat tensor and returns a future of the averaged bucket; "
        "compression hooks and PowerSGD are hooks of this shape."
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


def _buckets_answer(got, said: str) -> list[list[int]]:
    """The learner's buckets as lists of ints, or Wrong saying what shape they should have."""
    buckets = items(got, said, None, (list, tuple), "a list of buckets, each a list of indices")
    out = []
    for bucket in buckets:
        bucket = items(bucket, f"{said} a bucket", None, (list, tuple), "a list of indices")
        for i in bucket:
            if isinstance(i, bool) or not isinstance(i, int):
                raise Wrong(f"{said} a bucket holding {brief(i)}; a bucket holds indices (ints) into sizes.")
        out.append(list(bucket))
    return out


@checker("03.2")
def _bucket_packing(fn):
    """A function (sizes in gradient-ready order, cap_bytes) -> lists of indices, one list per bucket."""
    rng = random.Random(3)
    cases = [([40, 10240, 1024, 1048576, 4096, 2097152, 512, 131072], MiB), ([40, 120, 20, 200, 4, 400], 100)]
    cases += [
        ([500, 500, 1000, 1, 999, 300], 1000),
        ([MiB, MiB], MiB),
        ([1], 1),
        ([2, 2, 2, 2], 4),
    ]  # exact caps
    cases += [([7], 1000), ([10, 20, 30], 10**9)]  # one bucket that never fills
    cases += [
        (
            [rng.choice([4, 400, 40_000, 4_000_000]) for _ in range(rng.randint(1, 12))],
            rng.choice([1, 800, 1000, MiB, 25 * MiB]),
        )
        for _ in range(40)
    ]
    for sizes, cap in cases:
        want = expected_buckets(sizes, cap)
        got = _buckets_answer(*call(fn, list(sizes), cap))
        if got == want:
            continue
        strict = [b for b in _pack_strictly(sizes, cap)]
        if got == strict:
            raise Wrong(
                f"sizes {sizes} with a cap of {cap} bytes pack into {want}, not {got}: a bucket that reaches its "
                "cap exactly is full (close it when filled >= cap)."
            )
        if got == _pack_before_overflow(sizes, cap):
            raise Wrong(
                f"sizes {sizes} with a cap of {cap} bytes pack into {want}, not {got}: torch does not keep a bucket "
                "under its cap; it adds the tensor first and closes the bucket once it holds at least the cap."
            )
        if got == want[:-1]:
            raise Wrong(
                f"sizes {sizes} with a cap of {cap} bytes pack into {want}: the last, partly filled bucket goes out too."
            )
        raise Wrong(f"sizes {sizes} with a cap of {cap} bytes pack into {want}, not {got}.")
    return True, (
        "A bucket takes parameters in gradient-ready order and closes once it holds at least its cap, so a "
        "bucket is usually a little over bucket_cap_mb (torch: dist._compute_bucket_assignment_by_size)."
    )


def _pack_strictly(sizes, cap):
    """The packing with a bucket closing only once it holds *more* than its cap: a common slip."""
    buckets, current, filled = [], [], 0
    for i, size in enumerate(sizes):
        current.append(i)
        filled += size
        if filled > cap:
            buckets.append(current)
            current, filled = [], 0
    return buckets + ([current] if current else [])


def _pack_before_overflow(sizes, cap):
    """The packing that closes a bucket before the next tensor would overflow it: at most the cap, not torch's rule."""
    buckets, current, filled = [], [], 0
    for i, size in enumerate(sizes):
        if current and filled + size > cap:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += size
    return buckets + ([current] if current else [])


@checker("03.3")
def _link_finish(fn):
    """A function (ready times, wire seconds) -> the time the last message is delivered on a serial link."""
    rng = random.Random(7)
    cases = [([0.0, 1.0, 2.0], [0.5, 0.5, 0.5]), ([0.0, 0.1, 0.2], [1.0, 1.0, 1.0]), ([5.0], [2.0])]
    cases += [
        ([3.0, 3.0, 3.0], [0.5, 1.0, 0.25]),
        ([0.0, 4.0, 4.5], [3.0, 0.0, 0.1]),
        ([1.0, 2.0], [0.0, 0.0]),
    ]
    for _ in range(40):
        k = rng.randint(1, 8)
        ready = sorted(rng.uniform(0, 10) for _ in range(k))
        cases.append((ready, [rng.uniform(0, 3) for _ in range(k)]))
    for ready, wire in cases:
        want = link_finish_times(ready, wire)[-1]
        got = number(*call(fn, list(ready), list(wire), show=f"last_delivery({ready}, {wire})"), "seconds")
        if close(got, want, rel=1e-9):
            continue
        if close(got, ready[-1] + wire[-1], rel=1e-9):
            raise Wrong(
                f"ready at {ready} with wire times {wire}: the last one arrives at {want!r} s, not {got!r} s; "
                "the link may still be busy with earlier buckets when the last one is ready."
            )
        raise Wrong(
            f"ready at {ready} with wire times {wire}: the last one arrives at {want!r} s, not {got!r} s."
        )
    return True, (
        "Each all-reduce starts when its bucket is ready AND the link is free. With overlap, only the "
        "buckets still queued when backward ends add to the step time."
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


@checker("03.6")
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
                raise NotAnswered(f"on rank {rank} of {world}, ring_all_reduce returned None (is a `return` missing?).")
            if not isinstance(out, torch.Tensor) or out.dtype == torch.bool:
                raise Wrong(f"on rank {rank} of {world}, ring_all_reduce returned {brief(out)}, not a tensor.")
            got[length] = (out.detach().double().tolist(), torch.equal(mine, before), list(sent))
        return got

    for world in (2, 3, 4):
        try:
            per_rank = on_ranks(rank_part, world, timeout=30)
        except CourseError as error:
            return False, str(error)
        for length in (world, 3 * world, 10 * world):
            want = sum(torch.arange(length, dtype=torch.float64) * (r + 1) + 0.5 * r for r in range(world)).tolist()
            for rank, got in enumerate(per_rank):
                values, untouched, sent = got[length]
                if not close(values, want, rel=1e-12):
                    return False, f"with {world} ranks and {length} numbers each, rank {rank} got {values}, not {want}."
                if not untouched:
                    return False, "return a new tensor and leave the input as it was (the caller may still need it)."
                peers = {peer for peer, _ in sent}
                if len(peers) != 1 or not peers <= {(rank + 1) % world, (rank - 1) % world}:
                    return False, (f"with {world} ranks, rank {rank} sent to ranks {sorted(peers, key=str)}; in a ring "
                                   "each rank sends to one neighbour only.")
                chunk = length // world
                if len(sent) != 2 * (world - 1) or any(n != chunk for _, n in sent):
                    return False, (f"with {world} ranks and {length} numbers, rank {rank} sent {len(sent)} message{'s' * (len(sent) != 1)} of "
                                   f"{sorted({n for _, n in sent})} numbers; a ring sends 2(n - 1) = {2 * (world - 1)} "
                                   f"chunks of {chunk} (reduce-scatter, then all-gather).")
    return True, (
        "Every rank sent 2(n - 1) chunks of 1/n of the tensor to one neighbour: 2(n - 1)/n of the data, whatever "
        "the number of ranks. That is why NCCL's ring keeps its bus bandwidth as the world grows."
    )


TINY_WIDTHS = (32, 48, 40, 24, 6)  # eight parameters of distinct sizes: three to five buckets at TINY_CAP
TINY_CAP = 4000  # bytes


def _tiny_batch(rank: int, step: int):
    import torch

    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(4, TINY_WIDTHS[0], generator=g), torch.randn(4, TINY_WIDTHS[-1], generator=g)


@checker("03.7")
def _tiny_ddp(fn):
    """A function (module, order, cap) -> a DDP-like wrapper: hooks fill buckets, in-order async all-reduces,
    no_sync read at forward, and an autograd callback that leaves averaged gradients when backward returns."""
    import torch
    import torch._dynamo  # noqa: F401 - DDP imports it (seconds); once here, not in every forked rank
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps = 2

    def torch_reference(rank):
        net = DDP(mlp(TINY_WIDTHS, seed=0), bucket_cap_mb=TINY_CAP / MiB)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        grads = []
        for step in range(steps + 1):  # one more: torch reports its rebuilt buckets after the third forward
            x, y = _tiny_batch(rank, step)
            opt.zero_grad()
            F.mse_loss(net(x), y).backward()
            grads.append([p.grad.clone() for p in net.parameters()])
            opt.step()
        logged = net._get_ddp_logging_data()
        opt.zero_grad()
        with net.no_sync():
            loss = F.mse_loss(net(_tiny_batch(rank, 7)[0]), _tiny_batch(rank, 7)[1])
        loss.backward()  # outside the block: the forward decided, nothing is sent
        F.mse_loss(net(_tiny_batch(rank, 8)[0]), _tiny_batch(rank, 8)[1]).backward()
        grads.append([p.grad.clone() for p in net.parameters()])
        order = [int(i) for i in logged["prev_iteration_grad_ready_order_indices"].split(",")]
        numels = [int(s) // 4 for s in logged["rebuilt_bucket_sizes"].split(",")]
        return grads, order, numels

    def rank_part(rank, world):
        reference, ready_order, torch_numels = torch_reference(rank)
        calls = []
        real = c10d.all_reduce

        def counted(tensor, *args, **kwargs):
            calls.append(tensor.numel())
            return real(tensor, *args, **kwargs)

        dist.all_reduce = c10d.all_reduce = counted  # this forked rank only
        n = len(reference[0])
        for order in (ready_order, list(range(n))):
            module = mlp(TINY_WIDTHS, seed=0)
            params = list(module.parameters())
            sizes = [params[i].numel() * 4 for i in order]
            want = torch_numels if order == ready_order else [
                sum(sizes[j] // 4 for j in b) for b in expected_buckets(sizes, TINY_CAP)]
            net = fn(module, list(order), TINY_CAP)
            if net is None:
                raise NotAnswered(f"on rank {rank}, tiny_ddp returned None (is a `return` missing?).")
            if not callable(net) or not callable(getattr(net, "no_sync", None)):
                raise Wrong(f"tiny_ddp returned {brief(net)}; return the wrapped model: called like the module, "
                            "with a no_sync() method.")
            opt = torch.optim.SGD(params, lr=0.1)
            said = f"with {world} ranks, order={order} and cap={TINY_CAP} bytes"
            for step in range(steps + 1):
                x, y = _tiny_batch(rank, step)
                opt.zero_grad()
                calls.clear()
                F.mse_loss(net(x), y).backward()
                if not calls:
                    raise Wrong(f"{said}, backward() sent nothing: launch dist.all_reduce(bucket, async_op=True) "
                                "from the hooks.")
                if calls != want:
                    if sorted(calls) == sorted(want):
                        raise Wrong(f"{said}, the all-reduces went out as buckets of {calls} numbers; the buckets, "
                                    f"in bucket order, hold {want}: bucket i goes only once buckets 0 ... i-1 have "
                                    "gone, so that every rank issues the same collectives in the same order.")
                    raise Wrong(f"{said}, your all-reduces carried {calls} numbers; torch's buckets, in order, hold "
                                f"{want}: walk `order` and close a bucket once it holds at least `cap` bytes (03.2).")
                _same_grads(params, reference[step], f"{said}, after step {step + 1}'s backward() returned")
                opt.step()
            opt.zero_grad()
            calls.clear()
            with net.no_sync():
                loss = F.mse_loss(net(_tiny_batch(rank, 7)[0]), _tiny_batch(rank, 7)[1])
            loss.backward()
            if calls:
                raise Wrong(f"a forward under no_sync() and backward() after the block sent {len(calls)} all-reduce(s); "
                            "DDP decides at forward: read the flag in forward, not in the hook.")
            F.mse_loss(net(_tiny_batch(rank, 8)[0]), _tiny_batch(rank, 8)[1]).backward()
            if not calls:
                raise Wrong("after a no_sync() step, the next forward and backward outside the block sent nothing.")
            _same_grads(params, reference[-1], "after one backward under no_sync() and one outside it")
        return True

    try:
        on_ranks(rank_part, 3, timeout=60)
    except CourseError as error:
        return False, str(error)
    return True, (
        "Hooks fill the buckets, bucket i is all-reduced once 0 ... i-1 have gone, and a callback queued with the "
        "autograd engine waits for them inside backward(): on 3 ranks your gradients match torch's DDP, and a "
        "forward under no_sync() sends nothing. That is DDP's Reducer, without the C++."
    )


def _same_grads(params, want, said):
    for i, (p, w) in enumerate(zip(params, want, strict=True)):
        if p.grad is None:
            raise Wrong(f"{said}, parameter {i} has no gradient.")
        if not tensors_close(p.grad, w, rel=1e-5):
            gap = float((p.grad - w).abs().max() / w.abs().max().clamp_min(1e-12))
            raise Wrong(f"{said}, the gradient of parameter {i} differs from torch's DDP by up to {gap:.3g} of its "
                        "largest entry: when backward() returns, every .grad must hold the average over the ranks "
                        "(scale by 1 / dist.get_world_size(); wait for every bucket in the callback and copy back).")
