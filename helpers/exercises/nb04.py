"""Notebook 04's exercise checkers: bucket packing, link finish, an averaging comm hook."""

from __future__ import annotations

import math
import random

from helpers.bucketing import ANATOMY_WIDTHS, MiB, expected_buckets
from helpers.comm_hooks import link_finish_times
from helpers.errors import CourseError
from helpers.exercises import NotAnswered, Wrong, brief, call, checker, close, items, number, on_ranks
from helpers.toys import mlp


@checker("04.3")
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
            g = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch
            x, y = torch.randn(8, ANATOMY_WIDTHS[0], generator=g), torch.randn(8, ANATOMY_WIDTHS[-1], generator=g)
            F.mse_loss(net(x), y).backward()
            grads[name] = [p.grad.clone() for p in net.parameters()]
        if unanswered:
            raise NotAnswered("average_hook returned None (is a `return` missing?); DDP needs a Future.")
        theirs = torch.cat([g.flatten() for g in grads["theirs"]]).double()
        yours_ = torch.cat([g.flatten() for g in grads["yours"]]).double()
        gap = float((theirs - yours_).abs().max())
        return gap, float(yours_ @ theirs / (theirs @ theirs))  # the gap, and yours as a multiple of theirs

    for world in (2, 3):
        try:
            results = on_ranks(rank_part, world, timeout=30)
        except CourseError as error:
            return False, str(error)
        gaps = [gap for gap, _ in results]
        if all(gap <= 1e-6 for gap in gaps):  # a NaN gap fails
            continue
        largest = max(gaps, key=lambda g: g if g == g else math.inf)
        ratio = results[0][1]
        said = f"with {world} ranks the gradients differ from DDP's own by up to {largest!r}"
        if world > 2:  # right on 2 ranks
            return False, (
                f"{said}: your hook is right on 2 ranks but not on {world} ({ratio:.3g} times DDP's gradients). "
                "Divide by dist.get_world_size(), not by a fixed number of ranks."
            )
        if close(ratio, world, rel=1e-3):
            return False, (
                f"{said}, {world} times theirs: average, do not just add (divide by dist.get_world_size())."
            )
        if close(ratio, 1 / world, rel=1e-3):
            return False, (
                f"{said}, 1/{world} of theirs: the bucket was divided twice, before and after the all-reduce. "
                "Divide once by dist.get_world_size()."
            )
        return False, (
            f"{said}: average, do not just add (divide by dist.get_world_size()), and return the future of the "
            "all-reduce."
        )
    return True, (
        "A comm hook gets each bucket as one flat tensor and returns a future of the averaged bucket; "
        "compression hooks and PowerSGD are hooks of this shape."
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


@checker("04.1")
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


@checker("04.2")
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
