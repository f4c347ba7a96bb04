"""Execute the course: every notebook in order with papermill, then HTML pages and a run report.

``python -m course.runner run [--profile P] [--only 08 ...]``  executes into build/executed/,
renders build/html/ and build/index.html, writes build/report.md and build/report.json.
``python -m course.runner refresh`` re-executes the notebooks and stores their outputs in place.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import html
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from course import metrics
from helpers import paths

# Seconds one cell may run, by profile: longer than the longest launch timeout a cell gives on that profile
# (notebook 09: 600 s on cpu, 240 s on smoke, 3600 s on gpu), so that a launch's own timeout, which
# names the job and prints its last lines, always fires first.
CELL_TIMEOUT = {"cpu": 1200, "smoke": 600, "gpu": 7200}
# The other stages of a notebook's run, each with a deadline of its own so that none can hang the run: the
# kernel's start (papermill's start_timeout: it must answer within this), closing the kernel's connections
# and stopping what the notebook left running, and rendering its HTML page (:func:`deadline`).
KERNEL_START_TIMEOUT = 60
CLOSING_TIMEOUT = 60
HTML_TIMEOUT = 120
DEADLINE_GRACE = 15  # seconds a stage past its deadline has to end; then the runner exits (status 124)
# A Unix socket's path holds at most 107 bytes (sun_path[108], with its closing NUL): the kernels' socket
# files live in a short folder of their own (:func:`socket_folder`), never under the checkout.
SOCKET_PATH_MAX = 107
# Wall-time budgets in seconds per notebook number and profile; the report compares against them.
BUDGETS = {
    "00": {"cpu": 30, "smoke": 30},
    "01": {"cpu": 120, "smoke": 30},
    "02": {"cpu": 120, "smoke": 30},
    "03": {"cpu": 60, "smoke": 30},
    "04": {"cpu": 120, "smoke": 45},
    "05": {"cpu": 90, "smoke": 45},
    "06": {"cpu": 180, "smoke": 45},
    "07": {"cpu": 150, "smoke": 45},  # the network lab: one launch per link rate
    "08": {"cpu": 60, "smoke": 60},
    "09": {"cpu": 300, "smoke": 60},  # the fine-tune: 5 minutes; 10-12 2 minutes each
    "10": {"cpu": 120, "smoke": 60},
    "11": {"cpu": 120, "smoke": 60},
    "12": {"cpu": 120, "smoke": 60},
}
COURSE_BUDGET = {"cpu": 15 * 60}  # every notebook in `make run`, set-up excluded


def course_notebooks(only=None) -> list[Path]:
    """notebooks/NN_*.ipynb in course order, optionally only those whose number is in ``only``."""
    found = sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        found = [nb for nb in found if nb.name[:2] in {o.zfill(2) for o in only}]
    return found


def title_of(notebook: dict) -> str:
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


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
class NotebookRun:
    name: str
    title: str
    status: str = "not run"
    seconds: float = 0.0
    peak_memory_mb: float = 0.0
    metrics: list = field(default_factory=list)
    error: dict | None = None
    budget_seconds: float | None = None
    executed: str = ""
    html: str = ""


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
    runner did next (rendering the next page), hung in that context's ``term()``, which no signal ends.
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
    os.environ["COURSE_NOTEBOOK"] = notebook.stem
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
                still = _described(c for c in psutil.Process().children() if c.pid not in before)
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


def _described(processes) -> str:
    """What the processes are, by the start of their command lines, for a message: the program by its name
    alone (``python``, not a long checkout's path to its .venv), then the first arguments, which say what
    it is."""
    said = []
    for proc in processes:
        try:
            words = proc.cmdline()[:4]
            said.append(" ".join([os.path.basename(words[0]), *words[1:]])[:120] if words else proc.name())
        except psutil.Error:
            continue
    return "; ".join(said) or "(gone before they could be named)"


def stop_children(exclude=()) -> int:
    """Stop every process this one started (the kernel and whatever it launched), but those in ``exclude``
    (pids); how many stopped. Where the runner is a subreaper (:func:`adopt_orphans`), that includes what a
    dead kernel's launches left behind."""
    from helpers.launching import kill_tree

    return sum(kill_tree(child.pid) for child in psutil.Process().children() if child.pid not in exclude)


def adopt_orphans() -> bool:
    """Make this process the subreaper of everything below it (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a
    launch whose kernel died (a cell timeout shuts the kernel down, and torchrun's workers run in sessions of
    their own) is then reparented here rather than to init, so :func:`stop_children` still finds it."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # 36: PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


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


def render_html(executed: Path, target: Path) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(body, encoding="utf-8")


def _value(metric: dict) -> str:
    value = metric["value"]
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return f"{text} {metric['unit']}".strip()


def _cell(text) -> str:
    """Text safe inside a Markdown table cell: a ``|`` would start a new column, a newline a new row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_report(build: Path, runs: list[NotebookRun], context: dict) -> tuple[Path, Path]:
    data = {**context, "notebooks": [asdict(r) for r in runs]}
    (build / "report.json").write_text(json.dumps(data, indent=2, ensure_ascii=False))
    lines = [
        "# Run report",
        "",
        f"Profile: **{context['profile']}** · started {context['started']} · "
        f"total {context['total_seconds']:.0f} s · {sum(r.status == 'passed' for r in runs)}/{len(runs)} passed",
        "",
    ]
    for key, label in (("setup", "Set-up"), ("model", "Model")):
        if context.get(key):
            lines += [f"{label}: {context[key]}", ""]
    lines += ["| notebook | status | wall time | budget | peak memory |", "|---|---|---|---|---|"]
    for r in runs:
        budget = "-"
        if r.budget_seconds:
            budget = f"{r.budget_seconds:.0f} s {'✅' if r.seconds <= r.budget_seconds else '⚠️ over'}"
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.1f} s | {budget} | {r.peak_memory_mb:.0f} MB |")
    course_budget = COURSE_BUDGET.get(context["profile"])
    if course_budget and len(runs) == len(BUDGETS):
        within = "within" if context["total_seconds"] <= course_budget else "OVER"
        lines += [
            "",
            f"Whole course: {context['total_seconds']:.0f} s, {within} the {course_budget} s budget.",
        ]
    for r in runs:
        lines += ["", f"## {r.name}: {r.title}", ""]
        if r.error:
            e = r.error
            what = "Interrupted" if r.status == "interrupted" else "Failed"
            lines.append(f"**{what}** in cell {e['cell']} (`{e['line']}`): {e['error']}: {e['message']}")
            lines.append("")
        if r.metrics:
            lines += ["| metric | value | note |", "|---|---|---|"]
            lines += [
                f"| {_cell(m['name'])} | {_cell(_value(m))} | {_cell(m.get('note', ''))} |" for m in r.metrics
            ]
        elif not r.error:
            lines.append("(no metrics recorded)")
    (build / "report.md").write_text("\n".join(lines) + "\n")
    return build / "report.md", build / "report.json"


