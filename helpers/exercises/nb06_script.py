"""Notebook 06's exercise 06.3: a DDP training script written from scratch, run under torchrun and compared with its run done by hand.

The learner's script trains ``nn.Linear`` on the data file it is given, with ``DistributedSampler``
(shuffled, seed 0, ``set_epoch`` every epoch), DDP and SGD on ``F.mse_loss``, and rank 0 saves the bare
model's ``state_dict`` to ``--out``. The checker launches it on 2 ranks and computes the same run in
this process from the definition (each step: the mean of the ranks' losses, one SGD step), then names
the mistake whose run the saved weights match: no sampler, no ``set_epoch``, no DDP, no ``zero_grad``.
"""

from __future__ import annotations

import ast
import contextlib
import io
import shutil
import sys
import tempfile
from pathlib import Path

from helpers.errors import CourseError
from helpers.exercises import Wrong, brief, checker

WORLD, SAMPLES, FEATURES, OUTPUTS = 2, 40, 6, 2
ARGS = {"epochs": 2, "batch": 4, "lr": 0.05}  # 5 steps per epoch on each of the 2 ranks

MISTAKES = {  # what a run without one piece does, and what to say
    "sampler": "every rank read the whole dataset: give the DataLoader a DistributedSampler, so each rank "
    "trains on its own shard.",
    "set_epoch": "every epoch shuffled the same way: call sampler.set_epoch(epoch) at the start of each epoch.",
    "ddp": "rank 0's weights are what rank 0 learned alone from its shard: wrap the model in "
    "DistributedDataParallel, so every backward averages the gradients over the ranks.",
    "zero_grad": "the gradients kept adding up from step to step: call optimizer.zero_grad() every step.",
}


def data(seed: int = 8) -> dict:
    """The dataset the script is given: inputs and targets of a noisy linear teacher."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = x @ torch.randn(FEATURES, OUTPUTS, generator=g) + 0.1 * torch.randn(SAMPLES, OUTPUTS, generator=g)
    return {"x": x, "y": y}


def by_hand(x, y, *, sampler=True, set_epoch=True, ddp=True, zero_grad=True) -> dict:
    """The run the script should do, written out in one process: each rank's batches from its sampler, each
    step's gradient the mean over the ranks (or rank 0's alone, without DDP), SGD; the final state_dict."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DistributedSampler, TensorDataset

    torch.manual_seed(0)
    model = nn.Linear(FEATURES, OUTPUTS)
    optimizer = torch.optim.SGD(model.parameters(), lr=ARGS["lr"])
    dataset = TensorDataset(x, y)
    for epoch in range(ARGS["epochs"]):
        orders = []
        for rank in range(WORLD):
            if not sampler:
                orders.append(list(range(SAMPLES)))
                continue
            s = DistributedSampler(dataset, num_replicas=WORLD, rank=rank, shuffle=True, seed=0)
            s.set_epoch(epoch if set_epoch else 0)
            orders.append(list(s))
        b = ARGS["batch"]
        for start in range(0, len(orders[0]), b):
            if zero_grad:
                optimizer.zero_grad()
            ranks = range(WORLD) if ddp else [0]
            losses = [F.mse_loss(model(x[orders[r][start : start + b]]), y[orders[r][start : start + b]]) for r in ranks]
            (sum(losses) / len(losses)).backward()
            optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def imports_outside_torch(text: str) -> list[str]:
    """The modules a script imports beyond torch and the standard library."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(names - set(sys.stdlib_module_names) - {"torch"})


def gap(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in b)


@checker("06.3")
def _script_from_scratch(answer):
    """The path of the learner's script: launched on 2 ranks, its saved weights compared with the run by hand."""
    import os

    import torch

    from helpers import launching

    if not isinstance(answer, (str, os.PathLike)) or not Path(answer).is_file():
        raise Wrong(f"{brief(answer)} is not the path of a script: write it with the %%writefile cell above, then "
                    "pass its path, e.g. SCRIPTS / \"my_ddp_train.py\".")  # fmt: skip
    text = Path(answer).read_text(encoding="utf-8")
    try:
        outside = imports_outside_torch(text)
    except SyntaxError as error:
        raise Wrong(f"the script is not valid Python: line {error.lineno}: {error.msg}.") from None
    if outside:
        raise Wrong(f"the script imports {', '.join(outside)}: a script to take to a cluster uses torch and the "
                    "standard library only.")  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="course-04.8-"))
    try:
        given = data()
        torch.save(given, folder / "data.pt")
        out = folder / "weights.pt"
        args = [f"--{k}={v}" for k, v in ARGS.items()]
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the verdict is the cell's only output
                launching.torchrun(Path(answer).resolve(), "--data", folder / "data.pt", "--out", out, *args,
                                   nproc=WORLD, timeout=120, show=False)  # fmt: skip
        except CourseError as error:
            return False, f"the script did not run to the end on {WORLD} ranks: {error}"
        if not out.is_file():
            return False, "the script ran but wrote no weights: rank 0 saves model.state_dict() to --out."
        saved = torch.load(out, weights_only=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not isinstance(saved, dict) or not all(isinstance(v, torch.Tensor) for v in saved.values()):
        return False, f"--out holds {brief(saved)}, not a state_dict: torch.save(model.state_dict(), args.out)."
    if any(k.startswith("module.") for k in saved):
        return False, ("the saved names start with 'module.' (the state_dict of the DDP wrapper): save "
                       "ddp.module.state_dict(), the bare model's, so it loads without DDP.")  # fmt: skip
    want = by_hand(given["x"], given["y"])
    if set(saved) != set(want) or any(saved[k].shape != want[k].shape for k in want):
        return False, f"the saved state_dict holds {sorted(saved)}, not nn.Linear's {sorted(want)}."
    if gap(saved, want) <= 1e-5:
        return True, (f"{WORLD} ranks, {ARGS['epochs']} epochs: rank 0's weights are the run by hand's, in which "
                      "every step averages the two ranks' gradients.")  # fmt: skip
    for missing, why in MISTAKES.items():
        if gap(saved, by_hand(given["x"], given["y"], **{missing: False})) <= 1e-5:
            return False, why
    return False, (f"the saved weights differ from the run by hand by up to {gap(saved, want):.3g}: check the "
                   "sampler (shuffle=True, seed=0), the loss (F.mse_loss), SGD's lr and --batch per rank.")  # fmt: skip
