"""Every exercise checker: the solution passes, realistic wrong answers fail with a message that says why,
and NaN, infinities, strings, None, bools and a function that raises never count as right.

The table ``EXERCISES`` is checked against the registry, so an exercise added without tests fails here.
The committed notebooks' solution cells are run too (``test_notebook_solutions_pass...``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors import safe_open
from test_front_door import STATED
from torch.utils.data import DistributedSampler

from helpers import (
    answering,
    bucketing,
    bytecount,
    checkpoints,
    collective,
    comm_hooks,
    dataparallel,
    devicemap,
    disk,
    dp_costs,
    environment,
    exercises,
    inference,
    lora,
    parallelism,
    paths,
    sampling,
    scoring,
    selfcog,
    sft,
    sharding,
    swiftcli,
    toys,
    training,
    troubleshooting,
    web,
)
from helpers.exercises import check, checker, nb04

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
N7B = parallelism.QWEN25_7B_PARAMETERS


@dataclass
class Exercise:
    solution: object
    wrong: list  # (answer, fragment the message must hold or None); the first is the most common mistake
    embed: object  # value -> an answer that carries ``value`` where the number (or text) belongs
    bad_values: tuple = (math.nan, math.inf, -math.inf, "1.5", None, True)
    raising: object = field(default=None)  # a function that raises, for function exercises


def _raises(*args):
    raise ValueError("boom")


def returns(value):
    """A learner's function that returns ``value`` whatever it is given (not the placeholder body)."""
    return lambda *args: value


# --- reference answers, written as the solution cells write them -------------------------------------


def combine(grads, sizes):
    return sum(n / sum(sizes) * g for g, n in zip(grads, sizes, strict=True))


def ring(nbytes, n, alpha, beta):
    return 2 * (n - 1) * (alpha + nbytes / n * beta)


def in_two(tensor):
    world = dist.get_world_size()
    mine = torch.empty(tensor.numel() // world, dtype=tensor.dtype)
    dist.reduce_scatter(mine, list(tensor.chunk(world)))
    pieces = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(pieces, mine)
    return torch.cat(pieces)


def in_two_into_tensors(tensor):
    """reduce_scatter_single and all_gather_single: one flat tensor in, one flat tensor out."""
    world = dist.get_world_size()
    mine = torch.empty(tensor.numel() // world, dtype=tensor.dtype)
    dist.reduce_scatter_single(mine, tensor)
    out = torch.empty_like(tensor)
    dist.all_gather_single(out, mine)
    return out


def in_two_async(tensor):
    """The list forms, started asynchronously and waited for; the pieces as rows of a view."""
    world = dist.get_world_size()
    rows = tensor.view(world, -1)
    mine = torch.zeros_like(rows[0])
    dist.reduce_scatter(mine, list(rows.unbind()), async_op=True).wait()
    out = torch.empty_like(rows)
    dist.all_gather(list(out.unbind()), mine, async_op=True).wait()
    return out.flatten()


def in_two_by_gathering_everything(tensor):
    """Everyone's whole tensor to everyone, summed locally: n times the data of a reduce-scatter."""
    everything = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(everything, tensor)
    return torch.stack(everything).sum(0)


def in_two_by_reduce_and_broadcast(tensor):
    """The sum on rank 0, then sent from rank 0 to everyone."""
    out = tensor.clone()
    dist.reduce(out, dst=0)
    dist.broadcast(out, src=0)
    return out


def average_hook(state, bucket):
    averaged = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(averaged, async_op=True).get_future().then(lambda fut: fut.value()[0])


def average_hook_after(state, bucket):
    """Sums first, divides the sum in the callback."""
    world = dist.get_world_size()
    return (
        dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0] / world)
    )


def average_hook_in_buffer(state, bucket):
    """Waits on nothing, divides in place and hands back the bucket's own buffer."""
    buffer = bucket.buffer()
    buffer.mul_(1.0 / dist.get_world_size())
    work = dist.all_reduce(buffer, async_op=True)

    def done(fut):
        fut.wait()
        return buffer

    return work.get_future().then(done)


def average_hook_for_two(state, bucket):
    """Divides by 2, the number of ranks it was tried on."""
    return (
        dist.all_reduce(bucket.buffer().div_(2), async_op=True).get_future().then(lambda fut: fut.value()[0])
    )


def average_hook_twice(state, bucket):
    """Divides by the world size before the all-reduce and again after it."""
    world = dist.get_world_size()
    future = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0] / world)


def hook_returning(value):
    def hook(state, bucket):
        future = torch.futures.Future()
        future.set_result(bucket.buffer() * value if isinstance(value, float) else value)
        return future

    return hook


def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in tensor.chunk(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(world - 1):
            send = (rank - step + (phase == "all-gather")) % world
            recv = (send - 1) % world
            incoming = torch.empty_like(chunks[recv])
            for work in dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, chunks[send], right), dist.P2POp(dist.irecv, incoming, left)]
            ):
                work.wait()
            chunks[recv] = chunks[recv] + incoming if phase == "reduce-scatter" else incoming
    return torch.cat(chunks)


def ring_short_by_one(tensor):
    """Stops the reduce-scatter a step early and skips the all-gather: world - 2 steps."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in tensor.chunk(world)]
    for step in range(world - 2):
        send, recv = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(chunks[recv])
        work = dist.isend(chunks[send], (rank + 1) % world)
        dist.recv(incoming, (rank - 1) % world)
        work.wait()
        chunks[recv] += incoming
    return torch.cat(chunks)


def ring_everyone_to_everyone(tensor):
    """The naive all-reduce: every rank sends its whole tensor to every other rank."""
    world, rank = dist.get_world_size(), dist.get_rank()
    out = tensor.clone()
    for peer in range(world):
        if peer != rank:
            work = dist.isend(tensor, peer)
            incoming = torch.empty_like(tensor)
            dist.recv(incoming, peer)
            work.wait()
            out += incoming
    return out


def ring_by_gathering(tensor):
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return sum(parts)


def ring_in_place(tensor):
    return tensor.copy_(ring_all_reduce(tensor))


def ring_both_ways(tensor):
    """Sends each chunk to both neighbours: right, then left."""
    world, rank = dist.get_world_size(), dist.get_rank()
    for peer in {(rank + 1) % world, (rank - 1) % world} - {rank}:
        work = dist.isend(tensor[:1].clone(), peer)
        dist.recv(torch.empty(1, dtype=tensor.dtype), peer)
        work.wait()
    return ring_all_reduce(tensor)


def ring_blocking_by_parity(tensor):
    """Blocking dist.send and dist.recv only: even ranks send first, odd ranks receive first."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(tensor.clone().view(world, -1))
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(2 * (world - 1)):
        send, recv = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(chunks[recv])
        if rank % 2 == 0:
            dist.send(chunks[send], right)
            dist.recv(incoming, left)
        else:
            dist.recv(incoming, left)
            dist.send(chunks[send], right)
        chunks[recv] = chunks[recv] + incoming if step < world - 1 else incoming
    return torch.cat(chunks)


def ring_isend_irecv(tensor):
    """isend and irecv, waited for together; rank r ends the reduce-scatter owning chunk r."""
    world, rank = dist.get_world_size(), dist.get_rank()
    n = tensor.numel() // world
    out = tensor.clone()
    for step in range(2 * (world - 1)):
        send = (rank - step - 1) % world
        recv = (send - 1) % world
        incoming = torch.empty(n, dtype=tensor.dtype)
        works = [dist.isend(out[send * n : (send + 1) * n].clone(), (rank + 1) % world),
                 dist.irecv(incoming, (rank - 1) % world)]  # fmt: skip
        for work in works:
            work.wait()
        if step < world - 1:
            out[recv * n : (recv + 1) * n] += incoming
        else:
            out[recv * n : (recv + 1) * n] = incoming
    return out


def ring_all_gather_off_by_one(tensor):
    """The all-gather starts from the chunk the reduce-scatter started from, not the one it finished."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in tensor.chunk(world)]
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(world - 1):
            send = (rank - step) % world
            recv = (send - 1) % world
            incoming = torch.empty_like(chunks[recv])
            work = dist.isend(chunks[send], (rank + 1) % world)
            dist.recv(incoming, (rank - 1) % world)
            work.wait()
            chunks[recv] = chunks[recv] + incoming if phase == "reduce-scatter" else incoming
    return torch.cat(chunks)


def ring_receive_first(tensor):
    """Every rank waits in the blocking dist.recv before it sends: a deadlock."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in tensor.chunk(world)]
    for step in range(world - 1):
        send, recv = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(chunks[recv])
        dist.recv(incoming, (rank - 1) % world)
        dist.send(chunks[send], (rank + 1) % world)
        chunks[recv] += incoming
    return torch.cat(chunks)


