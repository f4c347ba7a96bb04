"""Notebook 12's exercise checkers: SWIFT's use_reentrant, activation memory, a hang's stacks, the forced error's way out."""

from __future__ import annotations

import copy

from helpers.exercises import Wrong, brief, call, checker, close, items, number


def swift_use_reentrant(kwargs, nproc_per_node, deepspeed: bool, fsdp: bool) -> bool:
    """The ``use_reentrant`` ms-swift 4.6 passes to ``torch.utils.checkpoint`` (``SwiftMixin``,
    swift/trainers/mixin.py): the one ``--gradient_checkpointing_kwargs`` names, else False when the
    process is distributed (``is_dist()``: torchrun set RANK, which it does whenever NPROC_PER_NODE is
    set, 1 included) and neither DeepSpeed nor FSDP is on, else True."""
    chosen = kwargs.get("use_reentrant") if kwargs else None
    if chosen is None:
        chosen = not (nproc_per_node is not None and not deepspeed and not fsdp)
    return chosen


def _reentrant_cases() -> list[tuple]:
    """Every command shape 12.1 is checked on: the section's own command first, then the rest."""
    kwargs = [None, {}, {"use_reentrant": True}, {"use_reentrant": False}, {"preserve_rng_state": False}]
    sharded = [(False, False), (True, False), (False, True)]  # DeepSpeed and FSDP are not used together
    cases = [(None, 2, False, False)]
    cases += [(kw, n, ds, fs) for n in (2, None, 1, 4, 8) for ds, fs in sharded for kw in kwargs]
    return cases


@checker("12.1")
def _which_reentrant(fn):
    """A function (kwargs, nproc_per_node, deepspeed, fsdp) -> the use_reentrant SWIFT 4.6 chooses."""
    for kwargs, nproc, deepspeed, fsdp in _reentrant_cases():
        want = swift_use_reentrant(kwargs, nproc, deepspeed, fsdp)
        got, said = call(fn, copy.deepcopy(kwargs), nproc, deepspeed, fsdp)
        if not isinstance(got, bool):
            hint = " (is a `return` missing?)" if got is None else ""
            raise Wrong(f"{said} {brief(got)}{hint}; the answer is True or False.")
        if got == want:
            continue
        named = kwargs.get("use_reentrant") if kwargs else None
        if named is not None:
            why = "--gradient_checkpointing_kwargs names use_reentrant, and SWIFT passes that value on"
        elif nproc == 1 and not (deepspeed or fsdp):
            why = "NPROC_PER_NODE=1 still starts torchrun, which sets RANK: is_dist() is true"
        elif nproc is None:
            why = "without NPROC_PER_NODE one process runs, not started by torchrun: is_dist() is false"
        elif deepspeed or fsdp:
            why = (
                "with DeepSpeed or FSDP, DDP's reducer is not in use and SWIFT keeps reentrant checkpointing"
            )
        else:
            why = "under plain DDP SWIFT switches to non-reentrant checkpointing"
        raise Wrong(f"{said} {got!r}; SWIFT passes use_reentrant={want!r}: {why}.")
    return True, (
        "A use_reentrant named in the kwargs wins; otherwise only a torchrun launch without DeepSpeed or FSDP, "
        "plain DDP, gets non-reentrant checkpointing."
    )


@checker("12.2")
def _activation_memory(fn):
    """A function (layers, layer_mb, input_mb, checkpointed) -> MB of activations held at the peak."""
    import random

    rng = random.Random(92)
    cases = [
        (n, lm, im, c)
        for n in (8, 30, 2, 1)
        for lm, im in ((1.0, 0.1), (12.5, 1.5), (40.0, 2.0))
        for c in (False, True)
    ]
    cases += [
        (rng.randint(1, 96), rng.uniform(1, 500), rng.uniform(0.01, 1), rng.random() < 0.5) for _ in range(20)
    ]
    for layers, layer_mb, input_mb, ckpt in cases:
        want = layers * input_mb + layer_mb if ckpt else layers * layer_mb
        got = number(*call(fn, layers, layer_mb, input_mb, ckpt), "MB")
        if close(got, want, rel=1e-9):
            continue
        shown_ = f"{layers} layers of {layer_mb!r} MB (inputs {input_mb!r} MB), checkpointed={ckpt}"
        if ckpt and close(got, layers * input_mb, rel=1e-9):
            why = "; the layer being recomputed holds its layer_mb too"
        elif ckpt and close(got, layers * layer_mb, rel=1e-9):
            why = "; with checkpointing only each layer's input waits for backward"
        elif ckpt and close(got, (layers - 1) * input_mb + layer_mb, rel=1e-9):
            why = "; count every layer's kept input, the recomputed one's included, plus its layer_mb"
        else:
            why = ""
        raise Wrong(f"{shown_}: expected {want!r} MB, got {got!r} MB{why}.")
    return True, (
        "Without checkpointing every layer's activations wait for backward; with it only each layer's "
        "input is kept, plus one layer's activations while that layer is recomputed."
    )