def write_index(build: Path, runs: list[NotebookRun]) -> Path:
    rows = []
    for r in runs:
        link = (
            f'<a href="{html.escape(os.path.relpath(r.html, build))}">{html.escape(r.name)}</a>'
            if r.html
            else r.name
        )
        colour = "#1a7f37" if r.status == "passed" else "#cf222e"
        rows.append(
            f"<tr><td>{link}</td><td>{html.escape(r.title)}</td>"
            f'<td style="color:{colour}">{r.status}</td><td>{r.seconds:.0f} s</td></tr>'
        )
    page = (
        "<!doctype html><meta charset='utf-8'><title>Data-parallel training course</title>"
        "<style>body{font-family:sans-serif;max-width:56em;margin:2em auto}td,th{padding:.3em 1em;"
        "text-align:left}</style><h1>Data-parallel training: from first principles to SWIFT</h1>"
        "<p>Executed notebooks, in course order. The run report: <a href='report.md'>report.md</a>"
        " · <a href='report.json'>report.json</a></p><table><tr><th>notebook</th><th>title</th>"
        "<th>status</th><th>time</th></tr>" + "".join(rows) + "</table>"
    )
    (build / "index.html").write_text(page, encoding="utf-8")
    return build / "index.html"


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
        if Path(run.executed).exists():
            run.html = str(build / "html" / f"{notebook.stem}.html")
            rendering = (
                f"Rendering {notebook.name}'s HTML page did not end within {HTML_TIMEOUT} s; "
                "the run goes on without it."
            )
            try:
                with deadline(HTML_TIMEOUT, rendering):
                    render_html(Path(run.executed), Path(run.html))
            except StageTimeout:
                run.html = ""
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
    index = write_index(build, runs)
    print(f"\nReport: {md}\n        {js}\nPages:  {index}")
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