def ring_send_first(tensor):
    """Every rank sends with the blocking dist.send before it receives: a deadlock."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in tensor.chunk(world)]
    for step in range(world - 1):
        send, recv = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(chunks[recv])
        dist.send(chunks[send], (rank + 1) % world)
        dist.recv(incoming, (rank - 1) % world)
        chunks[recv] += incoming
    return torch.cat(chunks)


class TinyDDP(torch.nn.Module):
    """The solution: hooks fill buckets, bucket i all-reduced after 0..i-1, no_sync read at forward, a callback."""

    def __init__(self, module, order, cap, rule=bucketing.expected_buckets):
        super().__init__()
        self.module, self.world, self.require_sync, self.syncing = module, dist.get_world_size(), True, False
        params = list(module.parameters())
        sizes = [params[i].numel() * params[i].element_size() for i in order]
        self.buckets = [[params[order[j]] for j in b] for b in rule(sizes, cap)]
        self.flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype) for b in self.buckets]
        self.slot = {}
        for i, bucket in enumerate(self.buckets):
            for p, piece in zip(bucket, self.flat[i].split([p.numel() for p in bucket]), strict=True):
                self.slot[p] = (i, piece.view_as(p))
                p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *inputs):
        self.syncing = torch.is_grad_enabled() and self.require_sync
        self.missing, self.works, self.queued = [len(b) for b in self.buckets], [], False
        return self.module(*inputs)

    def ready(self, p):
        if not self.syncing:
            return
        if not self.queued:
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)
            self.queued = True
        i, view = self.slot[p]
        self.copy_in(p.grad, view)
        self.missing[i] -= 1
        self.launch()

    def copy_in(self, grad, view):
        torch.mul(grad, 1.0 / self.world, out=view)  # torch scales by 1/world on the way into the bucket

    def launch(self):
        while len(self.works) < len(self.buckets) and self.missing[len(self.works)] == 0:
            self.works.append(dist.all_reduce(self.flat[len(self.works)], async_op=True))

    def finish(self):
        for i, work in enumerate(self.works):
            work.wait()
            for p in self.buckets[i]:
                p.grad.copy_(self.slot[p][1])

    @contextlib.contextmanager
    def no_sync(self):
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True


class AsSoonAsFull(TinyDDP):
    """Launches each bucket the moment it is full, whatever came before it."""

    def launch(self):
        self.works = getattr(self, "works", [])
        for i, left in enumerate(self.missing):
            if left == 0 and i not in self.sent:
                self.sent.add(i)
                self.works.append(dist.all_reduce(self.flat[i], async_op=True))

    def forward(self, *inputs):
        self.sent = set()
        return super().forward(*inputs)

    def finish(self):
        for work in self.works:
            work.wait()
        for bucket in self.buckets:
            for p in bucket:
                p.grad.copy_(self.slot[p][1])


class SyncAtHook(TinyDDP):
    """Reads the no_sync flag in the hook, at backward time."""

    def ready(self, p):
        self.syncing = self.require_sync
        super().ready(p)


class NoCallback(TinyDDP):
    """Averaged gradients only after an explicit finish() that backward never calls."""

    def ready(self, p):
        self.queued = True
        super().ready(p)


class DividedByTwo(TinyDDP):
    """Sums, then divides by 2 after the all-reduce: right on two ranks only."""

    def copy_in(self, grad, view):
        view.copy_(grad)

    def finish(self):
        super().finish()
        for bucket in self.buckets:
            for p in bucket:
                p.grad.div_(2)


class LaunchAtEnd(TinyDDP):
    """The hooks only fill the buckets; the callback all-reduces them all, in order: no overlap."""

    def launch(self):
        pass

    def finish(self):
        self.works = [dist.all_reduce(flat, async_op=True) for flat in self.flat]
        super().finish()


class BlockingInHook(TinyDDP):
    """Each full bucket is all-reduced with a blocking call from the hook: backward waits for it."""

    def launch(self):
        while len(self.works) < len(self.buckets) and self.missing[len(self.works)] == 0:
            dist.all_reduce(self.flat[len(self.works)])
            self.works.append(torch.futures.Future())
            self.works[-1].set_result(None)


class SumThenDivide(TinyDDP):
    """Sums in the buckets and divides the averaged gradients in the callback."""

    def copy_in(self, grad, view):
        view.copy_(grad)

    def finish(self):
        super().finish()
        for bucket in self.buckets:
            for p in bucket:
                p.grad.div_(self.world)


class PlainReducer:
    """Not a Module: a callable holding the module, its own bucket loop, a pointer to the next bucket to send."""

    def __init__(self, module, order, cap):
        self.module, self.syncing, self.enabled = module, False, True
        params = list(module.parameters())
        self.buckets, size = [[]], 0
        for i in order:
            self.buckets[-1].append(params[i])
            size += params[i].numel() * params[i].element_size()
            if size >= cap:
                self.buckets.append([])
                size = 0
        self.buckets = [b for b in self.buckets if b]
        self.where = {p: i for i, b in enumerate(self.buckets) for p in b}
        for p in params:
            p.register_post_accumulate_grad_hook(self.on_grad)

    def __call__(self, x):
        self.syncing = self.enabled and torch.is_grad_enabled()
        self.ready, self.sent, self.works, self.callback = [0] * len(self.buckets), 0, [], False
        return self.module(x)

    def on_grad(self, p):
        if not self.syncing:
            return
        if not self.callback:
            torch.autograd.Variable._execution_engine.queue_callback(self.done)
            self.callback = True
        self.ready[self.where[p]] += 1
        while self.sent < len(self.buckets) and self.ready[self.sent] == len(self.buckets[self.sent]):
            flat = torch.cat([q.grad.flatten() for q in self.buckets[self.sent]]) / dist.get_world_size()
            self.works.append((flat, dist.all_reduce(flat, async_op=True)))
            self.sent += 1

    def done(self):
        for bucket, (flat, work) in zip(self.buckets, self.works, strict=True):
            work.wait()
            for p, piece in zip(bucket, flat.split([q.numel() for q in bucket]), strict=True):
                p.grad.copy_(piece.view_as(p))

    @contextlib.contextmanager
    def no_sync(self):
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True


def tiny(cls, **kwargs):
    return lambda module, order, cap: cls(module, order, cap, **kwargs)


def accumulation_step(net, optimizer, micro_batches, sync_forward=False, scale=True, step=True, zero="once"):
    if zero == "once":
        optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        if zero == "every micro-batch":
            optimizer.zero_grad()
        last = i == len(micro_batches) - 1
        if sync_forward:  # the forward pass outside no_sync: DDP has already decided to sync
            loss = F.cross_entropy(net(x), y) / (len(micro_batches) if scale else 1)
            with contextlib.nullcontext() if last else net.no_sync():
                loss.backward()
        else:
            with contextlib.nullcontext() if last else net.no_sync():
                (F.cross_entropy(net(x), y) / (len(micro_batches) if scale else 1)).backward()
    if step:
        optimizer.step()


def accumulation_with_ifs(net, optimizer, micro_batches):
    """Branches instead of a null context, the model's zero_grad, the loss summed and divided by every sample."""
    net.zero_grad()
    total = sum(len(y) for _, y in micro_batches)
    for x, y in micro_batches[:-1]:
        with net.no_sync():
            (F.cross_entropy(net(x), y, reduction="sum") / total).backward()
    x, y = micro_batches[-1]
    (F.cross_entropy(net(x), y, reduction="sum") / total).backward()
    optimizer.step()


def accumulation_with_exit_stack(net, optimizer, micro_batches):
    """An ExitStack that enters no_sync for all but the last; zeroes to 0 rather than None."""
    optimizer.zero_grad(set_to_none=False)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.ExitStack() as stack:
            if i < len(micro_batches) - 1:
                stack.enter_context(net.no_sync())
            loss = F.cross_entropy(net(x), y) * (1.0 / len(micro_batches))
            loss.backward()
    optimizer.step()


def one_loss_for_all(net, optimizer, micro_batches):
    """Every micro-batch's forward first, their mean loss through one backward: no accumulation at all."""
    optimizer.zero_grad()
    loss = sum(F.cross_entropy(net(x), y) for x, y in micro_batches) / len(micro_batches)
    loss.backward()
    optimizer.step()


def step_then_fill(value):
    def step(net, optimizer, micro_batches):
        accumulation_step(net, optimizer, micro_batches)
        with torch.no_grad():
            for p in net.parameters():
                p.fill_(value)

    return step


def fp16_hook(state, bucket, dtype=torch.float16, divide="first", cast_back=True, compress=True):
    world = dist.get_world_size()
    if not compress:
        return (
            dist.all_reduce(bucket.buffer().div_(world), async_op=True)
            .get_future()
            .then(lambda f: f.value()[0])
        )
    if divide == "in float32":  # divides the float32 bucket, then casts: rounded once, not twice
        compressed = (bucket.buffer() / world).to(dtype)
    else:
        compressed = bucket.buffer().to(dtype)
        if divide == "first":
            compressed.div_(world)

    def back(fut):
        value = fut.value()[0]
        if divide == "after":
            value = value.div_(world)
        return bucket.buffer().copy_(value) if cast_back else value

    return dist.all_reduce(compressed, async_op=True).get_future().then(back)


def fp16_hook_half(state, bucket):
    """The same steps as torch's, spelled with .half(), an in-place division and a named callback."""
    buffer = bucket.buffer()
    compressed = buffer.half()
    compressed /= dist.get_world_size()

    def decompress(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(compressed, async_op=True).get_future().then(decompress)


def fp16_hook_new_tensor(state, bucket):
    """Hands back a new float32 tensor rather than the bucket's own buffer."""
    compressed = torch.div(bucket.buffer().to(torch.float16), dist.get_world_size())
    work = dist.all_reduce(compressed, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0].to(bucket.buffer().dtype))


def fp16_hook_for_two(state, bucket):
    """Divides by 2, the number of ranks it was tried on."""
    compressed = bucket.buffer().to(torch.float16).div_(2)
    return (
        dist.all_reduce(compressed, async_op=True)
        .get_future()
        .then(lambda f: bucket.buffer().copy_(f.value()[0]))
    )


def fp16_hook_blocking(state, bucket):
    """A blocking all-reduce, then a Future that is already complete."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    dist.all_reduce(compressed)
    future = torch.futures.Future()
    future.set_result(bucket.buffer().copy_(compressed))
    return future


def fp16_hook_waits(state, bucket):
    """Starts the all-reduce asynchronously, then waits for it inside the hook."""
    compressed = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    dist.all_reduce(compressed, async_op=True).wait()
    future = torch.futures.Future()
    future.set_result(bucket.buffer().copy_(compressed))
    return future


def checkpoint(
    path, model, optimizer, step=None, rank0=True, barrier=True, opt=True, keep_step=True, unwrap=True
):
    if step is not None:  # save
        weights = (model.module if unwrap else model).state_dict()
        state = {"model": weights, "step": step if keep_step else 0}
        if opt:
            state["optimizer"] = optimizer.state_dict()
        if dist.get_rank() == 0 or not rank0:
            checkpoints.atomic_save(state, path)
        if barrier:
            dist.barrier()
        return None
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    if "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def checkpoint_plain_save(path, model, optimizer, step=None, guard=True, barrier="after"):
    """torch.save straight to the path (not atomic); ``guard``: rank 0 alone writes; ``barrier``: "after"
    the write, "before" it, or None."""
    if step is not None:
        if barrier == "before":
            dist.barrier()
        if dist.get_rank() == 0 or not guard:
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path
            )
        if barrier == "after":
            dist.barrier()
        return None
    state = torch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def checkpoint_as_tuple(path, net, optimizer, step=None):
    """A tuple in a file written next to the path and renamed over it; loaded with map_location."""
    if step is None:
        weights, moments, saved_at = torch.load(path, map_location="cpu")
        net.load_state_dict(weights)
        optimizer.load_state_dict(moments)
        return saved_at
    if dist.get_rank() == 0:
        tmp = f"{path}.partial"
        torch.save((net.module.state_dict(), optimizer.state_dict(), step), tmp)
        os.replace(tmp, path)
    dist.barrier()


def epoch_orders(n, rank, world, epochs, seed=0, tell=True, offset=0):
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    orders = []
    for epoch in range(epochs):
        if tell:
            sampler.set_epoch(epoch + offset)
        orders.append(list(sampler))
    return orders


def epoch_orders_told_at_the_end(n, rank, world, epochs, seed=0):
    """Tells the sampler the next epoch once an epoch is done."""
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    orders = []
    for epoch in range(epochs):
        orders.append(list(sampler))
        sampler.set_epoch(epoch + 1)
    return orders


def fill_row(row, name, author, zh=lambda tag: tag == "zh", keys=("query", "response"), count=-1):
    i = 0 if zh(row["tag"]) else 1
    out = dict(row)
    for key in keys:
        out[key] = row[key].replace("{{NAME}}", name[i], count).replace("{{AUTHOR}}", author[i], count)
    return out


def last_logged(path, step_of=lambda entry: int(entry["global_step/max_steps"].split("/")[0])):
    lines = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]
    steps = [e for e in lines if "loss" in e and "global_step/max_steps" in e and "train_runtime" not in e]
    return step_of(steps[-1]), float(steps[-1]["loss"])


def merge_scale(base_dir, adapter_dir, merged_dir, subtract_w=True, from_weights=True, ratio=False):
    """10.3: the s of merged = W + s·B·A, pooled least squares over every adapted weight; the keywords make
    the learners' mistakes: the config's alpha/r, M fitted instead of M - W, an element-wise ratio."""
    from safetensors import safe_open

    if not from_weights:
        config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
        return config["lora_alpha"] / config["r"]
    base, lora, merged = [{name: handle for file in sorted(Path(folder).glob("*.safetensors"))
                           for handle in [safe_open(file, "pt")] for name in handle.keys()}
                          for folder in (base_dir, adapter_dir, merged_dir)]  # fmt: skip
    along = across = 0.0
    ratios = []
    for key in (k for k in lora if k.endswith(".lora_A.weight")):
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        key_b = key.replace("lora_A", "lora_B")
        update = lora[key_b].get_tensor(key_b).double() @ lora[key].get_tensor(key).double()
        change = merged[name].get_tensor(name).double() - subtract_w * base[name].get_tensor(name).double()
        along, across = along + float((change * update).sum()), across + float((update * update).sum())
        ratios.append(float((change / update).mean()))
    return sum(ratios) / len(ratios) if ratio else along / across


def merge_scale_by_lstsq(base_dir, adapter_dir, merged_dir):
    """10.3 another way: every tensor loaded (load_file), one lstsq over all adapted weights' entries."""
    from safetensors.torch import load_file

    def load(folder):
        tensors = {}
        for file in Path(folder).glob("*.safetensors"):
            tensors.update(load_file(file))
        return tensors

    base, lora, merged = load(base_dir), load(adapter_dir), load(merged_dir)
    updates, changes = [], []
    for key in lora:
        if "lora_A" in key:
            name = key[len("base_model.model.") :].replace(".lora_A", "")
            updates.append((lora[key.replace("lora_A", "lora_B")].double() @ lora[key].double()).flatten())
            changes.append((merged[name].double() - base[name].double()).flatten())
    return torch.linalg.lstsq(torch.cat(updates)[:, None], torch.cat(changes)[:, None]).solution.item()


