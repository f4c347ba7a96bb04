"""DistributedSampler's shards: which samples each rank sees, epoch by epoch, with and without set_epoch."""

from __future__ import annotations


def sampler_indices(samples: int, world: int, epochs: int, set_epoch: bool = True, seed: int = 0):
    """``[epoch][rank]`` -> the sample indices DistributedSampler gives that rank in that epoch.

    ``set_epoch=False`` reproduces the classic bug: the sampler is never told the epoch changed.
    """
    from torch.utils.data import DistributedSampler

    data = range(samples)
    samplers = [
        DistributedSampler(data, num_replicas=world, rank=r, shuffle=True, seed=seed) for r in range(world)
    ]
    out = []
    for epoch in range(epochs):
        if set_epoch:
            for s in samplers:
                s.set_epoch(epoch)
        out.append([list(s) for s in samplers])
    return out


def disjoint_cover(ranks: list[list[int]], samples: int) -> bool:
    """True when the ranks' shards share no sample and together hold every sample once."""
    flat = [i for shard in ranks for i in shard]
    return len(flat) == samples and sorted(flat) == list(range(samples))


def sample_table(indices, show: int = 8) -> list[dict]:
    """Rows for report.table: the first ``show`` indices of each rank in each epoch."""
    rows = []
    for epoch, ranks in enumerate(indices):
        row = {"epoch": epoch}
        for rank, shard in enumerate(ranks):
            row[f"rank {rank}"] = " ".join(map(str, shard[:show])) + (" …" if len(shard) > show else "")
        rows.append(row)
    return rows


def plot_sampler(with_epoch, without_epoch, samples: int):
    """Which rank gets each sample in each epoch, with and without ``set_epoch`` (from the sampler itself)."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    from helpers.plots import PALETTE

    world = len(with_epoch[0])
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(with_epoch) + 1.9), sharey=True)
    for ax, indices, title in (
        (axes[0], with_epoch, "with sampler.set_epoch(epoch)"),
        (axes[1], without_epoch, "without set_epoch"),
    ):
        owner = np.full((len(indices), samples), -1)
        order = np.zeros((len(indices), samples))
        for e, ranks in enumerate(indices):
            for r, shard in enumerate(ranks):
                owner[e, shard] = r
                order[e, shard] = np.arange(len(shard))
        ax.imshow(owner, aspect="auto", cmap=ListedColormap(PALETTE[:world]), interpolation="nearest")
        ax.set_title(title)
        ax.set_xlabel("sample index (colour: the rank that trains on it)")
        ax.set_yticks(range(len(indices)), [f"epoch {e}" for e in range(len(indices))])
        ax.grid(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=PALETTE[r]) for r in range(world)]
    axes[1].legend(
        handles,
        [f"rank {r}" for r in range(world)],
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        frameon=False,
    )
    fig.suptitle("DistributedSampler's shards, per epoch")
    fig.tight_layout()
    return fig
