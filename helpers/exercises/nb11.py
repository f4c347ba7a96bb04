"""Notebook 11's exercise checkers: ZeRO-3 bytes, SWIFT's GPU grouping, ZeRO-3's traffic ratio."""

from __future__ import annotations

from helpers.devicemap import swift_devices
from helpers.exercises import Wrong, brief, call, checker, close, items, number
from helpers.parallelism import BF16_MIXED_ADAM, QWEN25_7B_PARAMETERS


@checker("11.1")
def _check_zero3_bytes(answer):
    """Bytes per rank under ZeRO-3 for 7.6 B parameters, bf16 mixed Adam, 8 ranks."""
    n, recipe = QWEN25_7B_PARAMETERS, BF16_MIXED_ADAM
    got = number(answer, "your answer is", "bytes")
    expected = n * recipe.total / 8
    if close(got, expected, rel=1e-3):
        return True, f"{expected / 1e9:.2f} GB: every part of the 16 bytes per parameter is divided by 8."
    if close(got, expected / 1e9, rel=1e-3) or close(got, expected / 2**30, rel=1e-3):
        return False, f"{got!r} is in GB or GiB; the question asks for bytes."
    if close(got, n * recipe.total, rel=1e-3):
        return False, "that is what DDP holds; ZeRO-3 divides every part by the number of ranks."
    zero2 = n * (recipe.weights + (recipe.total - recipe.weights) / 8)
    if close(got, zero2, rel=1e-3):
        return False, "that is ZeRO-2 (weights whole); ZeRO-3 also shards the weights."
    zero1 = n * (recipe.weights + recipe.gradients + recipe.optimizer_states / 8)
    if close(got, zero1, rel=1e-3):
        return (
            False,
            "that is ZeRO-1 (only the optimizer states sharded); ZeRO-3 also shards gradients and weights.",
        )
    return (
        False,
        f"{got!r} bytes: use parallelism.QWEN25_7B_PARAMETERS and parallelism.BF16_MIXED_ADAM.total.",
    )


def _gpu_lists(answer, said: str, ranks: int) -> list[list[int]]:
    """The GPU ids of every rank as lists of ints, or Wrong saying what shape they should have."""
    lists = items(answer, said, ranks, list, f"a list of {ranks} lists of GPU ids, rank 0 first")
    for ids in lists:
        items(ids, f"{said} a rank's GPUs as", None, list, "a list of GPU ids")
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int):
                raise Wrong(f"{said} a GPU id {brief(i)}; GPU ids are ints.")
    return lists


@checker("11.2")
def _check_grouping(fn):
    """A function (local_rank, n_gpu, nproc) -> the GPU ids SWIFT gives that rank under DDP + device_map,
    tried on layouts the notebook's table does not show."""
    layouts = [(2, 2), (4, 2), (8, 2), (8, 4), (6, 3), (12, 3), (16, 4), (4, 1), (6, 2), (12, 4)]
    for n_gpu, nproc in layouts:
        for rank in range(nproc):
            got, said = call(fn, rank, n_gpu, nproc)
            got = _gpu_lists([got], said, 1)[0]
            want = swift_devices(rank, n_gpu, nproc)
            if got == want:
                continue
            block = n_gpu // nproc
            if got == list(range(rank * block, (rank + 1) * block)):
                raise Wrong(f"{said} {got}, a block; SWIFT gives {want}: range(local_rank, n_gpu, nproc).")
            raise Wrong(
                f"{said} {got}; with {n_gpu} GPUs and NPROC_PER_NODE={nproc} SWIFT gives rank {rank} {want}."
            )
    return True, "SWIFT strides: rank r takes GPUs r, r + NPROC, r + 2·NPROC, ..."


@checker("11.3")
def _check_traffic_ratio(answer):
    """ZeRO-3 wire bytes per step divided by DDP's, for any N (ring algorithms)."""
    got = number(answer, "your answer is", "times DDP's bytes (a ratio)")
    if close(got, 1.5, rel=1e-6):
        return True, "3(N-1)/N·Φ against 2(N-1)/N·Φ: ZeRO-3 and FSDP2 send 1.5x DDP's bytes per step."
    if close(got, 1.0, rel=1e-6):
        return False, "that holds for ZeRO-2; ZeRO-3 gathers the weights a second time for backward."
    if close(got, 2 / 3, rel=1e-3):
        return False, f"{got!r} is DDP's bytes over ZeRO-3's; the question asks ZeRO-3's over DDP's."
    return (
        False,
        f"{got!r}: count the weight all-gathers (forward and backward) and the gradient reduce-scatter.",
    )