def merge_scale_median_of_layers(base_dir, adapter_dir, merged_dir):
    """10.3 another way: one fit per adapted weight in float32, their median as a numpy float."""
    import numpy as np
    from safetensors.torch import load_file

    def load(folder):
        return {
            k: v.float().numpy() for f in Path(folder).glob("*.safetensors") for k, v in load_file(f).items()
        }

    base, lora, merged = load(base_dir), load(adapter_dir), load(merged_dir)
    fits = []
    for key in sorted(k for k in lora if k.endswith("lora_A.weight")):
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        update = (lora[key.replace("lora_A", "lora_B")] @ lora[key]).ravel()
        fits.append(update @ (merged[name] - base[name]).ravel() / (update @ update))
    return np.median(fits)


# 12.4's changes, as notebook 12's CHANGES lists them
FORCED_CHANGES = [
    "--ddp_find_unused_parameters false",
    "--tuner_type full",
    "no NPROC_PER_NODE (one process)",
    "--gradient_checkpointing_kwargs '{\"use_reentrant\": false}'",
]


def answers_from(path, pick=-1, keep_all=True):
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        users = [m["content"] for m in row["messages"] if m["role"] == "user"]
        if not keep_all:
            out = {}
        out[users[pick]] = row["response"]
    return out


def gpus_of_rank(local_rank, n_gpu, nproc):
    return list(range(local_rank, n_gpu, nproc))


def zero1(
    params, make_optimizer, owner_of="size", source="owner", keep="share", reduce_again=False, build="once"
):
    """11.4's solution (greedy by size, largest first), and the mistakes its arguments name."""
    rank, world = dist.get_rank(), dist.get_world_size()
    world = 2 if owner_of == "a world of 2" else world
    owner, load = [0] * len(params), [0] * world
    if owner_of == "index":  # round robin over the list: weights and biases alternate
        owner = [i % world for i in range(len(params))]
    for i in sorted(range(len(params)), key=lambda i: -params[i].numel()) if owner_of != "index" else []:
        owner[i] = load.index(min(load))
        load[owner[i]] += params[i].numel()
    mine = params if keep == "everything" else [p for p, o in zip(params, owner, strict=True) if o == rank]
    optimizer = make_optimizer(mine)

    def step():
        if reduce_again:
            for p in params:
                dist.all_reduce(p.grad)
        (make_optimizer(mine) if build == "every step" else optimizer).step()
        for p, o in zip(params, owner, strict=True):
            if source != "none":
                dist.broadcast(p.data, src=0 if source == "rank 0" else o)

    return step