# `make gpu-check`: the gpu profile of 03-06 and 09-12 on a tiny Qwen2 built on the spot (no download,
# no network), a few steps each, on a machine with CUDA. MODEL is added where a notebook has it.
GPU_CHECK = {
    # 04 and 05: 12 MiB of gradients, 3 buckets of 4 MiB (fewer would leave nothing to overlap); 03-06 run
    # their ranks on the CPU on every machine, and their one GPU cell with these sizes on 2 GPUs or more.
    # 01, 02 and 07 have no gpu path worth the minutes: 02's DataParallel cell needs torch's own CUDA.
    "03": {"LARGEST_MIB": 16},
    "04": {"WIDTH": 512, "DEPTH": 12, "ITERS": 3, "BATCH": 64},
    "05": {"WIDTH": 512, "DEPTH": 12, "ITERS": 3, "BATCH": 64, "BENCH_STEPS": 8},
    "06": {"BATCH": 32, "HIDDEN": 512, "BENCH_STEPS": 8},
    # 09: the path, not the finding; the Web-UI has no gpu path (the notebooks stage starts it on smoke)
    "09": {"DATASETS": "course", "STEPS": 4, "ABLATION_STEPS": 1, "SEEDS": [1], "WEBUI": False},
    "10": {"MAX_TOKENS": 16},
    # 11: the tiny model needs smoke's headroom; the ZeRO-2 preset's failure without --use_cpu happens only on
    # CPUs (a GPU skips that cell; the shape on a CPU would run it, for nothing gpu-check looks at)
    "11": {"HEADROOM_PERCENT": 150, "STEPS": 4, "SWIFT_STEPS": 2, "SHOW_CPU_PITFALL": False},
    "12": {"SWIFT_STEPS": 2, "HUB_WAIT": 2},  # the hub wait has no device in it
}
GPU_CHECK_BUDGET = 8 * 60  # seconds on one GPU
PRETEND_SITE = Path(__file__).parent / "pretend"  # its sitecustomize makes torch believe in a GPU (tests)
# Its own limits: a hang in an 8-minute check must cost minutes, not the hour a full gpu run allows a launch.
GPU_CHECK_LAUNCH_TIMEOUT = 300  # seconds any one launch may run (COURSE_LAUNCH_TIMEOUT caps every launch)
GPU_CHECK_CELL_TIMEOUT = 900  # seconds a cell may run: longer than a launch, so a launch's own timeout fires first
_PAPERMILL_TYPES = (bool, int, float, type(None))


def parameter_names(notebook: Path) -> set[str]:
    """The names a notebook's ``parameters`` cell assigns."""
    import ast

    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    return {
        t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign) for t in node.targets
    }


