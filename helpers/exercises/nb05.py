"""Notebook 05's exercise checkers: TinyDDP's gradient path on three ranks against torch's DDP, an fp16 compression hook, gradient accumulation with no_sync."""

from __future__ import annotations

import torch.nn.functional as F

from helpers.bucketing import MiB, expected_buckets
from helpers.errors import CourseError
from helpers.exercises import NotAnswered, Wrong, brief, checker, mistake_on_ranks, on_ranks, tensors_close
from helpers.exercises.watch import unwrap, watch_waits
from helpers.toys import mlp
from helpers.training import CLASSES, FEATURES, toy_model

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
        calls, ready, timing = [], [0], {"blocking": 0, "launched in backward": 0, "waited in backward": 0}
        n = len(reference[0])

        def note(name, arguments):  # the gradients computed so far tell whether backward is still running
            calls.append(arguments["tensor"].numel())
            timing["blocking"] += not arguments["async_op"]
            timing["launched in backward"] += ready[0] < n

        def waited():
            timing["waited in backward"] += ready[0] < n

        watch_waits(("all_reduce",), note, waited, lambda: True)  # this forked rank only
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
            for p in params:  # after the learner's hooks: counts the gradients that backward has finished
                p.register_post_accumulate_grad_hook(lambda p: ready.__setitem__(0, ready[0] + 1))
            opt = torch.optim.SGD(params, lr=0.1)
            said = f"with {world} ranks, order={order} and cap={TINY_CAP} bytes"
            for step in range(steps + 1):
                x, y = _tiny_batch(rank, step)
                opt.zero_grad()
                calls.clear()
                ready[0] = 0
                timing.update(dict.fromkeys(timing, 0))
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
                if timing["blocking"]:
                    raise Wrong(
                        f"{said}, {timing['blocking']} of the all-reduces were blocking (async_op=False): backward "
                        "stood still while each one ran. Launch with async_op=True and wait for the works in the "
                        "callback, once backward is done."
                    )
                if timing["waited in backward"]:
                    raise Wrong(
                        f"{said}, a bucket's all-reduce was waited for before backward had computed every "
                        "gradient: backward stood still while it ran. Wait for the works only in the callback."
                    )
                if not timing["launched in backward"]:
                    raise Wrong(
                        f"{said}, no all-reduce started until backward had computed every gradient: nothing "
                        "overlapped, which is the point of the Reducer. Launch each bucket from the hooks as soon "
                        "as it and the buckets before it are full; the callback only waits."
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

    for world in (2, 3):
        try:
            on_ranks(rank_part, world, timeout=60)
        except CourseError as error:
            return False, str(error)
        except Wrong as wrong:
            if world > 2 and "differs from torch's DDP" in str(wrong):
                raise Wrong(
                    f"{wrong} It was right on 2 ranks: is a number of ranks written into it where "
                    "dist.get_world_size() belongs?"
                ) from None
            raise
    return True, (
        "Hooks fill the buckets, bucket i is all-reduced once 0 ... i-1 have gone, while backward goes on, and a "
        "callback queued with the autograd engine waits for them inside backward(): on 2 and 3 ranks your "
        "gradients match torch's DDP, and a "
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


def _flat_grads(net):
    import torch

    return torch.cat([p.grad.detach().flatten() for p in net.parameters()])


@checker("05.2")
def _fp16_hook(fn):
    """A DDP comm hook (state, bucket) -> Future: float16 compression, bit for bit as torch's
    ``default_hooks.fp16_compress_hook``, on an ordinary step and on one whose gradients come near 65504, on 2
    and on 3 ranks; the all-reduce started and left running when the hook returns."""
    import torch
    import torch._dynamo  # noqa: F401 - DDP imports it (seconds); once here, not in every forked rank
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    returned = {"none": False, "dtypes": set(), "waited": 0}
    inside = [False]  # the learner's hook is running

    def yours(state, bucket):
        """The learner's hook, watched: a None is passed on unchanged, the Future's dtype is noted."""
        inside[0] = True
        try:
            future = unwrap(fn(state, bucket))
        finally:
            inside[0] = False
        if future is None:
            returned["none"] = True
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
            return future
        if not isinstance(future, (torch.futures.Future, torch._C.Future)):
            raise Wrong(
                f"fp16_hook returned {brief(future)}; DDP needs a torch.futures.Future of the bucket."
            )

        def note(done):
            value = done.value()
            returned["dtypes"].add((str(value.dtype), str(bucket.buffer().dtype)))
            return value

        return future.then(note)

    def bf16(state, bucket):
        """torch's bf16_compress_hook, under another name: DDP refuses that name without CUDA and NCCL."""
        return default_hooks.bf16_compress_hook(state, bucket)

    def float32_first(state, bucket):
        """Divides the float32 bucket, then casts: as accurate as torch's order, not bit for bit the same."""
        buffer = bucket.buffer()
        compressed = (buffer / dist.get_world_size()).to(torch.float16)
        return dist.all_reduce(compressed, async_op=True).get_future().then(lambda f: buffer.copy_(f.value()[0]))

    hooks = {
        "torch": default_hooks.fp16_compress_hook,
        "plain": default_hooks.allreduce_hook,
        "bf16": bf16,
        "float32 first": float32_first,
        "yours": yours,
    }

    def waited():
        returned["waited"] += inside[0]

    def rank_part(rank, world):
        watch_waits(("all_reduce",), lambda name, arguments: waited() if not arguments["async_op"] else None,
                    waited, lambda: inside[0])  # fmt: skip
        out = {}
        for case in ("ordinary", "scaled"):
            # ordinary: each rank its own batch; scaled: one batch on every rank, loss x (60000 / largest gradient)
            g = torch.Generator().manual_seed(rank if case == "ordinary" else 99)
            x, y = torch.randn(16, FEATURES, generator=g), torch.randint(0, CLASSES, (16,), generator=g)
            scale = 1.0
            if case == "scaled":
                probe = toy_model(hidden=32)
                F.cross_entropy(probe(x), y).backward()
                scale = 60_000 / max(float(p.grad.abs().max()) for p in probe.parameters())
            for name, hook in hooks.items():
                net = DDP(toy_model(hidden=32))
                net.register_comm_hook(None, hook)
                (F.cross_entropy(net(x), y) * scale).backward()
                out[case, name] = _flat_grads(net).tolist()  # numbers, not tensors: a tensor is passed
        if returned["none"]:  # through shared memory, which this rank takes with it when it exits
            raise NotAnswered("fp16_hook returned None (is a `return` missing?); DDP needs a Future.")
        return {"grads": out, "dtypes": sorted(returned["dtypes"]), "waited": returned["waited"]}

    for world in (2, 3):
        try:
            results = on_ranks(rank_part, world, timeout=30)
        except CourseError as error:
            return False, str(error)
        wrong = _fp16_mistake(results, world)
        if wrong and world > 2:  # bit for bit on 2 ranks
            wrong = (
                f"your hook gives torch's gradients bit for bit on 2 ranks but not on {world}: divide by "
                "dist.get_world_size(), not by a fixed number of ranks."
            )
        if wrong:
            return False, wrong
    return True, (
        "Bit for bit torch's fp16_compress_hook on 2 and 3 ranks, half the bytes on the wire (float16 keeps 11 "
        "significant bits, so most gradient entries differ from an uncompressed all-reduce's), and dividing "
        "first kept the sum of the ranks' ~60000 gradients below 65504."
    )


def _fp16_mistake(results: list, world: int) -> str | None:
    """What is wrong with the learner's hook on ``world`` ranks, from every rank's gradients; None when nothing is."""
    import torch

    for r in results:
        r["grads"] = {key: torch.tensor(values, dtype=torch.float32) for key, values in r["grads"].items()}
    grads = results[0]["grads"]
    torch_ = grads["ordinary", "torch"]
    differ_from_plain = int((torch_ != grads["ordinary", "plain"]).sum())
    if differ_from_plain == 0 or not all(
        bool(torch.isfinite(grads["scaled", k]).all()) for k in ("torch", "plain")
    ):
        raise CourseError("the check's own step does not show float16 rounding, or overflows in torch's hook")
    if any(r["waited"] for r in results):
        return (
            "your hook waited for its all-reduce before returning (a blocking dist.all_reduce, or .wait() on its "
            "work or future): DDP calls the hook during backward, which then stands still for every bucket's "
            "communication. Start it with async_op=True and return its future's .then(...): DDP waits for it only "
            "when backward is done."
        )
    dtypes = {d for r in results for d in r["dtypes"]}
    wrong_dtype = sorted(value for value, bucket in dtypes if value != bucket)
    if wrong_dtype:
        return (
            f"your Future holds a {wrong_dtype[0]} tensor, not one in the bucket's dtype (torch.float32). DDP "
            "happens to cast it while copying into .grad, but a hook's result is the bucket's new value: copy it "
            "back, as torch's decompress does with bucket.buffer().copy_(...)."
        )

    def yours_equal(other: str) -> bool:  # on both steps, every rank
        return all(
            torch.equal(r["grads"][c, "yours"], r["grads"][c, other])
            for r in results
            for c in ("ordinary", "scaled")
        )

    if yours_equal("torch"):
        return None
    mine = grads["ordinary", "yours"]
    if yours_equal("plain"):
        return (
            "these are the gradients of the plain float32 all-reduce: nothing was compressed. Cast the bucket to "
            "torch.float16 and all-reduce that copy, so that half the bytes travel."
        )
    if bool(torch.isfinite(mine).all()) and torch.allclose(mine, world * torch_, rtol=1e-2, atol=1e-6):
        return (
            f"your gradients are {'twice' if world == 2 else f'{world} times'} torch's: the all-reduce sums, so the "
            "hook must divide by dist.get_world_size() to average (DDP does not divide when a hook is registered)."
        )
    if yours_equal("bf16"):
        return (
            "these are bf16_compress_hook's gradients: torch.bfloat16 keeps 8 significant bits, torch.float16 "
            "11 (and a smaller range). Cast to torch.float16."
        )
    if yours_equal("float32 first"):
        return (
            "your hook divides the float32 bucket and then casts it to float16: as accurate, but not torch's order, "
            "which the exercise asks for bit for bit (the last bit of the smallest entries differs). Cast the "
            "bucket to float16 first, then divide that float16 copy by the world size."
        )
    scaled = grads["scaled", "yours"]
    if not bool(torch.isfinite(scaled).all()):
        return (
            f"with the loss scaled so that each rank's largest gradient is about 60000, {int((~torch.isfinite(scaled)).sum())} "
            f"gradient entries came back as inf or NaN: the float16 sum of {world} ranks passes 65504, float16's "
            "largest number. Divide by the world size before the all-reduce, as torch's hook does."
        )
    gap = max(
        float((r["grads"][c, "yours"] - r["grads"][c, "torch"]).abs().max())
        for r in results
        for c in ("ordinary", "scaled")
    )
    count = max(
        int((r["grads"][c, "yours"] != r["grads"][c, "torch"]).sum())
        for r in results
        for c in ("ordinary", "scaled")
    )
    return (
        f"{count} gradient entries differ from fp16_compress_hook's, by up to {gap:.3g}. Do it in torch's order: "
        "cast the bucket to float16, divide that copy by the world size, all-reduce it asynchronously, and "
        "copy the result back into bucket.buffer() in a .then() callback."
    )


def _stale_gradients(net) -> None:
    """What the last step left in ``.grad`` (the same on every rank), for ``zero_grad()`` to clear."""
    import torch

    g = torch.Generator().manual_seed(7)
    for p in net.parameters():
        p.grad = 0.1 * torch.randn(p.shape, generator=g)


@checker("05.3")
def _accumulation_step(fn):
    """A function (net, optimizer, micro_batches) -> None: one optimizer step over the micro-batches, each
    through its own backward, with DDP's all-reduce once, at the last one; on 2 and on 3 ranks."""
    import torch._dynamo  # noqa: F401 - DDP imports it (seconds); once here, not in every forked rank

    def rank_part(rank, world):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        g = torch.Generator().manual_seed(rank)
        micro = [
            (torch.randn(8, FEATURES, generator=g), torch.randint(0, CLASSES, (8,), generator=g))
            for _ in range(4)
        ]
        reduced, backwards = [], []

        def counting(state, bucket):
            reduced.append(bucket.index())
            return default_hooks.allreduce_hook(state, bucket)

        yours = DDP(toy_model(hidden=64))
        yours.register_comm_hook(None, counting)
        next(yours.module.parameters()).register_post_accumulate_grad_hook(backwards.append)
        opt_yours = torch.optim.SGD(yours.parameters(), lr=0.1)
        _stale_gradients(yours)
        fn(yours, opt_yours, micro)  # it steps the model in place; whatever it returns is not used

        def gap_to(kind: str) -> float:
            """How far your weights are from one SGD step of the given kind, from the same stale gradients."""
            net = DDP(toy_model(hidden=64))
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            _stale_gradients(net)
            if kind != "kept the stale gradients":
                optimizer.zero_grad()
            if kind == "the last micro-batch only":
                x, y = micro[-1]
                (F.cross_entropy(net(x), y) / len(micro)).backward()
            else:  # one batch of them all
                x, y = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
                F.cross_entropy(net(x), y).backward()
            optimizer.step()
            return max(
                float((a - b).detach().abs().max())
                for a, b in zip(yours.parameters(), net.parameters(), strict=True)
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
            "backwards": len(backwards),
            "micro-batches": len(micro),
            "gaps": {k: gap_to(k) for k in ("right", "kept the stale gradients", "the last micro-batch only")},
        }

    wrong = mistake_on_ranks(rank_part, _accumulation_mistake)[1]
    if wrong:
        return False, wrong
    return True, (
        "One backward per micro-batch, one all-reduce per optimizer step, and the same update as one large batch, "
        "on 2 and on 3 ranks."
    )


def _accumulation_mistake(results: list, world: int) -> str | None:
    """What is wrong with the learner's accumulation step on ``world`` ranks; None when nothing is."""
    first, said = results[0], f"with {world} ranks"
    if first["all_reduces"] > first["buckets"]:
        return (
            f"{said}, DDP all-reduced {first['all_reduces']} buckets for one optimizer step, not {first['buckets']}: "
            "the forward pass must be inside no_sync() as well, since DDP decides in forward whether backward syncs."
        )

    def matches(kind: str) -> bool:  # on every rank; NaN weights match nothing
        return all(r["gaps"][kind] <= 1e-6 for r in results)

    if not matches("right"):
        if matches("kept the stale gradients"):
            return (
                f"{said}, the gradients left in .grad by the previous step were added to this one's: call "
                "optimizer.zero_grad() once, before the first micro-batch."
            )
        if matches("the last micro-batch only"):
            return (
                f"{said}, only the last micro-batch's gradient reached the step: a zero_grad() inside the loop wiped "
                "the ones before it. Zero the gradients once, before the first micro-batch."
            )
        gap = max(r["gaps"]["right"] for r in results)
        return (
            f"{said}, the weights differ from one step on all the micro-batches at once by {gap:.3g}: divide each "
            "micro-batch's loss by their number, zero the gradients once, and step once at the end."
        )
    if first["backwards"] < first["micro-batches"]:
        return (
            f"{said}, the {first['micro-batches']} micro-batches went through {first['backwards']} backward() "
            "call(s): with one loss over all of them, every micro-batch's activations are held at once, which "
            "is what accumulation avoids. Run forward and backward per micro-batch, dividing each loss by their "
            "number."
        )
    return None
