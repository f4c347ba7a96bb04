"""Running notebooks: `make run`, `make refresh` and `make prune`, and the command line the Makefile calls.

``python -m course.runner run [--profile P] [--only 08 ...]``  executes every notebook in order with papermill
into build/executed/ and writes the run report, build/report.md and build/report.json (course/run_report.py).
``python -m course.runner refresh`` re-executes the notebooks and stores their outputs in place;
``prune --keep N`` deletes old versions of what was trained; ``gpu-check`` is course/gpu_check.py's.
Each notebook runs with a deadline on every stage, and what it left running is stopped (course/reap.py).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from course import metrics
from course.lessons import BUDGETS, CELL_TIMEOUT, course_notebooks, title_of
from course.reap import adopt_orphans, described, stop_children
from course.run_report import NotebookRun, write_report
from helpers import paths

# The other stages of a notebook's run, each with a deadline of its own so that none can hang the run: the
# kernel's start (papermill's start_timeout: it must answer within this), and closing the kernel's
# connections and stopping what the notebook left running (:func:`deadline`). A cell's: lessons.CELL_TIMEOUT.
KERNEL_START_TIMEOUT = 60
CLOSING_TIMEOUT = 60
DEADLINE_GRACE = 15  # seconds a stage past its deadline has to end; then the runner exits (status 124)
# A Unix socket's path holds at most 107 bytes (sun_path[108], with its closing NUL): the kernels' socket
# files live in a short folder of their own (:func:`socket_folder`), never under the checkout.
SOCKET_PATH_MAX = 107


class PeakMemory:
    """Samples the resident memory of this process's children (kernel and its launches), summed."""

    def __init__(self, interval: float = 0.25):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()

    def _sample(self):
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in me.children(recursive=True):
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@dataclass
class Job:
    """One notebook to execute: papermill's input and output, parameters, cell timeout, kernel folder."""

    notebook: Path
    out: Path
    parameters: dict
    cell_timeout: int
    cwd: Path | None = None  # None: notebooks/ (paths.NOTEBOOKS when it runs)
    kernel: str = "python3"


def _first_code_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    return source.strip().splitlines()[0] if source.strip() else ""


def socket_bases() -> list[Path]:
    """Where a kernel's socket folder may go, in order: $XDG_RUNTIME_DIR (this user's own), the temporary
    folder, /tmp."""
    found = [os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), "/tmp"]
    return [Path(base) for base in dict.fromkeys(found) if base]


def socket_folder() -> Path | None:
    """A fresh folder (mode 0700) for one kernel's socket files, in ``<base>/ddp-course-<uid>/`` for the first
    of :func:`socket_bases` where the socket paths fit in SOCKET_PATH_MAX bytes; None where none does.

    ``ddp-course-<uid>`` is used only when it is this user's own folder and no one else may write in it (a
    folder another user made there first is passed over)."""
    for base in socket_bases():
        parent = base / f"ddp-course-{os.getuid()}"
        if len(os.fsencode(parent / "k12345678" / "kernel-65535")) > SOCKET_PATH_MAX:
            continue
        try:
            parent.mkdir(mode=0o700, exist_ok=True)
            info = parent.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
                continue
            return Path(tempfile.mkdtemp(prefix="k", dir=parent))
        except OSError:
            continue
    return None


def _kernel_manager(opened: list):
    """A kernel manager class whose kernels talk over ZeroMQ's ipc transport, their socket files in a folder
    of their own from :func:`socket_folder` (removed by :func:`close_kernels`), or, where no such folder can
    be made, over TCP on 127.0.0.1 with CurveZMQ encryption; each manager and each client it makes is
    appended to ``opened``, for :func:`close_kernels`.

    Over plain TCP (jupyter_client's default) ipykernel warns at every start that it runs "over TCP without
    encryption", once per notebook of a run, and listens on ports any local user can reach; over ipc nothing
    listens on a port and there is nothing to warn about. The socket files are never put under the checkout:
    a Unix socket's path holds 107 bytes, which a clone at a long path (GitHub's runner puts a fork at
    /home/runner/work/<repo>/<repo>) would pass.
    """
    import zmq
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class CourseKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            self.socket_folder = socket_folder()
            super().__init__(**kwargs)
            opened.append(self)

        @default("transport")
        def _transport_default(self):
            return "ipc" if self.socket_folder else "tcp"

        @default("ip")
        def _ip_default(self):
            return str(self.socket_folder / "kernel") if self.socket_folder else "127.0.0.1"

        @default("transport_encryption")
        def _transport_encryption_default(self):
            return "disabled" if self.socket_folder or not zmq.has("curve") else "auto"

        def client(self, **kwargs):
            made = super().client(**kwargs)
            opened.append(made)
            return made

    return CourseKernelManager


