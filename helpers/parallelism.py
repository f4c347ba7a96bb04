"""Data parallelism (数据并行) simulated in one process: shards, gradient averaging, all-reduce traffic, memory.

Every worker here is a plain Python object in this process, so each step can be checked exactly:
a worker holds a full model copy (模型副本), takes one shard of the batch and computes its gradient;
the gradients are then combined by a simulated network that counts the bytes each send moves.
The bytes-per-parameter figures of section 5 (``FP32_ADAM``, ``BF16_MIXED_ADAM``) are reused by the
ZeRO lesson.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers import toys

# --- 1. shards and their gradients ---------------------------------------------------------------


def make_classification(samples: int, features: int = 8, classes: int = 3, seed: int = 0):
    """A synthetic classification set (x float64, y class ids) that a small MLP can learn."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen, dtype=torch.float64)
    centres = torch.randn(classes, features, generator=gen, dtype=torch.float64)
    y = (x @ centres.T + 0.5 * torch.randn(samples, classes, generator=gen, dtype=torch.float64)).argmax(1)
    return x, y


def mlp(features: int = 8, hidden: int = 32, classes: int = 3, seed: int = 0, batchnorm: bool = False):
    """Notebook 01's float64 model (optionally with BatchNorm after the first layer), same weights for a seed."""
    widths = [features, hidden, hidden, classes]
    return toys.mlp(widths, activation=nn.Tanh, batchnorm=batchnorm, seed=seed, dtype=torch.float64)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters())


def replicate(model: nn.Module, workers: int) -> list[nn.Module]:
    """``workers`` full, independent copies of ``model`` (模型副本), one per simulated worker."""
    return [copy.deepcopy(model) for _ in range(workers)]


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    """True when two models hold bit-for-bit identical parameters and buffers."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters of ``model`` as one flat vector (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def shard(tensor: torch.Tensor, workers: int, sizes: list[int] | None = None) -> list[torch.Tensor]:
    """Split along the batch dimension: into ``workers`` near-equal shards, or into the given ``sizes``."""
    if sizes is not None:
        return list(torch.split(tensor, sizes))
    return list(torch.tensor_split(tensor, workers))


def gradient(model: nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of ``loss_fn(model(x), y)`` as one flat vector; ``model``'s own .grad is untouched."""
    params = list(model.parameters())
    grads = torch.autograd.grad(loss_fn(model(x), y), params)
    return torch.cat([g.reshape(-1) for g in grads])


@dataclass
class Workers:
    """What a round of simulated workers produced: their replicas, shard sizes and flat gradients."""

    replicas: list[nn.Module]
    sizes: list[int]
    grads: list[torch.Tensor] = field(repr=False)

    def mean(self) -> torch.Tensor:
        """Plain average of the workers' gradients: what DDP's all-reduce (then divide by N) computes."""
        return torch.stack(self.grads).mean(0)

    def weighted_mean(self) -> torch.Tensor:
        """Average weighted by shard size: right for mean losses over shards of unequal size."""
        return sum(n * g for n, g in zip(self.sizes, self.grads, strict=True)) / sum(self.sizes)

    def total(self) -> torch.Tensor:
        """Sum of the workers' gradients (what the all-reduce itself returns, before any division)."""
        return torch.stack(self.grads).sum(0)


def _is_batchnorm(layer: nn.Module) -> bool:
    return isinstance(layer, nn.modules.batchnorm._BatchNorm)


