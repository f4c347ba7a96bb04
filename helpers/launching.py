"""Launch torchrun and the swift CLI from a notebook cell, boringly and safely.

Every launch prints the exact command first (paste it into a terminal to run it yourself), picks a
free port, streams each line live with its rank in front, stops the whole process tree on timeout
or on the stop button, turns a failing rank into an exception that quotes its exit code and the end
of its traceback, and returns what each rank wrote to ``$COURSE_RESULTS_DIR/rank<N>.json``.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import shlex
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from helpers import devices, paths
from helpers.devices import gpu_env, visible_gpus  # noqa: F401 (the names notebooks use)
from helpers.errors import CourseError

RESULTS_ENV = "COURSE_RESULTS_DIR"
NOT_SHOWN = (RESULTS_ENV, devices.PRETEND_ENV)  # set for every launch by the course, left out of its command
RANK_PREFIX = "[rank${rank}]:"
_RANK_LINE = re.compile(r"^\[rank(\d+)\]:(?:\[rank\1\]: ?)?(.*)$")  # torch may add its own prefix
_LAUNCHER_LOG = re.compile(r"^[WEI]\d{4} ")  # torchrun's own log lines
_LAUNCHER_CHATTER = re.compile(r"^[WI]\d{4} ")  # its warnings and info: kept in .lines, not shown
# library chatter folded out of what a learner sees (every line stays in the launch's output file):
# SWIFT's and DeepSpeed's INFO/WARNING lines, transformers' notices, datasets' remote-code notice,
# progress bars (also where a bar redrawn in place leaves the next rank prefix on its line), blank lines,
# and c10d's failed name lookup of a peer (the network lab's addresses have none)
_FOLDED = re.compile(
    r"^(?:\[(?:WARNING|INFO):swift\]|\[transformers\]|\[\d{4}-\d\d-\d\d [\d:,]+\] \[(?:INFO|WARNING)\]"
    r"|`trust_remote_code` is not supported anymore|Please check that the Hugging Face dataset"
    r"|If the dataset is based on a loading script|\s*$)|\d+%\|.*\||(?:it/s|s/it|examples/s)\](?:\s*\[rank\d+\]:)*\s*$"
    r"|\[c10d\] The hostname of the client socket cannot be retrieved"
)
# SWIFT's training-step lines ({'loss': ..., 'global_step/max_steps': 'k/n', ...}): the first, the last and
# every ceil(n/5)th are shown, each as one short line; all of them stay in the output file and in .lines
_STEP = re.compile(r"^\{'loss': .*'global_step/max_steps': '(\d+)/(\d+)'")
_TAIL = 12
TEARDOWN_ABORT = "terminate called without an active exception"  # gloo, in interpreter teardown


def step_line(text: str) -> str | None:
    """One of SWIFT's training-step lines as a learner reads it (``step 20/100: loss 1.0736, token_acc 0.776,
    24s elapsed, 3m 39s left``), or None for a step that is not shown: only the first, the last and every
    ceil(n/5)th of n steps are."""
    import ast

    found = _STEP.match(text)
    done, total = int(found.group(1)), int(found.group(2))
    if done not in (1, total) and done % -(-total // 5):  # every ceil(n/5)th step
        return None
    try:
        entry = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return text
    parts = [f"step {done}/{total}: loss {entry['loss']:.4f}"]
    if "token_acc" in entry:
        parts.append(f"token_acc {entry['token_acc']:.3f}")
    if "elapsed_time" in entry:
        parts.append(f"{entry['elapsed_time']} elapsed, {entry.get('remaining_time', '?')} left")
    return ", ".join(parts)


def env_text(env) -> str:
    """``{"A": 1, "B": "x y"}`` -> ``"A=1 B='x y' "``: the words a typed command starts with to set them."""
    return "".join(f"{k}={shlex.quote(str(v))} " for k, v in (env or {}).items())


class LaunchError(CourseError):
    """A launched job failed: which rank, with which exit code, and how its traceback ended."""

    def __init__(self, message: str, *, rank=None, exitcode=None, tail=()):
        super().__init__(message)
        self.rank, self.exitcode, self.tail = rank, exitcode, list(tail)


class LaunchTimeout(LaunchError):
    """A launched job ran past its timeout and was stopped."""


@dataclass
class LaunchResult:
    """What a finished launch left behind."""

    command: str
    returncode: int
    seconds: float
    results: list  # per rank: what it wrote to $COURSE_RESULTS_DIR/rank<N>.json (None where it wrote nothing)
    lines: list[str] = field(repr=False)
    log_dir: Path | None = None
    note: str | None = None  # set when the work finished but a rank aborted while exiting

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


# --- process plumbing -----------------------------------------------------------------------------


def interruptible() -> None:
    """Let Ctrl-C (SIGINT) raise KeyboardInterrupt here, whatever the parent process did with it.

    A job started in the background of a non-interactive shell (``nohup``, ``cmd &`` in a script, some
    CI runners) starts with SIGINT *ignored*, Python keeps it ignored, and every child inherits that:
    Ctrl-C, the stop button or a test's SIGINT would then do nothing. Python's own handler is put back
    (only the main thread may set one); its children then start with SIGINT at its default again.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) in (
        signal.SIG_IGN,
        None,
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


LAUNCH_TIMEOUT_CAP = (
    "COURSE_LAUNCH_TIMEOUT"  # seconds no launch may exceed, whatever a cell asks (make gpu-check)
)


def capped(timeout: float) -> float:
    """``timeout``, or less where ``$COURSE_LAUNCH_TIMEOUT`` sets a smaller limit for every launch: a short
    check (make gpu-check) stops a hang in minutes, not after the hour a full-size run allows."""
    cap = os.environ.get(LAUNCH_TIMEOUT_CAP, "").strip()
    if not cap:
        return timeout
    try:
        limit = float(cap)
    except ValueError:
        raise CourseError(
            f"{LAUNCH_TIMEOUT_CAP}={cap!r} must be a number of seconds, e.g. {LAUNCH_TIMEOUT_CAP}=300."
        ) from None
    return min(timeout, limit)


def free_port() -> int:
    """A TCP port nobody is listening on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_tree(pid: int, grace: float = 3.0) -> int:
    """Stop ``pid`` and every process below it (TERM, then KILL); returns how many were stopped.

    torchrun starts each worker in its own session, so signalling a process group is not enough:
    the tree is walked, and walked again for anything started while it was being stopped.
    """
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    seen: dict[int, psutil.Process] = {}

    def collect():
        found = [root]
        try:
            found += root.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        for proc in list(seen.values()):
            try:
                found += proc.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        for proc in found:
            seen.setdefault(proc.pid, proc)
        return found

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in collect():
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(list(seen.values()), timeout=grace)
        if not alive and not collect()[1:]:
            break
    return len(seen)


class Launch:
    """One command to run: prepared here, started and watched by :func:`run`."""

    def __init__(self, argv, *, env=None, label="", timeout=600, cwd=None, log_dir=None, finished=None):
        self.argv = [str(a) for a in argv]
        self.finished = finished  # a line the job prints once all its work is done (see exited_late)
        self.note: str | None = None
        self.shown_as: str | None = None  # printed instead of "$ command" when the command was shown already
        # OpenMP threads that wait for each other sleep rather than spin: next to a kernel, a background Web-UI
        # and training processes on a small CPU, spinning slowed a 2-thread torch by up to 10x (measured). Set
        # here, unless the environment says otherwise, so that the printed command shows it. A launch not given
        # GPUs is meant for the CPU, and never sees one (helpers/devices.py).
        passive = {} if "OMP_WAIT_POLICY" in os.environ else {"OMP_WAIT_POLICY": "PASSIVE"}
        self.extra_env = {k: str(v) for k, v in {**passive, **devices.launch_env(env or {})}.items()}
        self.label = label
        self.timeout = timeout
        self.cwd = cwd
        self.log_dir = log_dir
        self.results_dir = paths.run_dir("launches", f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}")
        self.extra_env.setdefault(RESULTS_ENV, str(self.results_dir))
        self.proc = None
        self.lines: list[str] = []
        self.folded = 0  # lines not shown (see _FOLDED); all of them are in output_file
        self.steps_folded = 0  # SWIFT step lines not shown (see _STEP)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label or Path(self.argv[0]).name).strip("-") or "launch"
        self.output_file = (
            paths.run_dir("logs") / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}.txt"
        )
        self._output = None
        self.per_rank: dict[int, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=400)
        )
        self._queue: queue.Queue = queue.Queue()

    @property
    def command(self) -> str:
        """The exact command, with the environment variables this launch sets, ready to paste in a terminal
        at the repository root (paths inside the checkout are written relative to it)."""
        shown = {k: v for k, v in self.extra_env.items() if k not in NOT_SHOWN}
        return paths.relative_text(env_text(shown) + shlex.join(self.argv))

    def start(self) -> None:
        import subprocess

        env = dict(os.environ)
        env.update(self.extra_env)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        print(self.shown_as or f"$ {self.command}", flush=True)
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            self.argv,
            env=env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def drain(self, show: bool, tag: str) -> bool:
        """Print what arrived; True once the output has ended."""
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return False
            if line is None:
                if self._output:
                    self._output.close()
                if show and (self.folded or self.steps_folded):
                    steps = f", and {self.steps_folded} of SWIFT's step lines," if self.steps_folded else ""
                    print(f"{tag}({self.folded} lines of library logs, progress bars and blank lines{steps} not shown; "
                          f"the whole output is in {paths.relative(self.output_file)})", flush=True)  # fmt: skip
                return True
            self.lines.append(line)
            if self._output is None:
                self._output = open(self.output_file, "w", encoding="utf-8")  # noqa: SIM115 (closed at the end)
            self._output.write(line + "\n")
            match = _RANK_LINE.match(line)
            if match:
                self.per_rank[int(match.group(1))].append(match.group(2))
            if not show or _LAUNCHER_CHATTER.match(line):
                continue
            body = match.group(2) if match else line
            if _FOLDED.search(body):
                self.folded += 1
                continue
            step = _STEP.match(body)
            if step:
                shown = step_line(body)
                if shown is None:
                    self.steps_folded += 1
                    continue
                line = line[: len(line) - len(body)] + shown  # the rank prefix, if any, then the short line
            print(f"{tag}{paths.relative_text(line)}", flush=True)

    def stop(self) -> int:
        return kill_tree(self.proc.pid) if self.proc else 0

    def result(self) -> LaunchResult:
        files = sorted(self.results_dir.glob("rank*.json"), key=lambda p: int(p.stem[4:]))
        ranks = [int(p.stem[4:]) for p in files]
        results = [None] * (max(ranks) + 1 if ranks else 0)
        for rank, path in zip(ranks, files, strict=True):
            results[rank] = json.loads(path.read_text())
        return LaunchResult(
            command=self.command,
            returncode=self.proc.returncode,
            seconds=time.perf_counter() - self.started,
            results=results,
            lines=self.lines,
            log_dir=self.log_dir,
            note=self.note,
        )

    def exited_late(self, error: LaunchError) -> bool:
        """True when ``error`` is only a gloo abort in interpreter teardown after the work was done.

        A program we do not write (``swift sft``) cannot avoid it, so for it the launch names the line that
        proves the work finished (``finished``).
        """
        if not self.finished or error.exitcode != -signal.SIGABRT:
            return False
        own = self.per_rank.get(error.rank, []) if error.rank is not None else self.lines
        return any(TEARDOWN_ABORT in ln for ln in own) and any(self.finished in ln for ln in self.lines)

    def failure(self) -> LaunchError:
        """Explain a non-zero exit: the first failing rank, its exit code, its traceback's end."""
        text = "\n".join(self.lines)
        rank = exitcode = None
        root = text.rfind("Root Cause")
        if root >= 0:
            found = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text[root:], re.S)
            if found:
                rank, exitcode = int(found.group(1)), int(found.group(2))
        if rank is None:
            exitcode = self.proc.returncode
        own = list(self.per_rank.get(rank, [])) if rank is not None else []
        if not own:  # a single process, or output without rank prefixes
            own = [ln for ln in self.lines if not ln.startswith("[rank") and not _LAUNCHER_LOG.match(ln)]
        starts = [i for i, ln in enumerate(own) if ln.startswith("Traceback")]
        tail = own[starts[-1] :] if starts else own
        tail = [ln for ln in tail if ln.strip()][-_TAIL:]
        who = f"rank {rank}" if rank is not None else (self.label or self.argv[0])
        signame = ""
        if exitcode is not None and exitcode < 0:
            try:
                signame = f" ({signal.Signals(-exitcode).name})"
            except ValueError:
                pass
        message = f"{who} failed with exit code {exitcode}{signame}."
        if tail:
            message += " The end of its output:\n    " + "\n    ".join(tail)
        return LaunchError(paths.relative_text(message), rank=rank, exitcode=exitcode, tail=tail)


