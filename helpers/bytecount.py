"""How many bytes: tensors and modules counted (each storage once), and a byte count as a reader says it."""

from __future__ import annotations

from torch import nn


def nbytes(*items) -> int:
    """Bytes of the given tensors, modules (their parameters) and collections of them.

    Each tensor counts once (a tied weight, or the same tensor given twice); an FSDP2 DTensor counts only this
    rank's shard; ``None`` (a gradient not computed yet) counts nothing.
    """
    seen, total = set(), 0

    def add(item):
        nonlocal total
        if item is None:
            return
        if isinstance(item, nn.Module):
            item = item.parameters()
        if not hasattr(item, "numel"):  # a list, tuple, generator of tensors
            for inner in item:
                add(inner)
            return
        tensor = item.to_local() if hasattr(item, "to_local") else item
        key = (tensor.data_ptr(), tensor.numel())
        if tensor.numel() and key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()

    for item in items:
        add(item)
    return total


def human_bytes(n: float) -> str:
    """``n`` bytes as a reader says it: 4 KiB, 1.5 MiB, 64 MiB, 100 B."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value >= 10 or value == int(value) else f"{value:.1f} {unit}"
    return f"{n:.0f} B"