def synced_statistics(shards: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-batch mean and (biased) variance from per-worker (count, sum, sum of squares), summed like an all-reduce."""
    count = sum(h.shape[0] for h in shards)
    total = sum(h.sum(0) for h in shards)
    squares = sum((h * h).sum(0) for h in shards)
    mean = total / count
    return mean, squares / count - mean * mean


def _sync_batchnorm(layers, shards):
    """Normalise every shard with statistics synchronised over all shards (a simulated SyncBatchNorm)."""
    mean, var = synced_statistics(shards)
    count = sum(h.shape[0] for h in shards)
    out = []
    for layer, h in zip(layers, shards, strict=True):
        with torch.no_grad():  # running statistics, updated as nn.BatchNorm1d would on the full batch
            m = layer.momentum
            layer.running_mean.mul_(1 - m).add_(m * mean)
            layer.running_var.mul_(1 - m).add_(m * var * count / (count - 1))
            layer.num_batches_tracked += 1
        out.append((h - mean) / torch.sqrt(var + layer.eps) * layer.weight + layer.bias)
    return out


def simulate(
    model: nn.Module,
    loss_fn: Callable,
    x: torch.Tensor,
    y: torch.Tensor,
    workers: int,
    *,
    sizes: list[int] | None = None,
    sync_batchnorm: bool = False,
) -> Workers:
    """Copy ``model`` to each worker, give each one shard of (x, y), and compute each worker's gradient.

    Without ``sync_batchnorm`` every worker runs alone (as in plain DDP). With it, the workers run an
    ``nn.Sequential`` layer by layer in lockstep and every BatchNorm uses statistics over all shards;
    the backward pass then goes through those shared statistics, as SyncBatchNorm's backward all-reduce does.
    """
    if sizes is not None and len(sizes) != workers:
        raise ValueError(f"{len(sizes)} shard sizes for {workers} workers")
    replicas = replicate(model, workers)
    xs, ys = shard(x, workers, sizes), shard(y, workers, sizes)
    if not sync_batchnorm:
        grads = [gradient(r, loss_fn, xk, yk) for r, xk, yk in zip(replicas, xs, ys, strict=True)]
        return Workers(replicas, [len(xk) for xk in xs], grads)
    if not all(isinstance(r, nn.Sequential) for r in replicas):
        raise TypeError("sync_batchnorm needs an nn.Sequential model (it steps through the layers)")
    hs = xs
    for layers in zip(*replicas, strict=True):  # the same layer of every replica
        hs = (
            _sync_batchnorm(layers, hs)
            if _is_batchnorm(layers[0])
            else [f(h) for f, h in zip(layers, hs, strict=True)]
        )
    losses = [loss_fn(h, yk) for h, yk in zip(hs, ys, strict=True)]
    params = [p for r in replicas for p in r.parameters()]
    flat = torch.cat([g.reshape(-1) for g in torch.autograd.grad(sum(losses), params)])
    grads = list(flat.split(count_parameters(model)))
    return Workers(replicas, [len(xk) for xk in xs], grads)


def batchnorm_means(workers: Workers) -> list[torch.Tensor]:
    """The running mean of the first BatchNorm layer in every replica."""
    return [next(m for m in r.modules() if _is_batchnorm(m)).running_mean.clone() for r in workers.replicas]


# --- 2. combining gradients: a network that counts bytes ------------------------------------------


class Network:
    """Simulated workers, each with one full-duplex link; counts the bytes each worker sends and receives."""

    def __init__(self, workers: int):
        self.workers = workers
        self.sent = [0] * workers
        self.received = [0] * workers
        self.pairs: Counter = Counter()  # (src, dst) -> bytes
        self.messages = 0

    def send(self, src: int, dst: int, tensor: torch.Tensor) -> torch.Tensor:
        """Move ``tensor`` from worker ``src`` to ``dst``: count its bytes on both links, return dst's copy."""
        if src == dst:
            raise ValueError("a worker does not send to itself")
        nbytes = tensor.numel() * tensor.element_size()
        self.sent[src] += nbytes
        self.received[dst] += nbytes
        self.pairs[src, dst] += nbytes
        self.messages += 1
        return tensor.clone()

    @property
    def busiest_link(self) -> int:
        """Bytes on the busiest link in its busier direction (the one that sets the time)."""
        return max(max(self.sent), max(self.received))

    @property
    def total(self) -> int:
        """Bytes moved over the whole network (each message counted once)."""
        return sum(self.sent)


def parameter_server_all_reduce(grads: list[torch.Tensor], net: Network) -> list[torch.Tensor]:
    """The original tutorial's scheme: every worker sends its gradient to GPU0, which sums them (累加) and broadcasts (广播) the sum."""
    total = grads[0].clone()
    for k in range(1, len(grads)):
        total += net.send(k, 0, grads[k])
    return [total] + [net.send(0, k, total) for k in range(1, len(grads))]


def ring_all_reduce(grads: list[torch.Tensor], net: Network) -> list[torch.Tensor]:
    """Ring all-reduce (环形全规约): N-1 reduce-scatter steps then N-1 all-gather steps, one chunk per step."""
    n = len(grads)
    chunks = [list(torch.tensor_split(g.clone(), n)) for g in grads]  # chunks[worker][chunk]
    for step in range(n - 1):  # reduce-scatter: pass a partial sum to the right, which adds its own
        moves = [(w, (w - step) % n) for w in range(n)]
        arrived = [net.send(w, (w + 1) % n, chunks[w][c]) for w, c in moves]
        for (w, c), data in zip(moves, arrived, strict=True):
            chunks[(w + 1) % n][c] = chunks[(w + 1) % n][c] + data
    # now worker w holds the complete sum of chunk (w + 1) % n
    for step in range(n - 1):  # all-gather: pass the complete chunks round the ring
        moves = [(w, (w + 1 - step) % n) for w in range(n)]
        arrived = [net.send(w, (w + 1) % n, chunks[w][c]) for w, c in moves]
        for (w, c), data in zip(moves, arrived, strict=True):
            chunks[(w + 1) % n][c] = data
    return [torch.cat(c) for c in chunks]


SCHEMES = {"parameter server (tutorial: GPU0)": parameter_server_all_reduce, "ring all-reduce": ring_all_reduce}


def parameter_server_formula(workers: int, model_bytes: int) -> float:
    """Busiest link of the original tutorial's scheme: GPU0 receives (N-1) gradients and sends (N-1) copies."""
    return (workers - 1) * model_bytes


def ring_formula(workers: int, model_bytes: int) -> float:
    """Bytes each ring worker sends (and receives): 2(N-1)/N times the model's gradient bytes."""
    return 2 * (workers - 1) * model_bytes / workers


def fixed_batch_step(workers: int, batch: int, sample_s: float, grad_bytes: float, link_bps: float,
                     latency_s: float) -> dict:
    """A model of one step at a fixed global batch, not a measurement: each worker computes batch/N samples
    (``sample_s`` seconds each), then a ring all-reduce sends 2(N-1)/N of the gradient over its link in
    2(N-1) messages of ``latency_s`` each. Returns the seconds of compute, of communication and in all."""
    compute = sample_s * batch / workers
    comm = 0.0 if workers == 1 else ring_formula(workers, grad_bytes) / link_bps + 2 * (workers - 1) * latency_s
    return {"workers": workers, "compute s": compute, "all-reduce s": comm, "step s": compute + comm}


def traffic(
    scheme: Callable, workers: int, numel: int, dtype=torch.float32, device="cpu", seed: int = 0
) -> dict:
    """Run one all-reduce of random gradients over a fresh counting Network; report its bytes and result."""
    if str(device) == "meta":
        grads = [torch.empty(numel, dtype=dtype, device="meta") for _ in range(workers)]
    else:
        gen = torch.Generator().manual_seed(seed)
        grads = [torch.randn(numel, generator=gen).to(dtype) for _ in range(workers)]
    net = Network(workers)
    results = scheme(grads, net)
    return {
        "workers": workers,
        "model_bytes": numel * grads[0].element_size(),
        "busiest_link": net.busiest_link,
        "total": net.total,
        "messages": net.messages,
        "network": net,
        "grads": grads,
        "results": results,
    }


def traffic_table(workers_range, numel: int, dtype=torch.float32) -> list[dict]:
    """Simulate both schemes for every N: bytes counted on the busiest link and over the whole network."""
    rows = []
    for n in workers_range:
        ps = traffic(parameter_server_all_reduce, n, numel, dtype)
        ring = traffic(ring_all_reduce, n, numel, dtype)
        rows.append(
            {
                "N": n,
                "model_bytes": ps["model_bytes"],
                "ps_busiest": ps["busiest_link"],
                "ring_busiest": ring["busiest_link"],
                "ps_total": ps["total"],
                "ring_total": ring["total"],
            }
        )
    return rows


# --- 3. one worker versus N workers, training -----------------------------------------------------


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    workers: int,
    steps: int,
    batch: int,
    lr: float = 1e-2,
    all_reduce: Callable = ring_all_reduce,
    loss_fn: nn.Module | None = None,
    optimizer: Callable = torch.optim.Adam,
) -> dict:
    """Train copies of ``model`` with ``workers`` simulated workers (1 = ordinary training).

    Each step takes the next ``batch`` samples, splits them into equal shards, lets each worker
    compute its gradient, all-reduces the gradients and divides by N, and lets every worker step
    its own optimizer (Adam unless ``optimizer`` says otherwise; as in DDP, 每个进程都有独立的优化器).
    ``loss_fn`` defaults to a mean cross-entropy. Returns losses and the replicas.
    """
    if batch % workers or len(x) % batch:
        raise ValueError(
            f"need batch ({batch}) divisible by workers ({workers}) and samples ({len(x)}) by batch"
        )
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    replicas = replicate(model, workers)
    optimizers = [optimizer(r.parameters(), lr=lr) for r in replicas]
    net = Network(workers)
    losses = []
    for step in range(steps):
        start = (step * batch) % len(x)  # the same sequence of batches for every N
        xs, ys = shard(x[start : start + batch], workers), shard(y[start : start + batch], workers)
        shard_losses, grads = [], []
        for r, xk, yk in zip(replicas, xs, ys, strict=True):
            loss = loss_fn(r(xk), yk)
            params = list(r.parameters())
            grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
            shard_losses.append(loss.item())
        summed = all_reduce(grads, net) if workers > 1 else grads
        for r, opt, g in zip(replicas, optimizers, summed, strict=True):
            offset = 0
            for p in r.parameters():
                p.grad = (g[offset : offset + p.numel()] / workers).view_as(p).clone()
                offset += p.numel()
            opt.step()
        losses.append(sum(shard_losses) / workers)  # equal shards: the full batch's mean loss
    return {"losses": losses, "replicas": replicas, "bytes_sent_per_worker": net.sent}