def run(*launches: Launch, timeout: float | None = None, show: bool = True) -> list[LaunchResult]:
    """Start ``launches`` together, stream their output, and wait for all of them.

    Raises LaunchTimeout after ``timeout`` seconds (default: the largest launch timeout) and
    LaunchError when any launch exits non-zero; in every case no process is left running.
    """
    interruptible()
    asked = timeout or max(launch.timeout for launch in launches)
    timeout = capped(asked)
    limit = f"{timeout:g} s" + (f" ({LAUNCH_TIMEOUT_CAP}, for {asked:g} s asked)" if timeout < asked else "")
    tags = {
        id(launch): (f"[{launch.label}] " if len(launches) > 1 and launch.label else "")
        for launch in launches
    }
    done: set[int] = set()
    try:
        for launch in launches:
            launch.start()
        deadline = time.monotonic() + timeout
        while len(done) < len(launches):
            for launch in launches:
                if id(launch) not in done and launch.drain(show, tags[id(launch)]):
                    launch.proc.wait()
                    done.add(id(launch))
                    if launch.proc.returncode != 0:
                        error = launch.failure()
                        if not launch.exited_late(error):
                            raise error
                        launch.note = (
                            f"rank {error.rank} aborted while exiting ({TEARDOWN_ABORT!r}, a gloo "
                            "teardown race) after the run had finished; its results are complete."
                        )
                        print(f"Note: {launch.note}", flush=True)
            if time.monotonic() > deadline:
                tail = [
                    ln
                    for launch in launches
                    for ln in [x for x in launch.lines if not _LAUNCHER_LOG.match(x)][-6:]
                ]
                stopped = sum(launch.stop() for launch in launches)
                raise LaunchTimeout(
                    f"the job did not finish within {limit}, so all {stopped} of its processes "
                    "were stopped. Its last lines:\n    "
                    + "\n    ".join(paths.relative_text(line) for line in tail)
                    + "\n  Raise `timeout=` if it is just slow, or see notebook 12 on debugging hangs."
                )
            time.sleep(0.05)
    except KeyboardInterrupt:
        stopped = sum(launch.stop() for launch in launches)
        print(f"Interrupted: stopped {stopped} process(es); nothing is left running.", flush=True)
        raise
    except LaunchError:
        for launch in launches:
            launch.stop()
        raise
    finally:
        for launch in launches:
            if launch.proc and launch.proc.poll() is None:
                launch.stop()
            if launch.proc:
                launch.proc.wait()
    return [launch.result() for launch in launches]