def gpu_check_parameters(notebook: Path, nproc: int, model: str) -> dict:
    """The papermill parameters ``make gpu-check`` gives ``notebook`` for ``nproc`` GPUs."""
    names = parameter_names(notebook)
    given = {"PROFILE": "gpu", "NPROC": nproc, "MODEL": model, **GPU_CHECK[notebook.name[:2]]}
    unknown = set(GPU_CHECK[notebook.name[:2]]) - names
    if unknown:
        raise ValueError(
            f"{notebook.name} has no parameter {sorted(unknown)}; GPU_CHECK must name real ones."
        )
    return {k: v for k, v in given.items() if k in names}


def papermill_options(parameters: dict) -> list[str]:
    """``-p NAME value`` where papermill's command line reads the value back as it is (numbers, True/False,
    None, plain words), else ``-y 'NAME: <JSON>'`` (lists, and strings papermill would read as numbers):
    ``-p SEEDS '[1]'`` would reach the notebook as the string '[1]'."""
    from papermill.cli import _resolve_type

    words = []
    for name, value in parameters.items():
        if isinstance(value, _PAPERMILL_TYPES) and _resolve_type(str(value)) == value:
            words += ["-p", name, str(value)]
        elif isinstance(value, str) and _resolve_type(value) == value:
            words += ["-p", name, value]
        else:
            words += ["-y", f"{name}: {json.dumps(value, ensure_ascii=False)}"]
    return words


def gpu_check_folder() -> Path:
    """Where ``make gpu-check`` writes everything (executed notebooks, outputs, its tiny model): a folder of
    its own, so that it never touches the learner's own gpu record, adapters or models."""
    return paths.build_dir() / "gpu-check"