# --- 4. more than data: weights, gradients, optimizer states ---------------------------------------


@dataclass(frozen=True)
class Recipe:
    """Bytes one trainable parameter costs during training (ZeRO paper's accounting: weights + grads + K)."""

    key: str  # short name for reports
    name: str
    weights: int
    gradients: int
    master_weights: int  # fp32 copy of the weights kept by mixed precision (0 when training in fp32)
    adam_moments: int  # Adam's momentum and variance, fp32: 4 + 4

    @property
    def optimizer_states(self) -> int:
        """K in the ZeRO paper: everything the optimizer keeps per parameter."""
        return self.master_weights + self.adam_moments

    @property
    def total(self) -> int:
        """All bytes per parameter."""
        return self.weights + self.gradients + self.optimizer_states

    def parts(self) -> dict[str, int]:
        """The four kinds of training state and their bytes per parameter."""
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "fp32 master weights": self.master_weights,
            "Adam moments m, v": self.adam_moments,
        }


FP32_ADAM = Recipe("fp32_adam", "fp32 Adam", weights=4, gradients=4, master_weights=0, adam_moments=8)
# torch.autocast over fp32 weights: what the HF Trainer does with bf16=True on an fp32 model. The matrix
# products run in bf16, but the weights, their gradients (so DDP's all-reduce) and Adam stay fp32.
AUTOCAST_BF16_ADAM = Recipe(
    "autocast_bf16_adam",
    "fp32 weights + bf16 autocast",
    weights=4,
    gradients=4,
    master_weights=0,
    adam_moments=8,
)
# bf16 weights and gradients with an fp32 master copy in the optimizer: DeepSpeed's "bf16" mode with its
# defaults (gradients accumulated and all-reduced in bf16). Megatron-LM differs: its gradients are fp32.
BF16_MIXED_ADAM = Recipe(
    "bf16_mixed_adam",
    "bf16 mixed-precision Adam (DeepSpeed bf16)",
    weights=2,
    gradients=2,
    master_weights=4,
    adam_moments=8,
)
RECIPES = (FP32_ADAM, AUTOCAST_BF16_ADAM, BF16_MIXED_ADAM)

