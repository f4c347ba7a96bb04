"""Notebook 02's exercise checkers: replication bytes, the parallel steps, per-replica mean losses, the scatter."""

from __future__ import annotations

from helpers.dataparallel import STEPS
from helpers.exercises import Wrong, brief, call, checker, close, integer, items, number


@checker("02.1")
def _replicate_bytes(fn):
    """A function (k, weight_bytes) -> bytes the main device sends in step 2 (replicate model)."""
    import random

    rng = random.Random(2)
    cases = [(k, w) for k in range(1, 9) for w in (4, 1000, 5_000_000)]
    cases += [(rng.randint(1, 64), rng.randint(1, 10**10)) for _ in range(20)]
    for k, weight_bytes in cases:
        want = (k - 1) * weight_bytes
        got = integer(*call(fn, k, weight_bytes), "bytes")
        if got == want:
            continue
        if got == k * weight_bytes:
            raise Wrong(
                f"replicate_bytes({k}, {weight_bytes}) is {got!r} bytes, not {want!r}: the main device already "
                "holds the model and sends it to the other k - 1 devices."
            )
        raise Wrong(
            f"for k={k} and {weight_bytes} bytes of weights the main device sends {want!r} bytes, not {got!r}."
        )
    return True, "(k - 1) copies: every device but the main one gets the whole model, every single step."


@checker("02.2")
def _parallel_steps(answer):
    """Which of the nine steps run in the devices' own threads at the same time?"""
    chosen = items(answer, "your answer is", None, (set, frozenset), "a set of step names")
    for s in chosen:
        if not isinstance(s, str):
            return False, f"{s!r} is not a step name; pick names (strings) from {list(STEPS)}."
    chosen = {" ".join(s.split()).lower() for s in chosen}
    unknown = chosen - set(STEPS)
    if unknown:
        return False, f"{sorted(unknown)} are not step names; pick from {list(STEPS)}."
    want = {"parallel forward", "parallel backward"}
    if chosen < want:
        return False, "both passes run in every device's thread; one of them is missing."
    if chosen > want:
        extra = sorted(chosen - want)
        return (
            False,
            f"{extra} run on the main device alone, one after another; look at the timeline's lanes.",
        )
    if chosen != want:
        return False, "Look at the timeline: which lanes other than dev0 ever have bars?"
    return True, "Only forward and backward; the other seven steps run one after another on the main device."


@checker("02.3")
def _per_replica_mean_loss(fn):
    """A function k -> factor by which summed per-replica mean-loss gradients exceed the true gradient."""
    for k in list(range(1, 17)) + [32, 100, 1000]:
        got = number(*call(fn, k), "times (a factor)")
        if close(got, k, rel=1e-9):
            continue
        if k > 1 and close(got, 1 / k, rel=1e-9):
            raise Wrong(
                f"factor({k}) is {got!r}, upside down: the sum is larger than the true gradient, not smaller."
            )
        raise Wrong(f"with {k} equal slices the sum is {k} times the full-batch gradient, not {got!r} times.")
    return (
        True,
        "k times: each slice's mean already weighs its rows by 1/(B/k). DDP therefore divides the all-reduced sum by the world size.",
    )


@checker("02.4")
def _scatter_rows(fn):
    """A function (batch, k) -> the rows each device gets from DataParallel's scatter, devices with none left out."""
    import torch

    cases = [(5, 4), (9, 4), (10, 4), (8, 4), (3, 8), (1, 2), (7, 1)]
    cases += [(b, k) for k in range(1, 9) for b in range(1, 41)]
    for batch, k in cases:
        want = [len(c) for c in torch.arange(batch).chunk(k)]  # torch's own rule, as its scatter calls it
        got, said = call(fn, batch, k)
        got = items(got, said, None, (list, tuple), "a list of row counts, one per device that gets rows")
        if any(isinstance(n, bool) or not isinstance(n, int) for n in got):
            raise Wrong(f"{said} {brief(got)}; give whole numbers of rows (int), one per device.")
        if got == want:
            continue
        if any(n < 0 for n in got):
            raise Wrong(f"{said} {got}: no device gets fewer than 0 rows; once the rows run out, the slices stop.")
        if sum(got) != batch:
            raise Wrong(f"{said} {got}: {sum(got)} rows in all, but the batch has {batch}; every row goes somewhere.")
        if [n for n in got if n] == want:
            raise Wrong(f"{said} {got}: a device with no rows gets no slice at all (and no replica); leave it out.")
        if got == [len(c) for c in torch.arange(batch).tensor_split(k)]:
            raise Wrong(
                f"{said} {got}, torch.tensor_split's rule (sizes differ by at most one). DataParallel slices with "
                "Tensor.chunk: every slice but the last has ceil(batch / k) rows."
            )
        raise Wrong(f"a batch of {batch} rows over {k} devices is scattered as {want}, not {got}.")
    return True, (
        "Tensor.chunk gives ceil(batch / k) rows per slice until the rows run out: 9 rows on 4 devices make 3 "
        "slices, and the fourth device idles. Keep the global batch a multiple of the devices."
    )