def gpu_check_env(shape_on_cpu: bool = False, pretend: str | None = None, nproc: int = 1) -> dict[str, str]:
    """The environment every notebook of ``make gpu-check`` runs in (paths relative to the repository).
    ``pretend`` (the gpu shape only): torch believes ``nproc`` such cards are there (course/pretend/) in the
    kernel and in every process meant for the CPU."""
    from helpers import devices, launching, profiles

    folder = Path(paths.relative(gpu_check_folder()))
    env = {
        "COURSE_BUILD_DIR": str(folder),
        "COURSE_OUTPUTS_DIR": str(folder / "outputs"),
        "COURSE_MODELS_DIR": str(folder / "models"),
        launching.LAUNCH_TIMEOUT_CAP: str(GPU_CHECK_LAUNCH_TIMEOUT),
    }
    if shape_on_cpu:
        env[profiles.GPU_SHAPE_ON_CPU] = "1"
    if pretend:
        env[devices.PRETEND_ENV] = f"{pretend}:{nproc}"
        env["PYTHONPATH"] = os.pathsep.join([str(PRETEND_SITE), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def gpu_check_script(nproc: int, shape_on_cpu: bool = False, illustrate_seed: bool = True, pretend: str | None = None) -> str:
    """What ``make gpu-check`` runs on ``nproc`` GPUs, as a shell script to run from the repository root: the
    environment, then one papermill command per notebook of GPU_CHECK. ``make gpu-check`` runs exactly these
    lines (:func:`run_script` reads them with papermill's own command line), and ``DRY=1`` prints them.
    ``illustrate_seed`` adds, as comments, the ``swift sft`` notebook 09 runs with the seed's model and recipe."""
    import shlex

    from helpers import models, profiles, sft

    env = gpu_check_env(shape_on_cpu, pretend, nproc)
    folder = Path(env["COURSE_BUILD_DIR"])
    where = "in its gpu shape on the CPU" if shape_on_cpu else f"on {nproc} GPU{'s' if nproc > 1 else ''}"
    if pretend:
        where += f", torch pretending {nproc} {pretend} card{'s' if nproc > 1 else ''}"
    lines = [
        f"# make gpu-check {where}: the gpu profile on a tiny Qwen2 built on the spot, from the repository root",
        "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()),
    ]
    model = paths.ROOT / env["COURSE_MODELS_DIR"] / models.TINY_QWEN2_DIR  # absolute where it lies outside
    model = os.path.relpath(model, paths.NOTEBOOKS) if model.is_relative_to(paths.ROOT) else str(model)
    for notebook in course_notebooks(GPU_CHECK):
        argv = [
            "papermill",
            os.path.relpath(notebook, paths.ROOT),
            str(folder / "executed" / notebook.name),
            "--cwd",
            "notebooks",  # the kernel starts there, as in JupyterLab; MODEL is relative to it
            "--execution-timeout",
            str(GPU_CHECK_CELL_TIMEOUT),
            "-k",
            "python3",
            *papermill_options(gpu_check_parameters(notebook, nproc, model)),
        ]
        lines.append(shlex.join(argv))
    if illustrate_seed:
        seed = models.ModelInfo(
            name=profiles.GPU_DEFAULT_MODEL, path=profiles.GPU_DEFAULT_MODEL, source="ModelScope"
        )
        plan, note = sft.seed_recipe(
            seed, nproc, output_dir="build/outputs/self-cognition-seed", model_name=("小课", "XiaoKe"),
            model_author=("并行训练营", "Parallel Training Camp"), inherit=False,
        )  # fmt: skip
        shown = f"# and what notebook 09 runs on {nproc} GPU{'s' if nproc > 1 else ''} with the seed's model and recipe"
        lines.append(shown + (f" ({note})" if note else "") + ":")
        lines += ["#   " + line for line in sft.shell_command(plan).splitlines()]
    return "\n".join(lines) + "\n"


def papermill_call(command: str) -> dict:
    """The keywords papermill's command line gives ``papermill.execute_notebook`` for ``command`` (one
    line, as a shell splits it), found by running papermill's own command line with its execution
    intercepted: the printed text, read exactly as ``papermill`` would read it."""
    import shlex
    from unittest import mock

    import papermill.cli

    words = shlex.split(command)
    if not words or words[0] != "papermill":
        raise ValueError(f"not a papermill command: {command!r}")
    seen = {}
    with mock.patch.object(papermill.cli, "execute_notebook", lambda **kw: seen.update(kw)):
        papermill.cli.papermill.main(args=words[1:], prog_name="papermill", standalone_mode=False)
    return seen


def read_script(text: str) -> tuple[dict[str, str], list[dict]]:
    """(environment, papermill calls) of a :func:`gpu_check_script`: its ``export`` lines and, for each
    ``papermill`` line, :func:`papermill_call`; comment lines are skipped. Any other line is refused."""
    import shlex

    env, calls = {}, []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("export "):
            env.update(word.split("=", 1) for word in shlex.split(line)[1:])
        elif line.startswith("papermill "):
            calls.append(papermill_call(line))
        else:
            raise ValueError(f"a gpu-check script holds exports and papermill lines only, not {line!r}")
    return env, calls


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """``os.environ`` with ``env`` set within the block, as it was after."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def gpu_python_problem() -> str | None:
    """Why this Python cannot run ``make gpu-check`` on a GPU, in one sentence with the fix; None if it can."""
    import importlib.util

    from helpers import profiles

    missing = [name for name in ("papermill", "nbformat", "swift", "deepspeed") if importlib.util.find_spec(name) is None]
    if importlib.util.find_spec("torch") is None:
        missing.insert(0, "torch")
    if missing:
        return (
            f"make gpu-check: {sys.executable} lacks {', '.join(missing)}; install the course beside a CUDA build "
            "of torch with `COURSE_KEEP_TORCH=1 make setup` (docs/gpu.md), or set GPU_PYTHON to a python that "
            "has them."
        )
    import torch

    if torch.version.cuda is None:
        return (
            f"make gpu-check: the torch of {sys.executable} is {torch.__version__}, a CPU build "
            "(torch.version.cuda is None), so it sees no GPU; make .venv with the image's CUDA torch "
            "(`COURSE_KEEP_TORCH=1 make setup`, docs/gpu.md), or check the gpu path on the CPU with "
            "`make gpu-check SHAPE_ON_CPU=1 NPROC=1`."
        )
    from helpers import environment

    unusable = environment.cuda_problem()  # first: torch says why only the first time it is asked
    if unusable:
        return f"make gpu-check: {unusable}"
    if not profiles.count_gpus():
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        return (
            f"make gpu-check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"
            + (f" (CUDA_VISIBLE_DEVICES={shown!r})" if shown is not None else "")
            + "; check `nvidia-smi`, or check the gpu path on the CPU with `make gpu-check SHAPE_ON_CPU=1 NPROC=1`."
        )
    return None


def gpu_check(
    dry: bool = False, nproc: int | None = None, shape_on_cpu: bool = False, only=None, pretend: str | None = None
) -> int:
    """``make gpu-check``: run :func:`gpu_check_script` (the gpu profile on the tiny Qwen2) and write the
    report in its own folder. ``dry``: print the script instead, for 1 and 8 GPUs unless ``nproc`` is given
    (needs no GPU). ``shape_on_cpu``: the same script in the gpu shape on the CPU (COURSE_GPU_SHAPE_ON_CPU=1:
    gloo instead of nccl, no CUDA), with ``nproc`` processes per launch (default 1). ``only``: some of the
    notebook numbers (for trying one by hand; make gpu-check runs them all). ``pretend``: with ``shape_on_cpu``,
    torch believes that card is there, ``nproc`` of them (course/pretend/sitecustomize.py)."""
    from helpers import models, profiles

    if pretend:
        from course.pretend.sitecustomize import CARDS

        if not shape_on_cpu or pretend not in CARDS:
            print(f"error: PRETEND = {pretend!r} goes with SHAPE_ON_CPU=1 and names a card: {', '.join(CARDS)}.",
                  file=sys.stderr)  # fmt: skip
            return 2
    if dry:
        for count in [nproc] if nproc else [1, 8]:
            print(gpu_check_script(count, shape_on_cpu, pretend=pretend))
        return 0
    if not shape_on_cpu:
        problem = gpu_python_problem()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    nproc = nproc or (1 if shape_on_cpu else profiles.count_gpus())
    folder = gpu_check_folder()  # before its own COURSE_BUILD_DIR is set, which names this very folder
    script = gpu_check_script(nproc, shape_on_cpu, pretend=pretend)
    env, calls = read_script(script)
    if only:
        calls = [c for c in calls if Path(c["input_path"]).name[:2] in {o.zfill(2) for o in only}]
    print(script, flush=True)
    with environment(env):
        models.tiny_qwen2()  # the model every notebook is given (MODEL): built here, once, in seconds
        jobs = [Job(paths.ROOT / c["input_path"], paths.ROOT / c["output_path"], c["parameters"],
                    c["execution_timeout"], paths.ROOT / c["cwd"], c["kernel_name"]) for c in calls]  # fmt: skip
        status = run_course("gpu", build=folder, jobs=jobs)
    print(f"gpu-check: budget {GPU_CHECK_BUDGET} s on one GPU; the report above gives each notebook's time.")
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
    gc = sub.add_parser("gpu-check", help="the gpu profile of 03-06, 09-12 on a tiny Qwen2 (needs CUDA)")
    gc.add_argument("--dry", action="store_true", help="print the commands (for 1 and 8 GPUs); needs no GPU")
    gc.add_argument("--nproc", default="", help="processes per launch; default: one per GPU (1 on the CPU)")
    gc.add_argument("--shape-on-cpu", action="store_true", help="the gpu shape on the CPU (gloo, no CUDA)")
    gc.add_argument("--only", nargs="*", help="some notebook numbers, e.g. 09 10 (make gpu-check runs all)")
    gc.add_argument("--pretend", default=None, help="with --shape-on-cpu: torch believes this card is there")
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
        signal.signal(signal.SIGTERM, _terminated)
        try:
            return gpu_check(args.dry, int(args.nproc) if args.nproc else None, args.shape_on_cpu, args.only,
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
