"""DDP's Reducer buckets: torch's rule for packing gradients, and the buckets a comm hook saw, tabled and drawn."""

from __future__ import annotations

MiB = 2**20  # DDP's bucket_cap_mb counts in these units

# a model with layers of clearly different sizes, small enough to read its buckets one by one
ANATOMY_WIDTHS = (256, 1024, 512, 512, 128, 10)


def expected_buckets(sizes, cap_bytes: int, first_cap_bytes: int | None = None, kinds=None) -> list[list[int]]:
    """DDP's packing rule, for parameter byte sizes listed in the order their gradients become ready.

    torch's rule (``dist._compute_bucket_assignment_by_size``): tensors go, in that order, into the open
    bucket of their kind (``kinds[i]``, e.g. ``(dtype, device)``; one kind when None); a bucket closes as
    soon as it holds *at least* its cap: the first bucket of each kind ``first_cap_bytes`` (when given),
    every later one ``cap_bytes``. Buckets still open at the end go too. Returns the indices in each
    bucket, buckets ordered by their first index, as torch orders them.
    """
    kinds = [None] * len(sizes) if kinds is None else list(kinds)
    open_buckets, closed, count = {}, [], {}
    for i, (size, kind) in enumerate(zip(sizes, kinds, strict=True)):
        indices, filled = open_buckets.pop(kind, ([], 0))
        indices, filled = [*indices, i], filled + size
        cap = first_cap_bytes if (first_cap_bytes is not None and count.get(kind, 0) == 0) else cap_bytes
        if filled >= cap:
            closed.append(indices)
            count[kind] = count.get(kind, 0) + 1
        else:
            open_buckets[kind] = (indices, filled)
    return sorted(closed + [indices for indices, _ in open_buckets.values()], key=min)


def predict_buckets(
    sizes: list[int], ready_order: list[int], cap_bytes: int, first_cap_bytes: int | None = None
) -> list[list[int]]:
    """Parameter indices per bucket that :func:`expected_buckets` predicts, given the ready order: DDP's
    rebuilt buckets. ``first_cap_bytes``: 1 MiB when ``bucket_cap_mb`` was left at None, else the cap."""
    packed = expected_buckets([sizes[i] for i in ready_order], cap_bytes, first_cap_bytes)
    return [[ready_order[i] for i in bucket] for bucket in packed]


def layouts(found: dict, sizes: dict) -> dict:
    """Bucket contents as ``{row label: [[(name, bytes), ...] per bucket]}`` for ``plots.bucket_map``."""
    rows = {}
    first = next(iter(found.values()))["first"]
    rows[f"first step, any cap ({len(first)} bucket{'s' * (len(first) > 1)})"] = [
        [(n, sizes[n]) for n in b["params"]] for b in first
    ]
    for cap, entry in found.items():
        later = entry["later"]
        rows[f"bucket_cap_mb={float(cap):g} ({len(later)} bucket{'s' * (len(later) > 1)})"] = [
            [(n, sizes[n]) for n in b["params"]] for b in later
        ]
    return rows


def bucket_rows(records: list[dict], sizes: dict[str, int]) -> list[dict]:
    """A table of what the comm hook saw: one row per bucket, in the order the hook was called."""
    rows = []
    for r in sorted(records, key=lambda r: r["bucket"]):
        names = r["params"]
        rows.append(
            {
                "bucket": r["bucket"],
                "parameters (in bucket order)": ", ".join(names),
                "tensors": len(names),
                "MiB": round(r["bytes"] / MiB, 3),
                "params' own bytes": sum(sizes[n] for n in names),
            }
        )
    return rows


def plot_buckets(found: dict, sizes: dict):
    """The buckets the comm hook saw, one row per bucket_cap_mb, the first step on top."""
    from helpers import plots

    fig = plots.bucket_map(layouts(found, sizes), title="DDP's buckets, read from the comm hook (measured)")
    fig.axes[0].set_xlabel("gradient bytes (MiB), in bucket order: bucket 0 first")
    return fig