_COLLECTIVES = ["all_reduce", "barrier", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor"]
_CALLERS = ["sync_gradients (train.py:88)", "step (optim.py:41)", "save_checkpoint (train.py:120)"]
_ELSEWHERE = [  # where a missing rank can be: none of these frames is in torch.distributed's collectives
    ["wait_for_input (hang.py:19)"],
    ["__next__ (dataloader.py:733)", "next_batch (train.py:61)"],
    ["recv_into (socket.py:706)", "retry (io.py:12)", "read_shard (data.py:30)"],
    ["write (serialization.py:650)", "save (serialization.py:943)", "save_checkpoint (train.py:118)"],
    ["forward (linear.py:125)", "_call_impl (module.py:1784)", "sync_metrics_from_disk (train.py:70)"],
]
_THREADS = [  # a background thread py-spy lists before the main one (its frames come first)
    ["_pin_memory_loop (pin_memory.py:59)", "run (threading.py:982)", "_bootstrap (threading.py:1002)"],
    ["wait (threading.py:331)", "run (_monitor.py:60)", "_bootstrap (threading.py:1002)"],
]


def hang_stacks(seed: int) -> dict[int, list[str]]:
    """Made-up py-spy stacks of a hung job, ``{rank: frames}`` as ``troubleshooting.stack_frames`` gives
    them (each thread innermost first, a background thread's before the main thread's), 2 to 8 ranks in
    shuffled order: some inside a collective (a frame in distributed_c10d.py), at least one elsewhere."""
    import random

    rng = random.Random(seed)
    ranks = list(range(rng.randint(2, 8)))
    missing = set(rng.sample(ranks, rng.randint(1, len(ranks) - 1)))
    stacks = {}
    for rank in rng.sample(ranks, len(ranks)):
        if rank in missing:
            frames = list(rng.choice(_ELSEWHERE))
        else:
            frames = [f"{rng.choice(_COLLECTIVES)} (distributed_c10d.py:{rng.randint(2000, 4900)})"]
            frames += ["wrapper (c10d_logger.py:83)"] if rng.random() < 0.7 else []
            frames.append(rng.choice(_CALLERS))
        frames += [f"main (train.py:{rng.randint(130, 200)})", "<module> (train.py:210)"]
        stacks[rank] = (rng.choice(_THREADS) if rng.random() < 0.4 else []) + frames
    return stacks


def stuck_and_missing(stacks: dict) -> tuple[set, set]:
    """(ranks inside a torch.distributed collective, ranks that are not) from ``{rank: frames}``."""
    waiting = {rank for rank, frames in stacks.items() if any("(distributed_c10d.py:" in f for f in frames)}
    return waiting, set(stacks) - waiting


def _rank_set(value, said: str, name: str) -> set:
    ranks = items(value, f"{said} {name}", None, (set, frozenset), f"a set of ranks ({name})")
    for rank in ranks:
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise Wrong(f"{said} {brief(rank)} among the {name} ranks; a rank is an int (the dict's key).")
    return set(ranks)


@checker("12.3")
def _stuck_and_missing(fn):
    """A function {rank: py-spy frames} -> (waiting ranks, missing ranks), as two sets, on section 5's two
    dumps and on made-up stacks of 2 to 8 ranks (:func:`hang_stacks`)."""
    section5 = {
        0: ["all_reduce (distributed_c10d.py:3252)", "wrapper (c10d_logger.py:83)", "sync_gradients (hang.py:23)",
            "<module> (hang.py:30)"],
        1: ["wait_for_input (hang.py:19)", "<module> (hang.py:34)"],
    }  # fmt: skip
    name = getattr(fn, "__name__", "your function")
    for stacks in [section5, *(hang_stacks(seed) for seed in range(40))]:
        waiting, missing = stuck_and_missing(stacks)
        got, said = call(fn, copy.deepcopy(stacks), show=f"{name}({stacks})")
        pair = items(got, said, 2, tuple, "a pair (waiting ranks, missing ranks) of sets")
        got_waiting, got_missing = _rank_set(pair[0], said, "waiting"), _rank_set(pair[1], said, "missing")
        if (got_waiting, got_missing) == (waiting, missing):
            continue
        by_position = {i for i, rank in enumerate(stacks) if rank in waiting}
        first_only = {rank for rank, frames in stacks.items() if "(distributed_c10d.py:" in frames[0]}
        all_reduce_only = {
            r for r, frames in stacks.items() if any(f.startswith("all_reduce ") for f in frames)
        }
        if (got_waiting, got_missing) == (missing, waiting):
            why = "the pair is swapped: the waiting ranks first, then the missing ones"
        elif got_waiting == by_position:
            why = "the dict's keys are the ranks (py-spy's dumps come in any order), not their positions"
        elif got_waiting | got_missing != set(stacks) or got_waiting & got_missing:
            why = "every rank is either waiting or missing, once"
        elif got_waiting == first_only:
            why = "look at every frame, not only the first: py-spy lists a background thread before the main one"
        elif got_waiting == all_reduce_only:
            why = "barrier, broadcast and the other collectives wait too: look for a frame in distributed_c10d.py"
        else:
            why = "a rank is waiting when one of its frames is in torch's distributed_c10d.py"
        raise Wrong(f"{said} ({got_waiting}, {got_missing}); expected ({waiting}, {missing}): {why}.")
    return True, "The ranks inside a collective are the victims; the missing ones are where to look."


# 12.4: section 1's forced run (2 ranks, LoRA, reentrant checkpointing forced, Trainer's own
# find_unused_parameters=True), changed in one way; what each change does, measured with ms-swift 4.6 on 2 gloo
# ranks, and why
_FORCED = {
    "--ddp_find_unused_parameters false": (
        "trains",
        "with find_unused_parameters=False DDP marks nothing ready after forward, so the nested backward's hooks are "
        "the first and only ones (section 1's script, reentrant true and find_unused false, trains too)",
    ),
    "--tuner_type full": (
        "fails",
        "full training changes what is trained, not how: the decoder layers' parameters still sit inside reentrant "
        "checkpoints, DDP still marks them unused after forward, and the nested backward fires their hooks again",
    ),
    "no NPROC_PER_NODE (one process)": (
        "trains",
        "without torchrun there is one process and no DDP, so no hook can mark a gradient ready twice",
    ),
    "--gradient_checkpointing_kwargs '{\"use_reentrant\": false}'": (
        "trains",
        "non-reentrant checkpointing keeps the blocks in the one ordinary graph, where DDP's walk finds every "
        "parameter: that is SWIFT's own choice under DDP, the run of section 1 that trained",
    ),
}


@checker("12.4")
def _check_forced_changes(answer):
    """{change: "trains" or "fails"} for each change of section 1's forced swift sft run."""
    if not isinstance(answer, dict):
        raise Wrong(f"your answer is {brief(answer)}; the answer is a dict from each change in CHANGES to "
                    '"trains" or "fails".')  # fmt: skip
    missing, unknown = sorted(set(_FORCED) - set(answer)), sorted(set(answer) - set(_FORCED))
    if missing or unknown:
        raise Wrong(
            f"the keys are the changes in CHANGES, each once: missing {missing}, not in CHANGES {unknown}."
        )
    for change, said in answer.items():
        if not isinstance(said, str) or said.strip().lower() not in ("trains", "fails"):
            raise Wrong(f'for {change!r} the answer is "trains" or "fails", not {brief(said)}.')
    wrong = [change for change, said in answer.items() if said.strip().lower() != _FORCED[change][0]]
    if wrong:
        change = wrong[0]
        more = (
            f" ({len(wrong) - 1} other prediction{'s' * (len(wrong) > 2)} also wrong)"
            if len(wrong) > 1
            else ""
        )
        raise Wrong(f"{change}: it {_FORCED[change][0]}, because {_FORCED[change][1]}.{more} "
                    "Run it: make the change in forced_command and run that cell again.")  # fmt: skip
    return (
        True,
        "the error needs all three at once: DDP, reentrant checkpointing, and DDP looking for unused parameters.",
    )