_CHANNELS = ("_shell_channel", "_iopub_channel", "_stdin_channel", "_hb_channel", "_control_channel")


def close_kernels(opened: list) -> None:
    """Close every kernel client and manager in ``opened`` (:func:`_kernel_manager`): their channels, their
    ZeroMQ contexts (at once: linger 0) and the kernel's socket folder.

    papermill closes them itself when a notebook ends normally; where a client failed to connect (a socket
    path past 107 bytes), its context was left open, and the garbage collector, running in whatever the
    runner did next (the next notebook), hung in that context's ``term()``, which no signal ends.
    """
    for thing in reversed(opened):  # the clients, made after their manager, first
        values = thing._trait_values  # what was made: reading a trait would make a missing one
        for name in _CHANNELS:
            channel = values.get(name)
            try:
                if channel is not None and channel.is_alive():
                    channel.stop()
            except Exception:  # a channel that never connected
                pass
        context = values.get("context")
        if context is not None and getattr(thing, "_created_context", False) and not context.closed:
            context.destroy(linger=0)
        folder = getattr(thing, "socket_folder", None)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    opened.clear()


class StageTimeout(Exception):
    """A stage of a notebook's run (:func:`deadline`) did not end in time; the message says which."""


def _raise_in(thread_id: int, exception) -> None:
    """Have ``exception`` (a class, or None to take it back) raised in the thread ``thread_id`` at its next
    Python instruction."""
    import ctypes

    raised = ctypes.py_object(exception) if exception else None  # None: NULL, which takes a pending one back
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), raised)


@contextlib.contextmanager
def deadline(seconds: float, sentence: str, grace: float = DEADLINE_GRACE):
    """Run the block with a deadline: past ``seconds``, ``sentence`` is printed (one line, to stderr) and
    the block ends with :class:`StageTimeout` (``sentence``). Where it cannot end, being stuck outside Python
    (in a C call that no signal interrupts), everything this process started is stopped after ``grace``
    more seconds and the process exits with status 124."""
    me, lock, state = threading.get_ident(), threading.Lock(), {"over": False, "fired": False}
    done = threading.Event()

    class PastDeadline(StageTimeout):  # raised as a class (made with no arguments): it knows its sentence
        def __init__(self):
            super().__init__(sentence)

    def watch():
        if done.wait(seconds):
            return
        with lock:
            if state["over"]:
                return
            state["fired"] = True
            print(f"error: {sentence}", file=sys.stderr, flush=True)
            _raise_in(me, PastDeadline)
        if not done.wait(grace):
            stop_children()
            os._exit(124)

    watcher = threading.Thread(target=watch, daemon=True, name="deadline")
    watcher.start()
    try:
        yield
    finally:
        with lock:
            state["over"] = True
            if state["fired"]:
                _raise_in(me, None)  # not yet delivered: taken back
        done.set()
        watcher.join()


