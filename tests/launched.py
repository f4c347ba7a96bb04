"""What a script the tests launch imports, copied beside it: save this rank's result, leave together."""

import json
import os
import shutil
import sys
from pathlib import Path

from helpers import paths
from helpers.launching import RESULTS_ENV


def beside(script: Path) -> Path:
    """Copy this module next to ``script``, where the launched script imports it from (``import launched``)."""
    return Path(shutil.copyfile(__file__, Path(script).parent / "launched.py"))


def save_result(data) -> Path | None:
    """This rank's JSON-serialisable result, saved where the launch reads it back (``.results``)."""
    folder = os.environ.get(RESULTS_ENV)
    if not folder:
        return None
    rank = int(os.environ.get("RANK", "0"))
    return paths.write_atomic(Path(folder) / f"rank{rank}.json", json.dumps(data))


def exit_together() -> None:
    """The last line of a launched script: every rank leaves together, then the process ends.

    All ranks meet at a barrier and close the process group; then the process exits at once,
    skipping the interpreter's teardown, where a gloo background thread can still abort it
    ("terminate called without an active exception") after all the work is done and saved.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
