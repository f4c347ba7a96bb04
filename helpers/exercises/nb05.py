"""Notebook 05's exercise checker: TinyDDP's gradient path on three ranks, against torch's DDP."""

from __future__ import annotations

from helpers.bucketing import MiB, expected_buckets
from helpers.errors import CourseError
from helpers.exercises import (
    NotAnswered,
    Wrong,
    brief,
    checker,
    on_ranks,
    tensors_close,
)
from helpers.toys import mlp

TINY_WIDTHS = (32, 48, 40, 24, 6)  # eight parameters of distinct sizes: three to five buckets at TINY_CAP
TINY_CAP = 4000  # bytes


def _tiny_batch(rank: int, step: int):
    import torch

    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(4, TINY_WIDTHS[0], generator=g), torch.randn(4, TINY_WIDTHS[-1], generator=g)


@checker("05.1")
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
            want = (
                torch_numels
                if order == ready_order
                else [sum(sizes[j] // 4 for j in b) for b in expected_buckets(sizes, TINY_CAP)]
            )
            net = fn(module, list(order), TINY_CAP)
            if net is None:
                raise NotAnswered(f"on rank {rank}, tiny_ddp returned None (is a `return` missing?).")
            if not callable(net) or not callable(getattr(net, "no_sync", None)):
                raise Wrong(
                    f"tiny_ddp returned {brief(net)}; return the wrapped model: called like the module, "
                    "with a no_sync() method."
                )
            opt = torch.optim.SGD(params, lr=0.1)
            said = f"with {world} ranks, order={order} and cap={TINY_CAP} bytes"
            for step in range(steps + 1):
                x, y = _tiny_batch(rank, step)
                opt.zero_grad()
                calls.clear()
                F.mse_loss(net(x), y).backward()
                if not calls:
                    raise Wrong(
                        f"{said}, backward() sent nothing: launch dist.all_reduce(bucket, async_op=True) "
                        "from the hooks."
                    )
                if calls != want:
                    if sorted(calls) == sorted(want):
                        raise Wrong(
                            f"{said}, the all-reduces went out as buckets of {calls} numbers; the buckets, "
                            f"in bucket order, hold {want}: bucket i goes only once buckets 0 ... i-1 have "
                            "gone, so that every rank issues the same collectives in the same order."
                        )
                    raise Wrong(
                        f"{said}, your all-reduces carried {calls} numbers; torch's buckets, in order, hold "
                        f"{want}: walk `order` and close a bucket once it holds at least `cap` bytes (04.1)."
                    )
                _same_grads(params, reference[step], f"{said}, after step {step + 1}'s backward() returned")
                opt.step()
            opt.zero_grad()
            calls.clear()
            with net.no_sync():
                loss = F.mse_loss(net(_tiny_batch(rank, 7)[0]), _tiny_batch(rank, 7)[1])
            loss.backward()
            if calls:
                raise Wrong(
                    f"a forward under no_sync() and backward() after the block sent {len(calls)} all-reduce(s); "
                    "DDP decides at forward: read the flag in forward, not in the hook."
                )
            F.mse_loss(net(_tiny_batch(rank, 8)[0]), _tiny_batch(rank, 8)[1]).backward()
            if not calls:
                raise Wrong(
                    "after a no_sync() step, the next forward and backward outside the block sent nothing."
                )
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
            raise Wrong(
                f"{said}, the gradient of parameter {i} differs from torch's DDP by up to {gap:.3g} of its "
                "largest entry: when backward() returns, every .grad must hold the average over the ranks "
                "(scale by 1 / dist.get_world_size(); wait for every bucket in the callback and copy back)."
            )