def execute(
    notebook: Path,
    out: Path,
    parameters: dict,
    progress: bool = True,
    cell_timeout: int = CELL_TIMEOUT["cpu"],
    cwd: Path | None = None,
    kernel: str = "python3",
) -> NotebookRun:
    """Run one notebook with papermill (kernel working directory: ``cwd``, notebooks/ by default); whatever
    its launches left running when it ends (a cell timed out, the kernel died) is stopped. The kernel's
    connections are closed, and a stage past its deadline (the kernel's start, a cell, closing) fails the
    notebook with one sentence."""
    import nbformat
    import papermill as pm

    run = NotebookRun(name=notebook.stem, title=title_of(json.loads(notebook.read_text())))
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    opened = []
    with PeakMemory() as memory:
        before = {child.pid for child in psutil.Process().children()}
        try:
            pm.execute_notebook(
                str(notebook),
                str(out),
                parameters=parameters or None,
                cwd=str(cwd or paths.NOTEBOOKS),
                kernel_name=kernel,
                progress_bar=progress,
                execution_timeout=cell_timeout,
                start_timeout=KERNEL_START_TIMEOUT,
                kernel_manager_class=_kernel_manager(opened),
            )
            run.status = "passed"
        except pm.PapermillExecutionError as exc:
            run.status = "failed"
            run.error = {
                "cell": exc.exec_count,
                "line": _first_code_line(exc.source),
                "error": exc.ename,
                "message": str(exc.evalue).strip().splitlines()[0] if str(exc.evalue).strip() else "",
            }
        except Exception as exc:  # kernel died, timeout, unreadable notebook
            run.status = "failed"
            run.error = {
                "cell": None,
                "line": "",
                "error": type(exc).__name__,
                "message": (str(exc).splitlines() or [""])[0],
            }
        finally:  # on Ctrl-C too, before the run stops what the notebook started
            try:
                with deadline(CLOSING_TIMEOUT, _closing_sentence(notebook)):
                    close_kernels(opened)
            except StageTimeout as exc:
                run.status, run.error = "failed", _stage_error(exc)
        try:
            with deadline(CLOSING_TIMEOUT, _closing_sentence(notebook)):
                still = described(c for c in psutil.Process().children() if c.pid not in before)
                left = stop_children(exclude=before)  # the kernel is gone: what still runs was left behind
                gc.collect()  # any other ZeroMQ context left to the collector goes here, within the deadline
        except StageTimeout as exc:
            still, left = "", 0
            run.status, run.error = "failed", _stage_error(exc)
    if left and run.status == "passed":
        print(f"{notebook.name}: {left} process(es) it left running were stopped: {still}", flush=True)
    run.seconds = round(time.perf_counter() - start, 1)
    run.peak_memory_mb = round(memory.peak / 2**20, 1)
    run.executed = str(out)
    if out.exists():
        run.metrics = metrics.collect(nbformat.read(out, as_version=4))
    return run


def _closing_sentence(notebook: Path) -> str:
    return (
        f"Closing {notebook.name}'s kernel and what it left running did not end within {CLOSING_TIMEOUT} s; "
        "the run stopped waiting for it."
    )


def _stage_error(exc: StageTimeout) -> dict:
    """A run's ``error`` for a stage past its deadline: the stage's one sentence."""
    return {"cell": None, "line": "", "error": "StageTimeout", "message": str(exc)}


def running_cell(executed: Path) -> tuple[int | None, str]:
    """The cell a stopped run was in, from its partly executed notebook: (number, first code line).

    papermill saves the output notebook each time a cell starts (``cell_start``), stamping the cell's
    ``metadata.papermill.start_time``; the cells after it have none. The number counts code cells from
    1, as the execution counts of a fresh run do (the injected-parameters cell included).
    """
    import nbformat

    try:
        nb = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return None, ""
    code = [c for c in nb.cells if c.cell_type == "code"]
    started = [n for n, c in enumerate(code, 1) if c.metadata.get("papermill", {}).get("start_time")]
    if not started:
        return None, ""
    return started[-1], _first_code_line(code[started[-1] - 1].source)


def _terminated(signum, frame):
    """SIGTERM (``kill``, a CI job cancelled) stops a run as Ctrl-C does: while the kernel still lives, so
    that what its cells started in sessions of their own (the Web-UI, torchrun's workers) is stopped too."""
    raise KeyboardInterrupt("SIGTERM")


def _interrupted(notebook: Path, out: Path, seconds: float) -> NotebookRun:
    """Ctrl-C or SIGTERM during ``notebook``: stop everything it started and say where it stopped."""
    stopped = stop_children()
    cell, line = running_cell(out)
    run = NotebookRun(name=notebook.stem, title=title_of(json.loads(notebook.read_text())))
    run.status, run.seconds = "interrupted", round(seconds, 1)
    run.executed = str(out) if out.exists() else ""
    run.error = {
        "cell": cell,
        "line": line,
        "error": "KeyboardInterrupt",
        "message": f"stopped by Ctrl-C (SIGINT) or SIGTERM; {stopped} process(es) it had started were stopped.",
    }
    return run


def outputs_summary() -> str:
    """One line: how much disk what you trained takes (build/outputs), and how to prune it."""
    folder = paths.outputs_dir()
    size = paths.size_of(folder) if folder.is_dir() else 0
    shown = os.path.relpath(folder, paths.ROOT) if folder.is_relative_to(paths.ROOT) else folder
    return (
        f"Outputs: {shown}/ holds {size / 1e9:.2f} GB; `make prune KEEP=2` deletes all but the newest "
        "2 versions of each run."
    )


