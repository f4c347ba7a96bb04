"""Notebook 00's exercise checkers: the gpu profile on four GPUs, an all-reduce's sum."""

from __future__ import annotations

from helpers.exercises import Wrong, call, checker, close, integer, items, number


@checker("00.1")
def _gpu_profile_on_four_gpus(answer):
    """Which backend and how many processes does the gpu profile use on a 4-GPU machine?"""
    backend, nproc = items(answer, "your answer is", 2, what='a tuple (backend, processes), e.g. ("gloo", 2)')
    if not isinstance(backend, str):
        return False, f'the backend is a name such as "gloo", not {backend!r}.'
    nproc = integer(nproc, "the number of processes is", "processes")
    if backend.strip().lower() != "nccl":
        return False, f"{backend!r}: GPUs talk through NCCL; gloo is the CPU backend."
    if nproc != 4:
        return False, f"{nproc!r} processes: the gpu profile starts one process per visible GPU."
    return True, "One process per GPU, talking NCCL: the DDP layout SWIFT uses with NPROC_PER_NODE=4."


@checker("00.2")
def _all_reduce_sum(expected_sum):
    """A function n -> the value every rank holds after all-reducing (rank + 1) over n ranks."""
    for n in list(range(1, 65)) + [100, 1000, 4096]:
        want = n * (n + 1) / 2
        got = number(*call(expected_sum, n), "(the value each rank holds, a sum of rank + 1)")
        if close(got, want, rel=1e-12):
            continue
        if close(got, n * (n - 1) / 2, rel=1e-12):
            raise Wrong(
                f"for {n} ranks every rank holds {want:g}, not {got!r}: that sums the ranks, but each contributes rank + 1."
            )
        raise Wrong(f"for {n} ranks every rank holds {want:g}, your function gives {got!r}.")
    return True, "All-reduce leaves the same sum, 1 + 2 + ... + n = n(n+1)/2, on every rank."