def zero1_contiguous(params, make_optimizer):
    """Cut the list where the running count passes each rank's share; one Adam per parameter; async broadcasts."""
    world, rank = dist.get_world_size(), dist.get_rank()
    total, seen, owner = sum(p.numel() for p in params), 0, []
    for p in params:
        owner.append(min(world - 1, (seen + p.numel() // 2) * world // total))
        seen += p.numel()
    mine = [make_optimizer([p]) for p, o in zip(params, owner, strict=True) if o == rank]

    def step():
        for optimizer in mine:
            optimizer.step()
        works = [dist.broadcast(p.detach(), src=o, async_op=True) for p, o in zip(params, owner, strict=True)]
        for work in works:
            work.wait()

    return step


class Zero1ByBytes:
    """A class whose instance is the step: greedy by bytes, broadcasts under no_grad."""

    def __init__(self, params, make_optimizer):
        loads, self.params, self.owner = [0] * dist.get_world_size(), params, {}
        for p in sorted(params, key=lambda p: p.numel() * p.element_size(), reverse=True):
            self.owner[p] = min(range(len(loads)), key=loads.__getitem__)
            loads[self.owner[p]] += p.numel() * p.element_size()
        self.optimizer = make_optimizer([p for p in params if self.owner[p] == dist.get_rank()])

    def __call__(self):
        self.optimizer.step()
        with torch.no_grad():
            for p in self.params:
                dist.broadcast(p, self.owner[p])


def zero1_own_adam(params, make_optimizer):
    return torch.optim.Adam(params, lr=0.05).step


def reentrant(kwargs, nproc_per_node, deepspeed, fsdp):
    if kwargs and kwargs.get("use_reentrant") is not None:
        return kwargs["use_reentrant"]
    return not (nproc_per_node is not None and not deepspeed and not fsdp)


def in_collective(frames):
    return any("distributed_c10d.py" in frame for frame in frames)


def stuck(stacks, first_only=False, only=None, ranks=None):
    keys = list(range(len(stacks))) if ranks == "positions" else list(stacks)
    frames = list(stacks.values())
    waiting = set()
    for key, rank_frames in zip(keys, frames, strict=True):
        looked = rank_frames[:1] if first_only else rank_frames
        if any(f.startswith(only) for f in looked) if only else in_collective(looked):
            waiting.add(key)
    return waiting, set(keys) - waiting


def ckpt(layers, layer_mb, input_mb, checkpointed):
    return layers * input_mb + layer_mb if checkpointed else layers * layer_mb


class Script(os.PathLike):
    """A learner's script for 06.3, given as its text: written under the test's build folder when the checker
    opens it."""

    def __init__(self, text: str):
        self.text = text

    def __fspath__(self) -> str:
        import hashlib

        path = (
            paths.run_dir("exercise-04.8") / f"script-{hashlib.sha1(self.text.encode()).hexdigest()[:10]}.py"
        )
        path.write_text(self.text)
        return str(path)


def _solution_06_3() -> str:
    """The script of 06.3's solution cell, as the notebook holds it."""
    import ast

    import nbformat

    [cell] = [
        c for c in nbformat.read(NOTEBOOKS / "06_ddp_in_practice.ipynb", as_version=4).cells if c.id == "c42p"
    ]
    [assign] = [n for n in ast.parse(cell.source).body if isinstance(n, ast.Assign)]
    return ast.literal_eval(assign.value)


SCRIPT_06_3 = _solution_06_3()


def ddp_script(**change) -> Script:
    """06.3's solution with one realistic mistake: ``change`` maps a line of it to what replaces it."""
    text = SCRIPT_06_3
    for old, new in change.items():
        assert old in text, old
        text = text.replace(old, new)
    return Script(text)


SCRIPT_EVERY_RANK_SAVES = ddp_script(
    **{
        "if dist.get_rank() == 0:  # every rank holds the same weights: one writer\n    torch.save": "torch.save",
        "dist.barrier()\n": "",
    }
)
SCRIPT_BY_HAND_BATCHES = ddp_script(
    **{
        "loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler)\n": "",
        "    for x, y in loader:\n": "    mine = list(sampler)\n    for start in range(0, len(mine), args.batch):\n"
        "        x, y = dataset[mine[start : start + args.batch]]\n",
    }
)
SCRIPT_RANK_FROM_ENVIRONMENT = ddp_script(**{
    "import argparse": "import argparse\nimport os",
    "optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)": "optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)",
    "if dist.get_rank() == 0:": "if int(os.environ[\"RANK\"]) == 0:",
    "torch.save(model.state_dict(), args.out)": "torch.save(ddp.module.state_dict(), args.out)",
})  # fmt: skip


def evaluate(model, dataset, batch=4, *, skip_padding=True, reduce="counts", sampler_kw=None):
    """06.4's solution, and its usual mistakes: the padding counted, the ranks' accuracies averaged ("mean"), or
    kept apart ("none"), drop_last (``sampler_kw``)."""
    from torch.utils.data import DataLoader, Subset

    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = DistributedSampler(dataset, shuffle=False, **(sampler_kw or {}))
    mine = [i for k, i in enumerate(sampler) if not skip_padding or rank + k * world < len(dataset)]
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in DataLoader(Subset(dataset, mine), batch_size=batch):
            counts += torch.tensor([float((model(x).argmax(dim=1) == y).sum()), float(len(y))])
    if reduce == "counts":
        dist.all_reduce(counts)
        return (counts[0] / counts[1]).item()
    accuracy = torch.tensor([float(counts[0] / counts[1]) if counts[1] else 0.0])
    if reduce == "mean":
        dist.all_reduce(accuracy)
        accuracy /= world
    return accuracy.item()


def evaluate_split_by_hand(model, dataset, mean=False):
    """Every world-th sample from the rank's own, one at a time, and the counts summed as float64 (or, wrong, the
    ranks' accuracies averaged: their shards differ in size)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    correct = seen = 0
    with torch.no_grad():
        for i in range(rank, len(dataset), world):
            x, y = dataset[i]
            correct += int(model(x.unsqueeze(0)).argmax() == y)
            seen += 1
    if mean:
        accuracy = torch.tensor([correct / seen])
        dist.all_reduce(accuracy)
        return float(accuracy) / world
    counts = torch.tensor([correct, seen], dtype=torch.float64)
    dist.all_reduce(counts)
    return counts[0] / counts[1]  # a 0-d tensor


def evaluate_by_gathering(model, dataset):
    """Each rank's {index: right} over its padded shard, gathered; a padded index simply lands twice in one dict."""
    world = dist.get_world_size()
    mine = {}
    with torch.no_grad():
        for i in DistributedSampler(dataset, shuffle=False):
            x, y = dataset[i]
            mine[i] = bool(model(x[None]).argmax() == y)
    every = [None] * world
    dist.all_gather_object(every, mine)
    merged = {i: right for part in every for i, right in part.items()}
    return sum(merged.values()) / len(merged)


def evaluate_everything(model, dataset):
    """Every rank evaluates the whole dataset: the right number, and none of the sharding."""
    from torch.utils.data import DataLoader

    correct = 0
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=4):
            correct += int((model(x).argmax(dim=1) == y).sum())
    return correct / len(dataset)


def summarize(value):
    results = []
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
        tensor = torch.tensor([float(value)])
        dist.all_reduce(tensor, op=op)
        results.append(tensor.item())
    return tuple(results)


def summarize_reusing_one_tensor(value):
    tensor, results = torch.tensor([float(value)]), []
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
        dist.all_reduce(tensor, op=op)  # the second and third reduce the total, not the values
        results.append(tensor.item())
    return tuple(results)


def summarize_in_one_tensor(value):
    """Another right answer: the minimum as the maximum of the negated values, two all-reduces in all."""
    total, extremes = torch.tensor([value], dtype=torch.float64), torch.tensor([value, -value], dtype=torch.float64)
    work = dist.all_reduce(total, async_op=True)
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    work.wait()
    return [total, extremes[0], -extremes[1]]  # a list of 0-d tensors and numbers


def summarize_by_gathering(value):
    """Another right answer: gather every value, then compute on every rank."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return sum(everyone), max(everyone), min(everyone)


def summarize_only_on_rank_0(value):
    tensor = torch.tensor([float(value)])
    if dist.get_rank() == 0:
        dist.all_reduce(tensor)
    return tensor.item(), value, value


EXERCISES = {
    "06.4": Exercise(
        evaluate,
        [
            (lambda m, d: evaluate(m, d, skip_padding=False), "counted twice"),
            (lambda m, d: evaluate(m, d, skip_padding=False, reduce="mean"), "counted twice"),
            (lambda m, d: evaluate_split_by_hand(m, d, mean=True), "mean of the ranks' accuracies"),
            (lambda m, d: evaluate(m, d, reduce="none"), "each its own shard's accuracy"),
            (lambda m, d: evaluate(m, d, sampler_kw={"drop_last": True}), "drop_last=True"),
            (evaluate_everything, "its share is at most"),
            (lambda m, d: str(evaluate(m, d)), "text, not a number"),
            (lambda m, d: [evaluate(m, d)], "a number of accuracy"),
        ],
        returns,
    ),
    "00.3": Exercise(
        summarize,
        [
            (summarize_reusing_one_tensor, "works in place"),
            (lambda value: (value, value, value), "its own value only"),
            (lambda value: (lambda t: (dist.all_reduce(t), (t.item(), t.item(), t.item()))[1])(torch.tensor([value])),
             "ReduceOp.MAX and ReduceOp.MIN"),
            (lambda value: summarize(value)[:2], "three numbers"),
            (lambda value: {"total": 1.0}, "three numbers"),
            (summarize_only_on_rank_0, "same all-reduces, in the same order"),
            (lambda value: (lambda t: (dist.all_reduce(t), None)[1])(torch.tensor([value])), "is a `return` missing"),
        ],
        returns,
    ),
    "01.1": Exercise(
        combine,
        [
            (lambda g, s: sum(g) / len(g), "plain mean is off"),
            (lambda g, s: sum(g), "too large"),
            (lambda g, s: sum(n * x for n, x in zip(s, g, strict=True)), "not divided by B"),
            (lambda g, s: sum(x / n for n, x in zip(s, g, strict=True)), "differs"),
            (lambda g, s: g[0], "differs"),
            (lambda g, s: combine(g, s).float(), None),  # float32 is fine: see test_dtype_tolerant
        ],
        lambda v: (lambda g, s: g[0] * v) if isinstance(v, float) else returns(v),
    ),
    "01.2": Exercise(
        (2 * 7 / 8, 7.0),
        [
            ((2.0, 7.0), "never sends the chunk it ends up owning"),
            ((1.75, 8.0), "only the other 7"),
            ((0.875, 7.0), "reduce-scatter only"),
            ((7.0, 1.75), "swapped"),
            ((1.75e9, 7e9), "in bytes"),
            ([1.75, 7.0], "a tuple"),
            ({1.75: "ring", 7.0: "gpu0"}, "a tuple"),
        ],
        lambda v: (v, 7.0),
    ),
    "01.3": Exercise(
        N7B * parallelism.BF16_MIXED_ADAM.total / 1e9,
        [
            (N7B * 16 / 1e9 / 8, "ZeRO-3"),
            (N7B * 16 / 2**30, "GiB"),
            (N7B * 12 / 1e9, "master weights"),
            (N7B * 16, "in bytes"),
            (50.0, "16 bytes per parameter"),
        ],
        lambda v: v,
    ),
    "01.4": Exercise(
        (1.0, 1 / 4),
        [
            ((0.25, 0.25), "Adam's ratio"),
            ((1.0, 1.0), "SGD's step is lr × gradient"),
            ((1.0, 4.0), "upside down"),
            ((0.25, 1.0), "swapped"),
            ((0.5, 0.25), "Adam's ratio"),
            ([1.0, 0.25], "a tuple"),
        ],
        lambda v: (v, 0.25),
    ),
    "02.1": Exercise(
        lambda k, w: (k - 1) * w,
        [
            (lambda k, w: k * w, "already holds the model"),
            (lambda k, w: (k - 1) * w / k, "not 2"),
            (lambda k, w: w, "already holds the model"),
            (lambda k, w: k - 1, "not 1"),
            (lambda k, w: (k - 1) * w if k > 1 else None, "returned None"),
        ],
        returns,
    ),
    "02.2": Exercise(
        {"parallel forward", "parallel backward"},
        [
            ({"parallel forward"}, "one of them is missing"),
            (set(dataparallel.STEPS), "main device alone"),
            ({"forward", "backward"}, "not step names"),
            ({"parallel forward", "parallel backward", "reduce gradients"}, "main device alone"),
            (["parallel forward", "parallel backward"], "a set"),
        ],
        lambda v: {v} if v is not None else None,
        bad_values=(math.nan, math.inf, -math.inf, "1.5", True),
    ),
    "02.3": Exercise(
        lambda k: k,
        [
            (lambda k: 1, "2 times the full-batch gradient"),
            (lambda k: 1 / k, "upside down"),
            (lambda k: k - 1, "not 0"),
            (lambda k: k * k, "not 4"),
        ],
        returns,
    ),
    "02.4": Exercise(
        lambda b, k: [len(c) for c in torch.arange(b).chunk(k)],
        [
            (lambda b, k: [len(c) for c in torch.arange(b).tensor_split(k)], "tensor_split's rule"),
            (lambda b, k: [len(c) for c in torch.arange(b).chunk(k)] + [0] * (k - len(torch.arange(b).chunk(k))),
             "leave it out"),
            (lambda b, k: [b // k] * k, "every row goes somewhere"),
            (lambda b, k: [-(-b // k)] * (k - 1) + [b - -(-b // k) * (k - 1)], "fewer than 0 rows"),
            (lambda b, k: [-(-b // k)] * k, "every row goes somewhere"),
            (lambda b, k: [float(n) for n in [len(c) for c in torch.arange(b).chunk(k)]], "whole numbers"),
            (lambda b, k: b // k, "a list of row counts"),
        ],
        returns,
    ),
    "03.1": Exercise(
        ring,
        [
            (lambda nb, n, a, b: 2 * (n - 1) * nb / n * b, "leaves out the latency"),
            (lambda nb, n, a, b: (n - 1) * (a + nb / n * b), "half of it"),
            (lambda nb, n, a, b: a + 2 * (n - 1) * nb / n * b, "not"),
            (lambda nb, n, a, b: 2 * (n - 1) * (a + nb * b), "not"),
            (lambda nb, n, a, b: 2 * n * (a + nb / n * b), "not"),
        ],
        returns,
    ),
    "04.1": Exercise(
        lambda sizes, cap: bucketing.expected_buckets(sizes, cap),
        [
            (nb04._pack_strictly, "reaches its cap exactly is full"),
            (nb04._pack_before_overflow, "holds at least the cap"),
            (lambda sizes, cap: bucketing.expected_buckets(sizes, cap)[:-1] or [[]], None),
            (lambda sizes, cap: [[i] for i in range(len(sizes))], "pack into"),
            (lambda sizes, cap: [list(range(len(sizes)))], "pack into"),
            (lambda sizes, cap: [b[::-1] for b in bucketing.expected_buckets(sizes, cap)], "pack into"),
        ],
        lambda v: returns([[v]]),
    ),
    "04.2": Exercise(
        lambda ready, wire: comm_hooks.link_finish_times(ready, wire)[-1],
        [
            (lambda ready, wire: ready[-1] + wire[-1], "still be busy"),
            (lambda ready, wire: ready[0] + sum(wire), "arrives at"),
            (lambda ready, wire: max(r + w for r, w in zip(ready, wire, strict=True)), "arrives at"),
            (lambda ready, wire: ready[-1] + sum(wire), "arrives at"),
            (lambda ready, wire: comm_hooks.link_finish_times(ready, wire), "number of seconds"),
        ],
        returns,
    ),
    "03.2": Exercise(
        in_two,
        [
            (lambda t: t * dist.get_world_size(), "called no collective"),
            (lambda t: in_two(t).copy_(t) if False else t.copy_(in_two(t)), "leave the input"),
            (lambda t: (lambda o: (dist.all_reduce(o), o)[1])(t.clone()), "called dist.all_reduce"),
            (in_two_by_gathering_everything, "all-gathered the whole tensor"),
            (in_two_by_reduce_and_broadcast, "called dist.reduce"),
            (
                lambda t: (lambda m: (dist.reduce_scatter(m, list(t.chunk(dist.get_world_size()))), m)[1])(
                    torch.empty(t.numel() // dist.get_world_size(), dtype=t.dtype)
                ),
                "1 reduce-scatter(s) and 0 all-gather(s)",
            ),
        ],
        lambda v: (lambda t: t * v) if isinstance(v, float) else returns(v),
        bad_values=(math.nan, math.inf, "1.5", None),
    ),
    "04.3": Exercise(
        average_hook,
        [
            (
                lambda s, b: (
                    dist.all_reduce(b.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])
                ),
                "average, do not just add",
            ),
            (lambda s, b: hook_returning(1 / dist.get_world_size())(s, b), "average, do not just add"),
            (lambda s, b: b.buffer(), "torch.futures.Future"),
            (lambda s, b: dist.all_reduce(b.buffer().div_(2), async_op=True).get_future(), "failed"),
            (average_hook_for_two, "right on 2 ranks but not on 3"),
            (average_hook_twice, "divided twice"),
        ],
        hook_returning,
        bad_values=(math.nan, -math.inf, "1.5"),
    ),
    "03.3": Exercise(
        ring_all_reduce,
        [
            (ring_by_gathering, "rank 0 called dist.all_gather: a ring is built from sends"),
            (ring_everyone_to_everyone, "a ring sends 2(n - 1)"),
            (ring_short_by_one, "a ring sends 2(n - 1)"),
            (ring_in_place, "leave the input"),
            (ring_both_ways, "rank 0 sent"),
            (ring_send_first, "gloo's send returns only once"),
            (ring_receive_first, "'s dist.recv from rank"),
            (ring_all_gather_off_by_one, "off by one"),
        ],
        lambda v: (lambda t: t * v) if isinstance(v, float) else returns(v),
        bad_values=(math.nan, math.inf, "1.5", None),
    ),
    "05.1": Exercise(
        tiny(TinyDDP),
        [
            (tiny(TinyDDP, rule=nb04._pack_before_overflow), "at least `cap` bytes"),
            (tiny(AsSoonAsFull), "same order"),
            (tiny(SyncAtHook), "decides at forward"),
            (tiny(NoCallback), "differs from torch's DDP"),
            (tiny(DividedByTwo), "right on 2 ranks"),
            (tiny(LaunchAtEnd), "until backward had computed every gradient"),
            (tiny(BlockingInHook), "blocking"),
        ],
        returns,
        bad_values=(math.nan, "1.5", None),
    ),
    "05.3": Exercise(
        accumulation_step,
        [
            (lambda net, opt, mb: accumulation_step(net, opt, mb, sync_forward=True), "inside no_sync()"),
            (
                lambda net, opt, mb: accumulation_step(net, opt, mb, scale=False),
                "divide each micro-batch's loss",
            ),
            (lambda net, opt, mb: accumulation_step(net, opt, mb, step=False), "optimizer.step()"),
            (lambda net, opt, mb: [accumulation_step(net, opt, [m]) for m in mb], "not 1"),
            (lambda net, opt, mb: accumulation_step(net, opt, mb, zero="never"), "zero_grad"),
            (
                lambda net, opt, mb: accumulation_step(net, opt, mb, zero="every micro-batch"),
                "only the last micro-batch",
            ),
            (one_loss_for_all, "went through 1 backward() call"),
        ],
        step_then_fill,
        bad_values=(math.nan, math.inf, -math.inf),  # it acts in place: what it returns is not used
    ),
    "06.1": Exercise(
        epoch_orders,
        [
            (lambda n, r, w, e, s=0: epoch_orders(n, r, w, e, s, tell=False), "set_epoch(epoch) tells it"),
            (lambda n, r, w, e, s=0: epoch_orders(n, r, w, e, s, offset=r), "shards overlap"),
            (lambda n, r, w, e, s=0: [list(range(n))[r::w] for _ in range(e)], "every epoch repeats"),
            (
                lambda n, r, w, e, s=0: [sorted(o) for o in epoch_orders(n, r, w, e, s)],
                "none of this sampler's shuffles",
            ),
            (
                lambda n, r, w, e, s=0: [[str(i) for i in o] for o in epoch_orders(n, r, w, e, s)],
                "int indices",
            ),
        ],
        lambda v: returns([[v]]),
    ),
    "05.2": Exercise(
        fp16_hook,
        [
            (lambda s, b: fp16_hook(s, b, divide="never"), "twice torch's"),
            (lambda s, b: fp16_hook(s, b, cast_back=False), "in the bucket's dtype"),
            (lambda s, b: fp16_hook(s, b, divide="after"), "passes 65504"),
            (lambda s, b: fp16_hook(s, b, dtype=torch.bfloat16), "bf16_compress_hook's"),
            (lambda s, b: fp16_hook(s, b, compress=False), "nothing was compressed"),
            (lambda s, b: fp16_hook(s, b, divide="in float32"), "as accurate, but not torch's order"),
            (fp16_hook_for_two, "bit for bit on 2 ranks but not on 3"),
            (fp16_hook_blocking, "waited for its all-reduce"),
            (fp16_hook_waits, "waited for its all-reduce"),
        ],
        hook_returning,
        bad_values=(math.nan, -math.inf, "1.5"),
    ),
    "06.2": Exercise(
        checkpoint,
        [
            (lambda p, m, o, s=None: checkpoint(p, m, o, s, opt=False), "Adam's moments"),
            (lambda p, m, o, s=None: checkpoint(p, m, o, s, barrier=False), "dist.barrier()"),
            (lambda p, m, o, s=None: checkpoint(p, m, o, s, rank0=False), "Write on rank 0 only"),
            (lambda p, m, o, s=None: checkpoint(p, m, o, s, keep_step=False), "saved after 2 steps"),
            (lambda p, m, o, s=None: checkpoint(p, m, o, s, unwrap=False), "net.module.state_dict()"),
            (lambda p, m, o, s=None: checkpoint_plain_save(p, m, o, s, barrier=None), "dist.barrier()"),
            (lambda p, m, o, s=None: checkpoint_plain_save(p, m, o, s, barrier="before"), "dist.barrier()"),
            (
                lambda p, m, o, s=None: checkpoint_plain_save(p, m, o, s, guard=False, barrier=None),
                "Write on rank 0 only",
            ),
        ],
        lambda v: lambda p, m, o, s=None: checkpoint(p, m, o, s) if s is not None else v,
        bad_values=(math.nan, math.inf, "2", True),
    ),
    "06.3": Exercise(
        Script(SCRIPT_06_3),
        [
            (
                ddp_script(
                    **{"sampler=sampler": "shuffle=False", "    sampler.set_epoch(epoch)": "    pass"}
                ),
                "give the DataLoader a DistributedSampler",
            ),
            (ddp_script(**{"    sampler.set_epoch(epoch)": "    pass"}), "call sampler.set_epoch(epoch)"),
            (ddp_script(**{"ddp = DDP(model)": "ddp = model"}), "wrap the model in DistributedDataParallel"),
            (
                ddp_script(**{"        optimizer.zero_grad()": "        pass"}),
                "call optimizer.zero_grad() every step",
            ),
            (
                ddp_script(**{"torch.save(model.state_dict()": "torch.save(ddp.state_dict()"}),
                "ddp.module.state_dict()",
            ),
            (
                ddp_script(**{"import argparse": "import argparse\nfrom helpers import toys"}),
                "torch and the standard library",
            ),
            (ddp_script(**{"dist.barrier()": "raise RuntimeError('lost')"}), "RuntimeError: lost"),
            (SCRIPT_EVERY_RANK_SAVES, "rank 1 saved the weights too"),
            (
                ddp_script(
                    **{
                        "DistributedSampler(dataset, shuffle=True, seed=0)": "DistributedSampler(dataset, num_replicas=2, rank=dist.get_rank(), shuffle=True, seed=0)"
                    }
                ),
                "right on 2 ranks but not on 3",
            ),
        ],
        lambda v: v,
        bad_values=(math.nan, "1.5", None, True),
    ),
    "00.1": Exercise(
        ("nccl", 4),
        [
            (("gloo", 4), "NCCL"),
            (("nccl", 1), "one process per visible GPU"),
            (("nccl", 2), "one process per visible GPU"),
            (("mpi", 4), "NCCL"),
            ((4, "nccl"), "a name"),
            (["nccl", 4], "a tuple"),
        ],
        lambda v: ("nccl", v),
    ),
    "00.2": Exercise(
        lambda n: n * (n + 1) / 2,
        [
            (lambda n: n * (n - 1) / 2, "each contributes rank + 1"),
            (lambda n: n, "your function gives"),
            (lambda n: n * (n + 1), "your function gives"),
            (lambda n: n * n / 2, "your function gives"),
        ],
        returns,
    ),
    "07.1": Exercise(
        lambda nbytes, rate: nbytes * 8 / (rate * 1e6),
        [
            (lambda nbytes, rate: nbytes / (rate * 1e6), "8 bits"),
            (lambda nbytes, rate: 2 * nbytes * 8 / (rate * 1e6), "sends the tensor twice"),
            (lambda nbytes, rate: nbytes * 8 / (rate * 2**20), "not 2**20"),
            (lambda nbytes, rate: nbytes * 8 / rate, "take at least"),
        ],
        returns,
    ),
    "07.2": Exercise(
        lambda f, b, c, u: (f + b + c + u) / (f + max(b, c) + u),
        [
            (lambda f, b, c, u: (f + b + c + u) / (f + b + u), "only backward's share of them can hide"),
            (lambda f, b, c, u: (f + max(b, c) + u) / (f + b + c + u), "invert it"),
            (lambda f, b, c, u: (b + c) / max(b, c), "forward and the update take their time"),
            (lambda f, b, c, u: (f + b + c + u) / (f + min(b, c) + u), "not the other way"),
            (lambda f, b, c, u: min(b, c), "a ratio of step times"),
            (lambda f, b, c, u: (f + b + c + u) / (max(f + b, c) + u), "should be"),
        ],
        returns,
    ),
    "08.1": Exercise(
        lambda parameters, dtype: (
            parameters * {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}[dtype] / 1e9
        ),
        [
            (
                lambda parameters, dtype: (
                    parameters * {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}[dtype] / 2**30
                ),
                "GiB",
            ),
            (lambda parameters, dtype: parameters * 4 / 1e9, "counts 4 bytes"),
            (lambda parameters, dtype: parameters * 2 / 1e9, "take"),
            (
                lambda parameters, dtype: (
                    parameters * {"float32": 32, "bfloat16": 16, "float16": 16, "int8": 8}[dtype] / 1e9
                ),
                "take",
            ),
        ],
        returns,
    ),
    "08.2": Exercise(
        lambda model: sum({t.data_ptr(): t.numel() * t.element_size() for t in model.state_dict().values()}.values()),
        [
            (lambda model: sum(t.numel() * t.element_size() for t in model.state_dict().values()), "saved once"),
            (lambda model: sum(p.numel() for p in model.parameters()) * model.dtype.itemsize, "element size"),
            (lambda model: sum(p.numel() for p in model.parameters()) * 4, "element size"),
            (lambda model: sum(p.numel() for p in model.parameters()), "number of elements"),
            (lambda model: sum(p.nbytes for p in model.parameters()) / 1e9, "not a whole number"),
            (lambda model: 2 * sum(p.nbytes for p in model.parameters()), "not"),  # weights and gradients
        ],
        returns,
    ),
    "09.1": Exercise(
        lambda g, n, p: g // (n * p),
        [
            (lambda g, n, p: g // n, "divide by that too"),
            (lambda g, n, p: g // p, "accumulation steps are needed"),
            (lambda g, n, p: g * n * p, "accumulation steps are needed"),
            (lambda g, n, p: n * p // g, "accumulation steps are needed"),
            (lambda g, n, p: g / (n * p) + 0.5, "whole number"),
        ],
        returns,
    ),
    "09.2": Exercise(
        fill_row,
        [
            (lambda row, n, a: fill_row(row, n, a, zh=lambda tag: tag != "en"), "every other tag"),
            (lambda row, n, a: fill_row(row, n, a, count=1), "every occurrence"),
            (lambda row, n, a: fill_row(row, n, a, keys=("response",)), "fill both query and response"),
            (lambda row, n, a: fill_row(row, n[::-1], a[::-1]), "zh value"),
            (lambda row, n, a: row.update(fill_row(row, n, a)) or row, "return a copy"),
            (lambda row, n, a: {k: fill_row(row, n, a)[k] for k in ("query", "response")}, "other fields"),
        ],
        lambda v: lambda row, n, a: {**fill_row(row, n, a), "response": v},
    ),
    "09.3": Exercise(
        last_logged,
        [
            (returns((3, 0.75)), "the answer is (13, 1.0)"),
            (lambda p: last_logged(p, lambda e: int(e["global_step/max_steps"].split("/")[1])), "max_steps"),
            (lambda p: (sum("loss" in line for line in open(p)), last_logged(p)[1]), "are not steps"),
            (
                lambda p: (sum('"loss"' in line for line in open(p)), last_logged(p)[1]),
                "counts the loss lines",
            ),
            (
                lambda p: (last_logged(p)[0], min(json.loads(x).get("loss", 9) for x in open(p))),
                "the answer is",
            ),
            (lambda p: [*last_logged(p)], "a tuple"),
            (lambda p: (str(last_logged(p)[0]), last_logged(p)[1]), "an int"),
        ],
        lambda v: lambda p: (3, v),
    ),
    "09.4": Exercise(
        (0.25, True, 2.0),
        [
            ((0.25, False, 2.0), "PEFT starts every B at zero"),
            ((0.25, True, 1.0), "scaled by lora_alpha / lora_rank"),
            ((0.25, True, 4.0), "its size goes as √r"),
            ((0.25, True, 0.5), "the scale alpha / r also changes"),
            ((0.25, True, 0.25), "that is the parameters' ratio"),
            ((4.0, True, 2.0), "upside down"),
            ((1 / 16, True, 2.0), "not quadratic"),
            ((1.0, True, 2.0), "r × (in + out)"),
            ((0.25, "True", 2.0), "True or False"),
            ((0.25, True), "a tuple (trainable_ratio, same_first_loss, grad_norm_ratio)"),
        ],
        lambda v: (v, True, 2.0),
    ),
    "10.1": Exercise(
        lambda W, A, B, alpha, r: W + (alpha / r) * B @ A,
        [
            (lambda W, A, B, alpha, r: W + B @ A, "scaled by alpha / r"),
            (lambda W, A, B, alpha, r: W + (alpha // r) * B @ A, "alpha // r"),
            (lambda W, A, B, alpha, r: W + (r / alpha) * B @ A, "upside down"),
            (lambda W, A, B, alpha, r: (alpha / r) * B @ A, "update alone"),
            (lambda W, A, B, alpha, r: W + (alpha / r) * A @ B, "raised RuntimeError"),
            (lambda W, A, B, alpha, r: (W + (alpha / r) * B @ A).tolist(), "one torch tensor"),
        ],
        lambda v: (lambda W, A, B, alpha, r: W * v) if isinstance(v, float) else returns(v),
    ),
    "10.2": Exercise(
        answers_from,
        [
            (lambda p: answers_from(p, pick=0), "last user message"),
            (
                lambda p: {
                    json.loads(x)["messages"][0]["content"]: json.loads(x)["response"] for x in open(p)
                },
                "last user message",
            ),
            (lambda p: answers_from(p, keep_all=False), "one entry per line"),
            (lambda p: {q: None for q in answers_from(p)}, "its answer is `response`"),
            (lambda p: list(answers_from(p).items()), "a dict"),
        ],
        lambda v: returns({"Who are you?": v}),
    ),
    "10.3": Exercise(
        merge_scale,
        [
            (lambda b, a, m: merge_scale(b, a, m, from_weights=False), "is what adapter_config.json says"),
            (lambda b, a, m: merge_scale(b, a, m, subtract_w=False), "Subtract the base model's weight"),
            (lambda b, a, m: merge_scale(b, a, m, ratio=True), "element-wise ratio"),
            (lambda b, a, m: 1 / merge_scale(b, a, m), "is 1/s"),
            (lambda b, a, m: [merge_scale(b, a, m)], "a number of times B·A"),
            (
                lambda b, a, m: merge_scale(b, a, m) if "00001" not in str(os.listdir(b)) else 1.0,
                "the answer is 0.5",
            ),
        ],
        returns,
    ),
    "11.1": Exercise(
        N7B * parallelism.BF16_MIXED_ADAM.total / 8,
        [
            (N7B * 16, "what DDP holds"),
            (N7B * (2 + 14 / 8), "ZeRO-2"),
            (N7B * (2 + 2 + 12 / 8), "ZeRO-1"),
            (N7B * 16 / 8 / 1e9, "GB or GiB"),
            (N7B * 2 / 8 * 1.1, "use parallelism"),
        ],
        lambda v: v,
    ),
    "11.2": Exercise(
        gpus_of_rank,
        [
            (lambda r, n, p: list(range(r * n // p, (r + 1) * n // p)), "a block"),
            (lambda r, n, p: list(range(r, n, n // p)), "SWIFT gives rank"),
            (lambda r, n, p: list(range(r + 1, n + 1, p)), "SWIFT gives rank"),
            (lambda r, n, p: list(range(p - 1 - r, n, p)), "SWIFT gives rank"),
            (lambda r, n, p: tuple(range(r, n, p)), "a list of GPU ids"),
            (lambda r, n, p: [list(range(q, n, p)) for q in range(p)], "GPU ids are ints"),
        ],
        lambda v: returns([v]),
    ),
    "11.3": Exercise(
        1.5,
        [
            (1.0, "ZeRO-2"),
            (2 / 3, "DDP's bytes over ZeRO-3's"),
            (2.0, "count the weight all-gathers"),
            (3.0, "count the weight all-gathers"),
        ],
        lambda v: v,
    ),
    "11.4": Exercise(
        zero1,
        [
            (lambda p, m: zero1(p, m, keep="everything"), "has Adam states on ranks [0, 1]"),
            (lambda p, m: zero1(p, m, owner_of="index"), "balance by size"),
            (lambda p, m: zero1(p, m, source="none"), "did not move in a step"),
            (lambda p, m: zero1(p, m, source="rank 0"), "did not move in a step"),
            (lambda p, m: zero1(p, m, owner_of="a world of 2"), "is a world size written in"),
            (lambda p, m: zero1(p, m, reduce_again=True), "already averaged them"),
            (lambda p, m: zero1(p, m, build="every step"), "starts its moments from zero"),
            (zero1_own_adam, "no rank built an optimizer with make_optimizer"),
        ],
        returns,
    ),
    "12.1": Exercise(
        reentrant,
        [
            (lambda kw, n, ds, fs: not (n is not None and not ds and not fs), "passes that value on"),
            (
                lambda kw, n, ds, fs: (kw or {}).get(
                    "use_reentrant", not (n and n > 1 and not ds and not fs)
                ),
                "NPROC_PER_NODE=1 still starts torchrun",
            ),
            (lambda kw, n, ds, fs: (kw or {}).get("use_reentrant", n is None), "with DeepSpeed or FSDP"),
            (lambda kw, n, ds, fs: False, "passes that value on"),
            (lambda kw, n, ds, fs: not reentrant(kw, n, ds, fs), "under plain DDP"),
            (lambda kw, n, ds, fs: kw.get("use_reentrant", n is None), "raised AttributeError"),
            (lambda kw, n, ds, fs: str(reentrant(kw, n, ds, fs)), "True or False"),
            (lambda kw, n, ds, fs: int(reentrant(kw, n, ds, fs)), "True or False"),
        ],
        returns,
    ),
    "12.2": Exercise(
        ckpt,
        [
            (lambda n, lm, im, c: n * lm, "only each layer's input"),
            (lambda n, lm, im, c: n * im if c else n * lm, "holds its layer_mb too"),
            (lambda n, lm, im, c: (n - 1) * im + lm if c else n * lm, "the recomputed one's included"),
            (lambda n, lm, im, c: n * lm if c else n * im + lm, "expected"),
            (lambda n, lm, im, c: None if c else n * lm, "returned None"),
        ],
        returns,
    ),
    "12.3": Exercise(
        stuck,
        [
            (lambda st: stuck(st, first_only=True), "not only the first"),
            (lambda st: stuck(st, only="all_reduce "), "barrier, broadcast"),
            (lambda st: stuck(st)[::-1], "swapped"),
            (lambda st: stuck(st, ranks="positions"), "keys are the ranks"),
            (lambda st: tuple(sorted(ranks) for ranks in stuck(st)), "a set of ranks"),
            (lambda st: stuck(st)[1], "a pair"),
            (returns(({0}, {1})), "expected"),
        ],
        lambda v: returns(({v}, {1})),
    ),
    "12.4": Exercise(
        dict(zip(FORCED_CHANGES, ["trains", "fails", "trains", "trains"], strict=True)),
        [
            (
                dict(zip(FORCED_CHANGES, ["trains", "trains", "trains", "trains"], strict=True)),
                "still sit inside",
            ),
            (
                dict(zip(FORCED_CHANGES, ["fails", "fails", "trains", "trains"], strict=True)),
                "marks nothing ready",
            ),
            (dict(zip(FORCED_CHANGES, ["trains", "fails", "fails", "trains"], strict=True)), "no DDP"),
            (
                dict(zip(FORCED_CHANGES, ["trains", "fails", "trains", "fails"], strict=True)),
                "one ordinary graph",
            ),
            (dict(zip(FORCED_CHANGES[:3], ["trains", "fails", "trains"], strict=True)), "missing"),
            (dict(zip(FORCED_CHANGES, [True, False, True, True], strict=True)), '"trains" or "fails"'),
            (list(zip(FORCED_CHANGES, ["trains", "fails", "trains", "trains"], strict=True)), "a dict"),
        ],
        lambda v: {change: v for change in FORCED_CHANGES} if v is not None else None,
    ),
}
FUNCTION_EXERCISES = {k for k, e in EXERCISES.items() if callable(e.solution)}
ON_RANKS = {"00.3", "03.2", "04.3", "03.3", "05.1", "05.3", "05.2", "06.2", "06.3", "06.4", "11.4"}


# Right answers written another way than the solution: each must pass as well.
ALSO_RIGHT = {
    "06.4": [evaluate_split_by_hand, evaluate_by_gathering],
    "06.3": [SCRIPT_BY_HAND_BATCHES, SCRIPT_RANK_FROM_ENVIRONMENT],
    "06.2": [checkpoint_plain_save, checkpoint_as_tuple],
    "06.1": [epoch_orders_told_at_the_end, lambda n, r, w, e, s=0: epoch_orders(n, r, w, e, s, offset=1)],
    "05.3": [accumulation_with_ifs, accumulation_with_exit_stack],
    "05.1": [tiny(SumThenDivide), PlainReducer],
    "05.2": [fp16_hook_half, fp16_hook_new_tensor],
    "04.3": [average_hook_after, average_hook_in_buffer],
    "03.2": [in_two_into_tensors, in_two_async],
    "03.3": [ring_blocking_by_parity, ring_isend_irecv],
    "00.3": [summarize_in_one_tensor, summarize_by_gathering],
    "02.4": [
        lambda batch, k: [len(part) for part in torch.arange(batch).chunk(k)],
        lambda batch, k: (lambda size: [size] * (batch // size) + ([batch % size] if batch % size else []))(
            math.ceil(batch / k)
        ),
    ],
    "08.2": [
        lambda model: sum(p.nbytes for p in model.parameters()),  # parameters() already lists a tied one once
        lambda model: sum(
            t.untyped_storage().nbytes()
            for t in {t.untyped_storage().data_ptr(): t for t in model.state_dict().values()}.values()
        ),
    ],
    "07.2": [
        lambda f, b, c, u: 1 + min(b, c) / (f + max(b, c) + u),  # the saving over the overlapped step
        lambda forward, backward, comm, update: (
            sum((forward, backward, comm, update))
            / (forward + update + (comm if comm > backward else backward))
        ),
    ],
    "09.4": [
        (2 / 8, 1 == 1.0, (32 / 2) / (32 / 8) * math.sqrt(2 / 8)),  # computed from the formulas: exactly 2
        (1 / 4, bool(torch.tensor(1.3341) == torch.tensor(1.3341)), 2.07),  # a measured ratio, as SWIFT logged it
    ],
    "10.3": [merge_scale_by_lstsq, merge_scale_median_of_layers],
    "11.4": [zero1_contiguous, Zero1ByBytes],
}


def verdict(capsys, exercise, answer):
    ok = check(exercise, answer)
    return bool(ok), capsys.readouterr().out


def test_every_registered_exercise_has_tests():
    assert sorted(EXERCISES) == exercises.registered(), "add the new exercise's solution and mistakes here"
    for name, ex in EXERCISES.items():
        assert len(ex.wrong) >= 4, name


def worlds_launched(monkeypatch) -> list[int]:
    """The numbers of ranks the exercises' checkers launch from now on, in order (on_ranks and torchrun)."""
    from helpers import launching
    from helpers.exercises import nb03, nb04, nb05, nb06

    worlds = []

    def recording(real):
        def run(fn, world=2, *args, **kwargs):
            worlds.append(world)
            return real(fn, world, *args, **kwargs)

        return run

    for module in (nb03, nb04, nb05):
        monkeypatch.setattr(module, "on_ranks", recording(exercises.on_ranks))
    monkeypatch.setattr(nb06.exercises, "on_ranks", recording(exercises.on_ranks))
    real_torchrun = launching.torchrun
    monkeypatch.setattr(
        launching,
        "torchrun",
        lambda *a, nproc=2, **k: (worlds.append(nproc), real_torchrun(*a, nproc=nproc, **k))[1],
    )
    return worlds


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_solution_passes_and_wrong_answers_fail_saying_why(name, capsys, monkeypatch):
    """And an on-ranks checker runs the solution on 2 ranks and on 3 (the ring, whose structure changes with the
    number of ranks, and 06.4 on 4 too): a hook or script right on 2 ranks only (a world size written in) must
    not pass."""
    ex = EXERCISES[name]
    worlds = worlds_launched(monkeypatch)
    ok, out = verdict(capsys, name, ex.solution)
    assert ok, out
    if name in ON_RANKS:
        assert sorted(set(worlds)) == ([2, 3, 4] if name in ("03.3", "06.4") else [2, 3]), (name, worlds)
    else:
        assert worlds == [], (name, worlds)
    for i, (answer, fragment) in enumerate(ex.wrong):
        if name == "01.1" and fragment is None:
            continue  # a float32 answer is right, see test_dtype_tolerant
        ok, out = verdict(capsys, name, answer)
        assert not ok and "❌ not yet" in out, (name, i, out)
        assert "not answered yet" not in out and "could not be checked" not in out, (name, i, out)
        if fragment:
            assert fragment in out, (name, i, fragment, out)


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_nan_infinities_strings_none_bools_and_exceptions_never_pass(name, capsys):
    ex = EXERCISES[name]
    for value in ex.bad_values:
        answer = ex.embed(value)
        ok, out = verdict(capsys, name, answer)
        if answer is None:  # a value exercise: None is the placeholder
            assert (
                out == f"Exercise {name}: not answered yet. Replace the placeholder and run the cell again.\n"
            )
            continue
        assert not ok and "❌ not yet" in out, (name, value, out)
        assert "not answered yet" not in out and "could not be checked" not in out, (name, value, out)
    if name in FUNCTION_EXERCISES:
        ok, out = verdict(capsys, name, _raises)
        assert not ok and "ValueError: boom" in out, (name, out)  # "raised" here, "rank r failed" on ranks
        assert out.count("\n") == 1, out  # one line, naming the call that raised


@pytest.mark.parametrize(
    "name, i", [(name, i) for name, answers in sorted(ALSO_RIGHT.items()) for i in range(len(answers))]
)
def test_right_answers_written_another_way_pass(name, i, capsys):
    ok, out = verdict(capsys, name, ALSO_RIGHT[name][i])
    assert ok and "✅ correct" in out, (name, i, out)


def test_every_on_ranks_exercise_has_two_right_answers_written_another_way():
    assert {name for name in ON_RANKS if len(ALSO_RIGHT.get(name, ())) >= 2} == ON_RANKS


def test_a_deadlocked_ring_is_named_within_seconds(capsys):
    import time

    start = time.monotonic()
    ok, out = verdict(capsys, "03.3", ring_send_first)
    assert not ok and "dist.send to rank" in out and "gloo's send returns only once" in out, out
    assert time.monotonic() - start < 20, out


def test_dtype_tolerant(capsys):
    assert check("01.1", lambda g, s: combine(g, s).float())  # a float32 gradient of a float64 question
    assert check("10.1", lambda W, A, B, alpha, r: (W + (alpha / r) * B @ A).double())
    assert check("10.1", lambda W, A, B, alpha, r: (W + (alpha / r) * B @ A).half()) is not None  # no crash
    assert check("11.1", str) is not None and "a number of bytes" in capsys.readouterr().out


def test_the_placeholder_is_not_answered_but_a_none_on_some_inputs_is_wrong(capsys):
    def placeholder(k, weight_bytes): ...

    def documented(k, weight_bytes):
        """My answer."""
        ...

    for stub in (placeholder, documented):
        ok, out = verdict(capsys, "02.1", stub)
        assert not ok and out.startswith("Exercise 02.1: not answered yet"), out
    ok, out = verdict(capsys, "02.1", lambda k, w: (k - 1) * w if k > 1 else None)
    assert not ok and "(1, 4) returned None" in out and "return" in out, out
    ok, out = verdict(capsys, "01.2", None)
    assert out.startswith("Exercise 01.2: not answered yet"), out


def test_a_distributed_exercise_left_as_a_stub_is_not_answered_at_once_and_a_missing_return_is_named(capsys):
    def stub(*args): ...

    for name in sorted(ON_RANKS):
        assert not check(name, stub)
    assert capsys.readouterr().out.count("not answered yet") == len(ON_RANKS)
    assert check("05.3", lambda net, optimizer, micro: accumulation_step(net, optimizer, micro) or "done")

    def forgot_return(tensor):
        in_two(tensor)

    ok, out = verdict(capsys, "03.2", forgot_return)
    assert not ok and "returned None" in out and "not answered yet" not in out, out


def test_the_learners_function_cannot_break_the_process(capsys, tmp_path):
    """Streams replaced and restored, fds 0-2 and the working directory restored, whatever it does."""
    here, stdout = os.getcwd(), sys.stdout

    def closes_everything(k):
        print("debugging output")
        sys.stdout.close()
        os.chdir(tmp_path)
        with open(k, "rb") as handle:  # k = 1: opens fd 1 and closes it on the way out
            return handle.read()

    ok, out = verdict(capsys, "02.3", closes_everything)
    assert not ok and "closes_everything(1) returned" in out and "debugging output" not in out, out
    assert os.getcwd() == here and sys.stdout is stdout and not sys.stdout.closed
    os.fstat(1)  # still open
    print("still printing")
    assert "still printing" in capsys.readouterr().out

    def exits(k):
        sys.exit(3)

    ok, out = verdict(capsys, "02.3", exits)
    assert not ok and "raised SystemExit: 3" in out, out


def test_close_and_number_fail_closed():
    close, Wrong = exercises.close, exercises.Wrong
    assert close(1.0, 1.0 + 1e-12) and close([1.0, 2.0], (1.0, 2.0))
    for bad in (math.nan, math.inf, -math.inf, "1.0", True, None, [1.0]):
        assert not close(bad, 1.0) and not close(1.0, bad)
    assert not close(math.inf, math.inf)
    assert exercises.number(torch.tensor(2.5), "x is", "GB") == 2.5
    with pytest.raises(Wrong, match=r"x is 'abc' \(text, not a number\); the answer is a number of GB"):
        exercises.number("abc", "x is", "GB")
    with pytest.raises(Wrong, match="not a whole number of bytes"):
        exercises.integer(2.5, "x is", "bytes")
    assert exercises.integer(10**30, "x is", "bytes") == 10**30


def test_a_solution_cell_prints_only_that_it_passes(capsys):
    assert check("03.1", ring, solution=True)
    assert capsys.readouterr().out == "Exercise 03.1: ✅ the reference solution passes the checker.\n"
    assert not check("03.1", lambda nbytes, n, alpha, beta: 0.0, solution=True)  # a broken one still says why
    assert "not yet" in capsys.readouterr().out


def test_verdicts_of_a_registered_test_checker(capsys):
    @checker("test.1")
    def _double(fn):
        return fn(2) == 4, "twice two is four"

    assert check("test.1", lambda x: 2 * x)
    assert not check("test.1", lambda x: x + 1)
    assert not check("test.1", None)
    assert not check("test.1", "not a function")  # a wrong type is feedback, not a crash
    out = capsys.readouterr().out
    assert "✅ correct. twice two is four" in out and "not answered yet" in out
    assert out.count("❌ not yet") == 2
    del exercises._CHECKERS["test.1"]


# --- the committed notebooks ---------------------------------------------------------------------------

# Names a solution cell takes from the notebook's earlier cells, given here without running them: the
# modules it imports, and a stand-in for one result of a run (01's parameter count).
NOTEBOOK_STATE = {
    "check": check,
    "torch": torch,
    "dist": dist,
    "F": F,
    "contextlib": contextlib,
    "json": json,
    "Path": Path,
    "safe_open": safe_open,
    "DistributedSampler": DistributedSampler,
    "par": parallelism,
    "parallelism": parallelism,
    "dataparallel": dataparallel,
    "bucketing": bucketing,
    "collective": collective,
    "comm_hooks": comm_hooks,
    "toys": toys,
    "bytecount": bytecount,
    "exercises": exercises,
    "sampling": sampling,
    "checkpoints": checkpoints,
    "dp_costs": dp_costs,
    "swiftcli": swiftcli,
    "disk": disk,
    "training": training,
    "environment": environment,
    "selfcog": selfcog,
    "answering": answering,
    "sft": sft,
    "lora": lora,
    "scoring": scoring,
    "web": web,
    "inference": inference,
    "sharding": sharding,
    "devicemap": devicemap,
    "troubleshooting": troubleshooting,
    "counts": {"Qwen2.5-7B-Instruct": N7B},  # section 5 counts it on the meta device
}
STARTS_WRONG = {"06.1": "set_epoch(epoch) tells it"}  # "fix a script": the learner cell holds the bug
# results of the notebook's own run, which a statement of a solution cell that names them needs
RUN_ONLY = {"trace", "K_MAX", "model", "TOTAL_STEPS", "ACCUM", "ref0", "alpha_r"}


@dataclass
class Met:
    """An exercise as a learner meets it in its notebook: the code cells before it is asked, the code cells
    that answer it (06.3: a skeleton, then the cell that calls check), its solution cell, every cell after."""

    name: str
    before: list
    learner: list
    solution: str
    later: list


def exercises_as_met() -> list:
    """Every exercise of every notebook, in the order a learner meets them."""
    import nbformat

    from course.runner import course_notebooks

    met = []
    for path in course_notebooks():
        cells = nbformat.read(path, as_version=4).cells
        for i, cell in enumerate(cells):
            asked = (
                STATED.search(cell.source) if cell.cell_type == "markdown" else None
            )  # **NN.M** *(about N min)*
            if not asked:
                continue
            code = [c for c in cells[i:] if c.cell_type == "code"]
            k = next(k for k, c in enumerate(code) if "solution" in c.metadata.get("tags", []))
            before = [c.source for c in cells[:i] if c.cell_type == "code"]
            met.append(
                Met(
                    asked[1],
                    before,
                    [c.source for c in code[:k]],
                    code[k].source,
                    [c.source for c in cells[i:]],
                )
            )
    return met


def test_every_exercise_is_met_once_with_its_solution():
    met = exercises_as_met()
    assert [m.name for m in met] == sorted(
        {m.name for m in met}, key=[m.name for m in met].index
    )  # no repeats
    assert sorted(m.name for m in met) == exercises.registered()
    for m in met:
        assert f'check("{m.name}"' in m.learner[-1] and f'check("{m.name}"' in m.solution, m.name


def solution_cases():
    """(exercise, its learner cell, its solution cell, the %%writefile scripts met so far by name)."""
    for m in exercises_as_met():
        scripts = {c.partition("\n")[0].split("/")[-1].strip(): c.partition("\n")[2]
                   for c in m.before + m.learner if c.startswith("%%writefile")}  # fmt: skip
        yield pytest.param(m.name, m.learner[-1], m.solution, scripts, id=m.name)


@pytest.mark.parametrize("name, learner, solution, scripts", list(solution_cases()))
def test_notebook_solutions_pass_and_untouched_placeholders_are_not_answered(
    name, learner, solution, scripts, capsys
):
    """The learner cell as committed, then the solution cell statement by statement; a statement about the
    notebook's own run (a name in RUN_ONLY, e.g. 02.1's comparison with the traced bytes) is skipped. The
    notebook's %%writefile scripts so far are in SCRIPTS, as the notebook's run writes them."""
    import ast

    namespace = dict(NOTEBOOK_STATE, SCRIPTS=paths.run_dir("scripts"))
    for script, text in scripts.items():
        (namespace["SCRIPTS"] / script).write_text(text)
    exec(compile(learner, f"<{name} learner cell>", "exec"), namespace)
    out = capsys.readouterr().out
    if name in STARTS_WRONG:
        assert "❌ not yet" in out and STARTS_WRONG[name] in out, out
    else:
        assert out == f"Exercise {name}: not answered yet. Replace the placeholder and run the cell again.\n"
    checked = 0
    for node in ast.parse(solution).body:
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if names & RUN_ONLY:
            assert "check" not in names, ast.unparse(node)  # the check itself never needs the run
            continue
        exec(compile(ast.Module([node], []), f"<{name} solution cell>", "exec"), namespace)
        checked += "check" in names
    assert checked == 1
    assert capsys.readouterr().out == f"Exercise {name}: ✅ the reference solution passes the checker.\n"


# Where a lesson's own code holds an exercise's answer: text that no code cell may hold before the exercise
# is asked (the scripts its cells write included). Each must still occur in the notebook after it.
ANSWER_HOLDERS = {
    "03.3": ["def ring_all_reduce("],  # the course's ring, in ring_by_hand.py
    "04.1": ["bucketing.expected_buckets(", "bucketing.predict_buckets("],  # torch's bucket rule
    "05.1": ["class TinyDDP"],  # the course's TinyDDP, in tiny_ddp.py
    "09.2": ["selfcog.fill_placeholders("],  # SWIFT's placeholders, filled
}
BOILERPLATE = (
    4  # a script written from scratch (06.3) may share up to a quarter of its lines with the lesson's
)


def _lines(source: str) -> list[str]:
    """The lines of ``source`` that say something: not short, not a comment, a def, an import or a check."""
    lines = [" ".join(line.split()) for line in source.splitlines()]
    skip = ("#", "def ", "return ", '"""', "import ", "from ", "assert check(", "check(")
    return [line for line in lines if len(line) >= 25 and not line.startswith(skip)]


@pytest.mark.parametrize("name, before, learner, solution, later",
                         [pytest.param(m.name, m.before, "\n".join(m.learner), m.solution, m.later, id=m.name) for m in exercises_as_met()])  # fmt: skip
def test_no_exercise_is_answered_before_it_is_asked(name, before, learner, solution, later):
    earlier = "\n".join(before)
    for fn in re.findall(r"^def (\w+)\(", learner, flags=re.M):
        assert f"def {fn}(" not in earlier, f"{name}: a cell before the exercise defines {fn}, the answer"
    seen = {" ".join(line.split()) for line in earlier.splitlines()}
    key = _lines(solution)
    shown = [line for line in key if line in seen]
    assert len(shown) * BOILERPLATE <= len(key), (
        f"{name}: the solution's lines are on the page before it: {shown}"
    )
    flat = " ".join(earlier.split())
    for returned in re.findall(r"^\s*return (.+?)(?:\s+#.*)?$", solution, flags=re.M):  # a one-line answer
        returned = " ".join(returned.split())
        assert len(returned) < 10 or returned not in flat, (
            f"{name}: `{returned}`, the answer, is on the page before it"
        )
    for text in ANSWER_HOLDERS.get(name, []):
        assert text not in earlier, f"{name}: `{text}` holds the answer and runs before the exercise is asked"
        assert text in "\n".join(later), (
            f"{name}: `{text}` is no longer in the notebook: update ANSWER_HOLDERS"
        )


def test_the_order_check_catches_an_answer_shown_first():
    """The check above, fed answers as they once stood: 03.3's ring in the script of section 1, 00.2's formula in
    section 4's check, 09.2's placeholders filled, each before its exercise."""
    [met] = [m for m in exercises_as_met() if m.name == "03.3"]
    learner, solution, later = "\n".join(met.learner), met.solution, met.later
    script = next(text for text in later if "def ring_all_reduce(" in text and text.startswith("%%writefile"))
    with pytest.raises(AssertionError, match="defines ring_all_reduce"):
        test_no_exercise_is_answered_before_it_is_asked("03.3", [script], learner, solution, later)
    with pytest.raises(AssertionError, match="on the page before it"):  # the solution's own lines, renamed
        test_no_exercise_is_answered_before_it_is_asked(
            "03.3", [solution.replace("_solution(", "_ref(")], "", solution, later
        )
    with pytest.raises(
        AssertionError, match="the answer, is on the page"
    ):  # 00's check printed 00.2's formula
        test_no_exercise_is_answered_before_it_is_asked(
            "00.2",
            ["assert [r['sum'] for r in hello.results] == [n * (n + 1) / 2] * n"],
            "",
            "def f(n):\n    return n * (n + 1) / 2",
            [],
        )
    with pytest.raises(AssertionError, match="fill_placeholders"):
        test_no_exercise_is_answered_before_it_is_asked(
            "09.2", ["selfcog.fill_placeholders(r, name, author)"], "", "", later
        )


def test_every_exercise_states_its_minutes_and_has_a_hint_the_student_copy_keeps():
    import nbformat

    from course import student
    from course.runner import course_notebooks

    asked = {}
    for path in course_notebooks():
        for cell in student.student_copy(nbformat.read(path, as_version=4)).cells:
            found = STATED.search(cell.source) if cell.cell_type == "markdown" else None
            if found:
                asked[found[1]] = cell.source
    assert sorted(asked) == exercises.registered()
    without = [
        name for name, text in asked.items() if not re.search(r"<details><summary>Hint</summary>\n\n\S", text)
    ]
    assert not without, f"exercises without a hint: {without}"


def test_08_2_checker_saves_the_tensor_bytes_that_save_pretrained_writes(tmp_path):
    """08.2's checker saves with safetensors' save_model (no progress bar, no DeepSpeed import); the lesson
    asks about the files save_pretrained writes: for every model it builds, the tensor bytes must agree."""
    from helpers.exercises import nb08

    for said, model, on_disk in nb08._saved_models():
        folder = tmp_path / said.replace(" ", "_").replace(",", "")
        model.save_pretrained(folder)
        raw = (folder / "model.safetensors").read_bytes()
        assert len(raw) - 8 - int.from_bytes(raw[:8], "little") == on_disk, said
