"""Notebook 06's exercise 06.3: a DDP training script written from scratch, run under torchrun and compared with its run done by hand.

The learner's script trains ``nn.Linear`` on the data file it is given, with ``DistributedSampler``
(shuffled, seed 0, ``set_epoch`` every epoch), DDP and SGD on ``F.mse_loss``, and rank 0 saves the bare
model's ``state_dict`` to ``--out``. The checker launches it on 2 ranks, then on 3, and computes the same
run in this process from the definition (each step: the mean of the ranks' losses, one SGD step), then names
the mistake whose run the saved weights match: no sampler, no ``set_epoch``, no DDP, no ``zero_grad``. The
script runs under a small launcher that notes each rank calling ``torch.save``: rank 0 alone writes.
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

WORLDS, SAMPLES, FEATURES, OUTPUTS = (2, 3), 40, 6, 2
ARGS = {"epochs": 2, "batch": 4, "lr": 0.05}  # 5 steps per epoch on each of 2 ranks, 4 on each of 3

LAUNCHER = '''"""Runs a 06.3 script as torchrun started it (argv: a folder, the script, its arguments), first noting in
the folder each rank that calls torch.save."""
import os
import runpy
import sys

import torch

folder, script = sys.argv[1], sys.argv[2]
save = torch.save


def noted_save(*args, **kwargs):
    open(os.path.join(folder, "saved-by-rank-" + os.environ["RANK"]), "w").close()
    return save(*args, **kwargs)


torch.save = noted_save
sys.argv = sys.argv[2:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__main__")
'''

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


def by_hand(x, y, world: int = 2, *, sampler=True, set_epoch=True, ddp=True, zero_grad=True) -> dict:
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
        for rank in range(world):
            if not sampler:
                orders.append(list(range(SAMPLES)))
                continue
            s = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
            s.set_epoch(epoch if set_epoch else 0)
            orders.append(list(s))
        b = ARGS["batch"]
        for start in range(0, len(orders[0]), b):
            if zero_grad:
                optimizer.zero_grad()
            ranks = range(world) if ddp else [0]
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
    given = data()
    for world in WORLDS:
        wrong = _run(Path(answer).resolve(), given, world)
        if wrong and world > 2:  # right on 2 ranks
            wrong = (f"your script is right on 2 ranks but not on {world}: {wrong} Is a number of ranks written "
                     "into it? torchrun gives each rank its RANK and WORLD_SIZE, and DistributedSampler reads them "
                     "from the process group.")  # fmt: skip
        if wrong:
            return False, wrong
    return True, (f"{ARGS['epochs']} epochs on 2 ranks and on 3: rank 0's weights are the run by hand's, in which "
                  "every step averages the ranks' gradients, and rank 0 alone wrote them.")  # fmt: skip


def _run(script: Path, given: dict, world: int) -> str | None:
    """Launch ``script`` on ``world`` ranks and say what is wrong with its run, or None when nothing is."""
    import torch

    from helpers import launching

    folder = Path(tempfile.mkdtemp(prefix="course-06.3-"))
    try:
        torch.save(given, folder / "data.pt")
        (folder / "launcher.py").write_text(LAUNCHER)
        out = folder / "weights.pt"
        args = [f"--{k}={v}" for k, v in ARGS.items()]
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the verdict is the cell's only output
                launching.torchrun(folder / "launcher.py", folder, script, "--data", folder / "data.pt", "--out", out,
                                   *args, nproc=world, timeout=120, show=False)  # fmt: skip
        except CourseError as error:
            return f"the script did not run to the end on {world} ranks: {error}"
        writers = sorted(int(f.name.rpartition("-")[2]) for f in folder.glob("saved-by-rank-*"))
        if any(writers):
            return (f"rank {max(writers)} saved the weights too: every rank holds the same weights, and ranks writing "
                    "one file at once can leave it torn. Save on rank 0 only (if dist.get_rank() == 0:), then "
                    "dist.barrier().")  # fmt: skip
        if not out.is_file():
            return "the script ran but wrote no weights: rank 0 saves model.state_dict() to --out."
        saved = torch.load(out, weights_only=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not isinstance(saved, dict) or not all(isinstance(v, torch.Tensor) for v in saved.values()):
        return f"--out holds {brief(saved)}, not a state_dict: torch.save(model.state_dict(), args.out)."
    if any(k.startswith("module.") for k in saved):
        return ("the saved names start with 'module.' (the state_dict of the DDP wrapper): save "
                "ddp.module.state_dict(), the bare model's, so it loads without DDP.")  # fmt: skip
    want = by_hand(given["x"], given["y"], world)
    if set(saved) != set(want) or any(saved[k].shape != want[k].shape for k in want):
        return f"the saved state_dict holds {sorted(saved)}, not nn.Linear's {sorted(want)}."
    if gap(saved, want) <= 1e-5:
        return None
    for missing, why in MISTAKES.items():
        if gap(saved, by_hand(given["x"], given["y"], world, **{missing: False})) <= 1e-5:
            return why
    return (f"the saved weights differ from the run by hand on {world} ranks by up to {gap(saved, want):.3g}: check "
            "the sampler (shuffle=True, seed=0), the loss (F.mse_loss), SGD's lr and --batch per rank.")  # fmt: skip