QWEN25_7B_SIZES = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
QWEN25_7B_PARAMETERS = 7_615_616_512  # counted on the meta device by qwen25_7b_on_meta(); the tests re-count


def on_meta(config) -> nn.Module:
    """A transformers causal LM built from ``config`` on the meta device: shapes only, nothing allocated."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def qwen25_7b_on_meta() -> nn.Module:
    """Qwen2.5-7B-Instruct's architecture from its published sizes, on the meta device (no download)."""
    from transformers import Qwen2Config

    return on_meta(Qwen2Config(**QWEN25_7B_SIZES))


def lora_parameters(model: nn.Module, rank: int) -> int:
    """Parameters LoRA of ``rank`` adds to every nn.Linear except the output head: rank x (in + out) each."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sum(
        rank * (m.in_features + m.out_features)
        for m in model.modules()
        if isinstance(m, nn.Linear) and m is not head
    )


def _millions(n: int) -> str:
    """A parameter count in words: 134.5 M, 7.62 B."""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.4g} M"


def memory_rows(models: dict[str, int], recipes=RECIPES) -> list[dict]:
    """Table rows: per model and recipe, GB (10^9 bytes) of weights, gradients, optimizer states, total."""
    rows = []
    for name, n in models.items():
        for r in recipes:
            rows.append(
                {
                    "model": name,
                    "parameters": _millions(n),
                    "recipe": r.name,
                    "weights GB": n * r.weights / 1e9,
                    "gradients GB": n * r.gradients / 1e9,
                    "optimizer states GB": n * r.optimizer_states / 1e9,
                    "total GB per worker": n * r.total / 1e9,
                }
            )
    return rows


def plot_training_state(models: dict[str, int], recipes=RECIPES):
    """Stacked bars: bytes per parameter per recipe, then GB per worker for each model."""
    import matplotlib.pyplot as plt

    from helpers import plots

    names = [
        r.name.replace(" mixed-precision", "\nmixed precision").replace(" Adam", "\nAdam") for r in recipes
    ]
    parts = list(recipes[0].parts())
    fig, axes = plt.subplots(1, 1 + len(models), figsize=(4.2 * (1 + len(models)) + 1.5, 4.4))
    per_param = {p: [r.parts()[p] for r in recipes] for p in parts}
    plots.stacked_bars(names, per_param, ax=axes[0], ylabel="bytes per parameter", title="per parameter")
    for ax, (model, n) in zip(axes[1:], models.items(), strict=True):
        gb = {p: [n * r.parts()[p] / 1e9 for r in recipes] for p in parts}
        plots.stacked_bars(
            names, gb, ax=ax, ylabel="GB per worker", title=f"{model}\n({_millions(n)} parameters)"
        )
    for ax in axes[:-1]:
        ax.get_legend().remove()
    fig.suptitle("Training state each data-parallel worker holds (counted parameters x bytes per parameter)")
    fig.tight_layout()
    return fig