# --- the two launchers a lesson uses ------------------------------------------------------------


def log_folder(label: str) -> Path:
    return paths.run_dir("logs", f"{label}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}")


def torchrun_command() -> list[str]:
    """``torchrun`` where this Python has its own; else this Python running torch's launcher module. A venv
    made over a GPU image's Python (``--system-site-packages``, docs/gpu.md) has no ``torchrun`` of its own, and
    the image's would start the workers with the image's Python and packages."""
    if (Path(sys.executable).parent / "torchrun").exists():
        return ["torchrun"]
    return [sys.executable, "-m", "torch.distributed.run"]


def prepare_torchrun(
    script,
    *args,
    nproc: int = 2,
    nnodes: int = 1,
    node_rank: int = 0,
    master_port: int | None = None,
    master_addr: str = "127.0.0.1",
    max_restarts: int = 0,
    timeout: float = 600,
    env: dict | None = None,
    label: str | None = None,
    prefix: list[str] | None = None,
) -> Launch:
    """A torchrun launch of ``script`` (not started yet: pass it to :func:`run`).

    ``prefix`` goes in front of ``torchrun``: ``ip netns exec <node>`` runs it on a node of a
    :class:`helpers.netlab.Lab`, with that lab's address of node 0 as ``master_addr``.
    """
    log_dir = log_folder(Path(str(script)).stem)
    argv = [*(prefix or []), *torchrun_command(), "--nproc-per-node", nproc]
    if nnodes > 1:
        argv += ["--nnodes", nnodes, "--node-rank", node_rank]
    argv += ["--master-addr", master_addr, "--master-port", master_port or free_port()]
    if max_restarts:
        argv += ["--max-restarts", max_restarts]
    argv += ["--tee", "3", "--log-dir", log_dir, script, *args]
    launch_env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX, **(env or {})}
    return Launch(argv, env=launch_env, label=label or f"node{node_rank}", timeout=timeout, log_dir=log_dir)


def torchrun(script, *args, timeout: float = 600, show: bool = True, **options) -> LaunchResult:
    """Run ``torchrun`` on ``script`` and wait; see :func:`prepare_torchrun` for the options."""
    return run(prepare_torchrun(script, *args, timeout=timeout, **options), show=show)[0]