def prune(keep: int, dry_run: bool = False) -> int:
    """``make prune KEEP=N``: list and delete old versions in build/outputs/, keeping what is latest."""
    deleted = paths.prune_outputs(keep, dry_run)
    verb = "Would delete" if dry_run else "Deleted"
    for folder, size in deleted:
        print(f"{verb} {folder} ({size / 1e6:.0f} MB)")
    total = sum(size for _, size in deleted)
    print(
        f"{verb} {len(deleted)} version(s), {total / 1e9:.2f} GB; kept the newest {keep} of each run "
        "and every version a latest-*.json record names."
    )
    print(outputs_summary())
    return 0


def _setup_note() -> str:
    record = paths.ROOT / ".venv" / ".course-setup.json"
    if record.is_file():
        info = json.loads(record.read_text())
        return f"the virtual environment was installed in {info['seconds']} s on {info['date']}"
    return ""


def _provide_model(profile: str) -> str:
    """Convert the cpu model before the notebooks run, so its one-time cost is reported apart."""
    from helpers import models, profiles

    chosen = profiles.resolve(profile).name
    if chosen not in ("cpu", "smoke"):
        return ""
    start = time.perf_counter()
    target = paths.models_dir() / (models.SMOLLM2_DIR if chosen == "cpu" else models.SMOKE_DIR)
    reused = models.check(target) is None
    print(f"Making the {chosen} model available ...", flush=True)
    info = models.smollm2() if chosen == "cpu" else models.tiny_llama()
    took = time.perf_counter() - start
    return f"{info.name} {'reused' if reused else f'converted in {took:.0f} s'} ({info.path})"


