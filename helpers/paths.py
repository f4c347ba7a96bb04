"""Where things live (the repository, build/, what you train), and writing there safely.

Where things live: the repository, its notebooks, and build/ for everything a run produces; and writing
there safely (a whole file or none, one process at a time)."""

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def relative(path) -> str:
    """``path`` as a learner should read it: relative to the repository when it lies inside it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def from_here(path) -> str:
    """``path`` relative to the current folder (a notebook's own), for a cell magic such as ``%%writefile``."""
    return os.path.relpath(path)


def relative_text(text: str) -> str:
    """``text`` with this checkout's absolute paths written relative to it (``build/...``) and the home
    folder as ``~``: what a command or a log line says, without the recording machine's paths."""
    text = text.replace(f"{ROOT}{os.sep}", "").replace(str(ROOT), ".")
    home = str(Path.home())
    if home not in ("/", ""):
        text = text.replace(f"{home}{os.sep}", f"~{os.sep}")
    return text


def _from_environment(variable: str, default: Path) -> Path:
    """The folder ``$variable`` names, a relative one read from the repository root (the same folder
    whether a notebook's kernel, started in notebooks/, or a shell at the root reads it), or ``default``."""
    value = os.environ.get(variable)
    return (ROOT / value).resolve() if value else default.resolve()


def build_dir() -> Path:
    """The folder a run writes to: ``$COURSE_BUILD_DIR`` or ``build/`` in the repository."""
    return _from_environment("COURSE_BUILD_DIR", ROOT / "build")


def models_dir() -> Path:
    """Converted and generated models are kept here and reused across runs."""
    return _from_environment("COURSE_MODELS_DIR", ROOT / "build" / "models")


def shared_models_dir() -> Path | None:
    """Models built ahead by someone else and read from there, never written (``$COURSE_SHARED_MODELS_DIR``: a
    learner on a shared server reads the repository's build/models and builds what is missing in their own)."""
    value = os.environ.get("COURSE_SHARED_MODELS_DIR")
    return (ROOT / value).resolve() if value else None


def run_dir(*parts: str) -> Path:
    """A folder under build/ for one kind of output, created on first use."""
    path = build_dir().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def outputs_dir() -> Path:
    """Where what a learner trains lives (adapters, checkpoints, merged models); `make clean` keeps it."""
    return _from_environment("COURSE_OUTPUTS_DIR", ROOT / "build" / "outputs")


def new_output_dir(name: str) -> Path:
    """A fresh, numbered folder ``build/outputs/<name>/vN``: an earlier run is never overwritten."""
    parent = outputs_dir() / name
    parent.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[1:]) for p in parent.glob("v*") if p.name[1:].isdigit()]
    number = max(taken, default=0) + 1
    while True:
        folder = parent / f"v{number}"
        try:
            folder.mkdir()  # fails if another run took this number first
            return folder
        except FileExistsError:
            number += 1


def _version(folder: Path) -> int | None:
    name = folder.name
    return int(name[1:]) if folder.is_dir() and name.startswith("v") and name[1:].isdigit() else None


def recorded_versions() -> set[Path]:
    """Version folders that a ``latest-*.json`` record in build/outputs/ points into (never pruned)."""
    import json

    root = outputs_dir()
    kept: set[Path] = set()

    def walk(value):
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and value.startswith(str(root)):
            path = Path(value)
            for folder in (path, *path.parents):
                if _version(folder) is not None and folder.parent.parent == root:
                    kept.add(folder)
                    break

    for record in root.glob("latest-*.json"):
        walk(json.loads(record.read_text()))
    return kept


