"""Notebook 00's exercise checkers: the gpu profile on four GPUs, an all-reduce's sum, three all-reduces on ranks."""

from __future__ import annotations

from helpers.exercises import (
    Wrong,
    brief,
    call,
    checker,
    close,
    integer,
    items,
    lost_its_peer,
    mistake_on_ranks,
    number,
)


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


VALUES = {2: (4.0, -1.5), 3: (4.0, -1.5, 2.5)}  # what each rank starts from, by the number of ranks


def summary_of(values) -> tuple[float, float, float]:
    return sum(values), max(values), min(values)


@checker("00.3")
def _summarize_on_ranks(summarize):
    """A function value -> (total, largest, smallest) over every rank's value, run on 2 and 3 real ranks."""
    if not callable(summarize):
        raise Wrong(f"answer with a function (def ...), not {brief(summarize)}.")

    def rank_part(rank, world):
        return summarize(VALUES[world][rank])

    def mistake(results, world):
        values = VALUES[world]
        want = summary_of(values)
        for rank, got in enumerate(results):
            said = f"On {world} ranks (values {list(values)}), rank {rank} returned {brief(got)}"
            if got is None:
                return f"{said}: is a `return` missing?"
            try:
                got = tuple(float(x) for x in got)
            except (TypeError, ValueError):
                return f"{said}; return a tuple of three numbers (total, largest, smallest)."
            if len(got) != 3:
                return f"{said}; return three numbers (total, largest, smallest)."
            if close(list(got), list(want), rel=1e-6):
                continue
            if close(list(got), [want[0]] * 3, rel=1e-6):
                return (f"{said}: the total three times. Largest and smallest need ReduceOp.MAX and ReduceOp.MIN, "
                        "each on a new tensor of your value: all_reduce works in place, so after the first call "
                        "a reused tensor holds the total on every rank.")
            if close(list(got), [values[rank]] * 3, rel=1e-6):
                return f"{said}: its own value only; each number needs an all_reduce over every rank."
            if got[0] == want[0] and not close(list(got[1:]), list(want[1:]), rel=1e-6):
                return f"{said}: the total is right; largest and smallest need ReduceOp.MAX and ReduceOp.MIN."
            return f"{said}; every rank should return {want}."
        return None

    seen, wrong = mistake_on_ranks(rank_part, mistake)
    if wrong and lost_its_peer(False, wrong):
        raise Wrong(
            "a rank waited in an all_reduce for a rank that had already returned: every rank must call the same "
            f"all-reduces, in the same order ({wrong.split(':')[0]})."
        )
    if wrong:
        raise Wrong(wrong)
    return True, (
        "Three all-reduces, each on a fresh tensor: SUM, MAX and MIN leave the same three numbers on every rank, "
        "and each overwrites the tensor it is given."
    )