def run_course(
    profile: str = "auto", only=None, build: Path | None = None, progress: bool = True, jobs=None
) -> int:
    """Execute the notebooks into ``build`` with only PROFILE passed, or, when given, the :class:`Job` s
    ``jobs`` (``make gpu-check``: each with its own parameters and timeout). Returns the exit status."""
    build = Path(build or paths.build_dir()).resolve()
    build.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_BUILD_DIR"] = str(build)  # the notebooks' own outputs go there too
    from helpers import profiles

    if jobs is None:
        chosen = profiles.resolve(profile).name
        parameters = {} if profile == "auto" else {"PROFILE": profile}
        jobs = [Job(nb, build / "executed" / nb.name, parameters, CELL_TIMEOUT[chosen]) for nb in course_notebooks(only)]
    else:
        chosen = profile
    if not jobs:
        print(f"No notebooks match {only}.", file=sys.stderr)
        return 2
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    model_note = _provide_model(profile)
    runs = []
    interrupted = None
    for i, job in enumerate(jobs, 1):
        notebook, out = job.notebook, job.out
        print(f"[{i}/{len(jobs)}] {notebook.name} ...", flush=True)
        started_at = time.perf_counter()
        try:
            run = execute(notebook, out, job.parameters, progress, job.cell_timeout, job.cwd, job.kernel)
        except KeyboardInterrupt:
            interrupted = _interrupted(notebook, out, time.perf_counter() - started_at)
            runs.append(interrupted)
            runs += [
                NotebookRun(name=j.notebook.stem, title=title_of(json.loads(j.notebook.read_text()))) for j in jobs[i:]
            ]
            break
        run.budget_seconds = BUDGETS.get(notebook.name[:2], {}).get(chosen)
        mark = "ok" if run.status == "passed" else "FAILED"
        print(f"[{i}/{len(jobs)}] {notebook.name}: {mark} in {run.seconds:.0f} s", flush=True)
        runs.append(run)
    context = {
        "profile": chosen,
        "started": started,
        "total_seconds": round(time.perf_counter() - t0, 1),
        "setup": _setup_note(),
        "model": model_note,
    }
    md, js = write_report(build, runs, context)
    print(f"\nReport: {md}\n        {js}\nExecuted notebooks: {build / 'executed'}")
    print(outputs_summary())
    if interrupted:
        e = interrupted.error
        print(
            f"INTERRUPTED: {interrupted.name}, cell {e['cell']} (`{e['line']}`), after "
            f"{interrupted.seconds:.0f} s; {e['message']} The notebooks after it did not run.",
            file=sys.stderr,
        )
        return 130  # the shell's code for "stopped by SIGINT"
    failed = [r for r in runs if r.status == "failed"]
    for r in failed:
        e = r.error or {}
        print(
            f"FAILED: {r.name}, cell {e.get('cell')} (`{e.get('line', '')}`): "
            f"{e.get('error')}: {e.get('message')}",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _clean_metadata(path: Path, run: NotebookRun | None = None, profile: str = "") -> None:
    """Drop per-run timestamps so that a refresh only changes what the notebook shows; keep the run's
    profile, wall time and peak memory (the site's syllabus and run report show them)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("papermill", None)
    if run is not None:
        nb.metadata["course_run"] = {"profile": profile, "seconds": round(run.seconds),
                                     "peak_memory_mb": round(run.peak_memory_mb)}  # fmt: skip
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)


def refresh(only=None) -> int:
    """Re-execute notebooks (default profile) and store the outputs in notebooks/ when they pass."""
    from helpers import profiles

    build = paths.run_dir("refresh")
    status = 0
    for notebook in course_notebooks(only):
        print(f"Refreshing {notebook.name} ...", flush=True)
        run = execute(notebook, build / notebook.name, {}, progress=True)  # the cpu profile's cell timeout
        if run.status != "passed":
            e = run.error or {}
            print(f"FAILED: {notebook.name}, cell {e.get('cell')}: {e.get('error')}: {e.get('message')}")
            status = 1
            continue
        shutil.copyfile(build / notebook.name, notebook)
        _clean_metadata(notebook, run, profiles.resolve("auto").name)
        print(f"{notebook.name}: outputs stored ({run.seconds:.0f} s)")
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="execute the course into build/")
    run_p.add_argument("--profile", default=os.environ.get("PROFILE", "auto"))
    run_p.add_argument("--only", nargs="*", help="notebook numbers, e.g. 08 09")
    run_p.add_argument("--build", type=Path, default=None, help="output folder (default build/)")
    run_p.add_argument("--no-progress", action="store_true")
    ref = sub.add_parser("refresh", help="re-execute notebooks and keep their outputs in notebooks/")
    ref.add_argument("--only", nargs="*")
    check = sub.add_parser("gpu-check", help="the gpu profile of 03-06, 09-12 on a tiny Qwen2 (needs CUDA)")
    check.add_argument("--dry", action="store_true", help="print the commands (for 1 and 8 GPUs); needs no GPU")
    check.add_argument("--nproc", default="", help="processes per launch; default: one per GPU (1 on the CPU)")
    check.add_argument("--shape-on-cpu", action="store_true", help="the gpu shape on the CPU (gloo, no CUDA)")
    check.add_argument("--only", nargs="*", help="some notebook numbers, e.g. 09 10 (make gpu-check runs all)")
    check.add_argument("--pretend", default=None, help="with --shape-on-cpu: torch believes this card is there")
    pr = sub.add_parser("prune", help="delete all but the newest KEEP versions of each run in build/outputs/")
    pr.add_argument("--keep", required=True)
    pr.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    adopt_orphans()  # a launch whose kernel died comes back to this process, which stops it
    if args.command == "gpu-check":
        if args.nproc and not (args.nproc.isdigit() and int(args.nproc) >= 1):
            print(f"error: NPROC = {args.nproc!r} must be a whole number of processes, 1 or more, e.g. NPROC=2.",
                  file=sys.stderr)  # fmt: skip
            return 2
        from course import gpu_check

        signal.signal(signal.SIGTERM, _terminated)
        try:
            return gpu_check.run(args.dry, int(args.nproc) if args.nproc else None, args.shape_on_cpu, args.only,
                                 args.pretend or None)  # fmt: skip
        except KeyboardInterrupt:
            stop_children()
            return 130
    if args.command == "prune":
        if not args.keep.isdigit():
            print(
                f"error: KEEP = {args.keep!r} must be a whole number of versions to keep, e.g. KEEP=2.",
                file=sys.stderr,
            )
            return 2
        return prune(int(args.keep), args.dry_run)
    from helpers.launching import interruptible

    interruptible()  # Ctrl-C must stop the run even when the parent started it with SIGINT ignored
    signal.signal(signal.SIGTERM, _terminated)
    if args.command == "refresh":
        try:
            return refresh(args.only)
        except KeyboardInterrupt:
            print(f"refresh stopped; {stop_children()} process(es) it had started were stopped.", file=sys.stderr)
            return 130
    from helpers.errors import CourseError

    try:
        return run_course(args.profile, args.only, args.build, not args.no_progress)
    except CourseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