def real_files(folder, recursive: bool, keep=lambda path: True):
    """``(path, size)`` of every real file in ``folder`` (and below when ``recursive``) whose path ``keep``
    accepts, links followed.

    A hub cache is a folder of symbolic links into ``blobs/``: a link counts as the file it points to, each
    real file once however many links lead to it (same device and inode), and a dangling link not at all.
    """
    seen_files, seen_dirs = set(), set()
    for top, dirs, names in os.walk(folder, followlinks=True):
        here = os.stat(top)
        if (here.st_dev, here.st_ino) in seen_dirs:  # a linked folder already walked, or a loop
            dirs.clear()
            continue
        seen_dirs.add((here.st_dev, here.st_ino))
        if not recursive:
            dirs.clear()
        for name in sorted(names):
            path = Path(top) / name
            if not keep(path):
                continue
            try:
                stat = path.stat()  # follows links
            except OSError:  # a dangling link
                continue
            if (stat.st_dev, stat.st_ino) not in seen_files:
                seen_files.add((stat.st_dev, stat.st_ino))
                yield path, stat.st_size


def size_of(path: Path) -> int:
    """Bytes on disk under ``path`` (a file or a folder), links followed, each real file counted once."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(size for _, size in real_files(path, recursive=True))


def prune_outputs(keep: int, dry_run: bool = False) -> list[tuple[Path, int]]:
    """Delete all but the newest ``keep`` versions of each run in build/outputs/ (a version recorded as
    latest is always kept); returns what was (or, with ``dry_run``, would be) deleted, with its size."""
    import shutil

    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError(f"KEEP = {keep!r} must be a whole number of versions to keep, 0 or more.")
    root = outputs_dir()
    protected = recorded_versions()
    deleted = []
    for run in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        versions = sorted((v for v in run.iterdir() if _version(v) is not None), key=_version, reverse=True)
        for folder in versions[keep:]:
            if folder in protected:
                continue
            deleted.append((folder, size_of(folder)))
            if not dry_run:
                shutil.rmtree(folder)
    return deleted


# --- writing there safely ----------------------------------------------------------------------------


def write_atomic(path, text: str) -> Path:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one, never a part:
    a temporary sibling, renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def locked(path):
    """Hold an exclusive lock on ``path`` (a ``.<name>.lock`` file beside it) within the block: one process
    at a time builds or rewrites it."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def build_folder(
    target,
    build,
    *,
    problem=lambda folder: None if folder.is_dir() else "it does not exist",
    force: bool = False,
    log=None,
) -> bool:
    """Make the folder ``target`` with ``build(tmp)`` unless a complete one is there; True when it built.

    ``problem(target)`` says what is wrong with what is there (None: complete, reused). The build writes into
    a temporary sibling renamed to ``target`` only at the end, one process at a time: a build killed half-way
    leaves no ``target``, and the next build removes what the dead one left.
    """
    target = Path(target)
    with locked(target):
        for tmp in target.parent.glob(f".{target.name}.tmp-*"):
            pid = tmp.name.rsplit("-", 2)[-2]
            if not pid.isdigit() or not _process_alive(int(pid)):
                shutil.rmtree(tmp, ignore_errors=True)
        why = problem(target)
        if why is None and not force:
            if log:
                log(f"Reusing {relative(target)} (complete).")
            return False
        if target.exists():
            if log:
                log(f"Rebuilding {relative(target)}: {'rebuild requested' if why is None else why}.")
            shutil.rmtree(target)
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True


def read_jsonl(path) -> list[dict]:
    """The rows of a JSON-lines file."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(path, rows) -> Path:
    """Write rows as JSON lines, atomically (a temporary file renamed into place)."""
    return write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def script_from_lesson(folder, name: str, lesson: str) -> Path:
    """Write ``name``, a script lesson ``lesson`` (e.g. ``"04"``) writes with ``%%writefile``, into ``folder``
    from that notebook's own cell, so that a later lesson that builds on it also runs on its own."""
    notebook = next(iter(sorted(NOTEBOOKS.glob(f"{lesson}_*.ipynb"))), None)
    if notebook is None:
        raise ValueError(f"there is no notebook {lesson} in {relative(NOTEBOOKS)}; name one of its lessons.")
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        first, _, body = "".join(cell["source"]).partition("\n")
        if cell["cell_type"] == "code" and first.startswith("%%writefile") and first.endswith("/" + name):
            path = Path(folder) / name
            write_atomic(path, body if body.endswith("\n") else body + "\n")
            return path
    raise ValueError(f"{notebook.name} writes no script named {name}; name a script of its %%writefile cells.")
