"""Troubleshooting (小帖士): reproduce the original tutorial's four tips, measure them, and debug a hang.

The pieces a lesson needs around its launched scripts: finding an error's key lines in a launch's
output, a small offline chat dataset and SWIFT's training log, the stop tokens of SWIFT's templates,
running a one-process script with a timeout, and dumping the Python stacks of stuck ranks with py-spy
(where the kernel lets it read them: :func:`ptrace_permission`).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from helpers import launching, paths

READY_TWICE = "Expected to mark a variable ready only once"
_PREFIX = re.compile(r"^\[rank\d+\]:(?:\[rank\d+\]: ?)?")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours (Jupyter kernels often force them on)


# --- reading what a launch printed -----------------------------------------------------------------


def strip_rank(line: str) -> str:
    """A line without the ``[rankN]:`` prefix the launcher (and torch) put in front of it."""
    return _PREFIX.sub("", line)


def key_lines(text, *needles: str, width: int = 160) -> list[str]:
    """The distinct lines of ``text`` (a string, a list of lines or an exception) containing a needle.

    Lines are shown without their rank prefix and cut to ``width`` characters, each once.
    """
    if isinstance(text, BaseException):
        text = str(text)
    lines = text.splitlines() if isinstance(text, str) else list(text)
    found: list[str] = []
    for line in lines:
        plain = strip_rank(line).strip()
        if any(n in plain for n in needles):
            short = plain if len(plain) <= width else plain[: width - 1] + "…"
            if short not in found:
                found.append(short)
    return found


# --- a script in one process, with a timeout ---------------------------------------------------------


def prepare_python(script, *args, timeout: float = 120, env: dict | None = None) -> launching.Launch:
    """``python script args`` as a launch of its own (so its memory peak is its own), not started yet:
    pass one or several to ``launching.run`` (several run side by side)."""
    return launching.Launch(
        [sys.executable, script, *args], env=env, label=Path(str(script)).name, timeout=timeout
    )


def python_script(script, *args, timeout: float = 120, env: dict | None = None, show: bool = True):
    """Run ``python script args`` in its own process and wait.

    The same launcher as torchrun: the command is printed, output streamed, the process stopped on
    timeout (LaunchTimeout); what the script writes to ``$COURSE_RESULTS_DIR/rank0.json`` comes back in
    ``.results[0]``.
    """
    return launching.run(prepare_python(script, *args, timeout=timeout, env=env), show=show)[0]


# --- SWIFT: a tiny offline dataset and the training log ----------------------------------------------

SUMS = [(a, b) for a in range(2, 8) for b in range(3, 6)]


def write_chat_dataset(folder, rows: int = 16) -> Path:
    """A small chat dataset SWIFT reads (JSON lines with ``messages``); the project writes it itself."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sums.jsonl"
    lines = []
    for a, b in SUMS[:rows]:
        messages = [
            {"role": "user", "content": f"What is {a} plus {b}?"},
            {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
        ]
        lines.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(lines) + "\n")
    return path


def swift_log(output_dir) -> list[dict]:
    """The rows of SWIFT's ``logging.jsonl`` in the newest run folder under ``output_dir``."""
    runs = sorted(Path(output_dir).glob("v*/logging.jsonl"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return []
    return [json.loads(line) for line in runs[-1].read_text().splitlines() if line.strip()]


def losses(log: list[dict]) -> list[float]:
    """The training losses SWIFT logged, step by step."""
    return [row["loss"] for row in log if "loss" in row]


# --- templates: how an answer ends -----------------------------------------------------------------


def template_meta(name: str) -> dict:
    """What SWIFT's template ``name`` puts around a turn (prompt, separator, suffix, stop words), as repr text."""
    from swift.template import TEMPLATE_MAPPING

    meta = TEMPLATE_MAPPING[name]
    fields = ("prompt", "chat_sep", "suffix", "stop_words")
    return {"template": name, **{f: " + ".join(repr(part) for part in getattr(meta, f)) for f in fields}}


def swift_tokenizer(model_info):
    """The model's tokenizer as SWIFT loads it (SWIFT's template encoder needs SWIFT's own object)."""
    from swift.model import get_processor

    return get_processor(model_info.path, model_type=model_info.model_type)


def with_eos(tokenizer, eos_token: str):
    """A copy of ``tokenizer`` whose end-of-sequence token is ``eos_token`` (the rest unchanged)."""
    other = copy.deepcopy(tokenizer)
    other.eos_token = eos_token
    return other


def encode_turn(tokenizer, template: str, query: str, response: str) -> dict:
    """Encode one user/assistant turn with SWIFT's template; what the loss trains the model to emit last."""
    from swift.template import get_template

    encoder = get_template(tokenizer, template_type=template)
    encoder.set_mode("train")  # training mode: the encoding carries labels (the tokens the loss trains)
    encoded = encoder.encode(
        {"messages": [{"role": "user", "content": query}, {"role": "assistant", "content": response}]}
    )
    trained = [t for t in encoded["labels"] if t != -100]
    return {
        "template": template,
        "text": tokenizer.decode(encoded["input_ids"]),
        "trained tokens": len(trained),
        "last trained ids": trained[-2:],
        "last trained tokens": tokenizer.convert_ids_to_tokens(trained[-2:]),
    }


BASE_DEFAULT_MODEL = "Qwen/Qwen2.5-7B"  # the base model of the gpu profile's Qwen2.5-7B-Instruct


def base_model(choice, model_info, profile):
    """``(ModelInfo, note)``: the base model section 2 of notebook 12 runs on the gpu profile.

    ``choice`` (the notebook's BASE_MODEL) is a local model folder or, on gpu, a ModelScope id; None means
    :data:`BASE_DEFAULT_MODEL`, except where MODEL names a local folder (an offline machine, and make
    gpu-check's tiny Qwen2): that folder then stands in for it, and ``note`` says so in one sentence.
    """
    from helpers import models
    from helpers.errors import CourseError

    if choice is None or choice == "":
        if profile.model and Path(profile.model).is_dir():
            note = (
                f"BASE_MODEL = None and MODEL is a local folder, so {model_info.name} stands in for the base "
                f"model (set BASE_MODEL to a base model's folder or ModelScope id, e.g. {BASE_DEFAULT_MODEL!r})."
            )
            return model_info, note
        return models.from_modelscope(BASE_DEFAULT_MODEL), None
    if not isinstance(choice, (str, os.PathLike)):
        raise CourseError(f"BASE_MODEL = {choice!r} must be a model folder, a ModelScope id or None.")
    folder = Path(str(choice)).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise CourseError(f"BASE_MODEL = {str(choice)!r} is a folder without a config.json.")
        return models.local(str(folder.resolve())), None
    if profile.name == "gpu" and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", str(choice)):
        return models.from_modelscope(str(choice)), None
    raise CourseError(
        f"BASE_MODEL = {str(choice)!r} is neither a model folder nor, on the gpu profile, a ModelScope id."
    )


def with_template(args, template: str) -> list[str]:
    """SWIFT flags ``args`` with ``--template`` set to ``template`` (replaced where it is given)."""
    args = [str(a) for a in args]
    if "--template" in args:
        i = args.index("--template")
        del args[i : i + 2]
    return [*args, "--template", template]


def prompt_ids(tokenizer, template: str, query: str) -> list[int]:
    """The token ids SWIFT's template ``template`` gives one user turn at inference, ending where the
    model starts its answer."""
    from swift.template import get_template

    encoder = get_template(tokenizer, template_type=template)
    encoder.set_mode("transformers")  # inference: the prompt up to the assistant's turn, no labels
    return list(encoder.encode({"messages": [{"role": "user", "content": query}]})["input_ids"])


# --- offline flags: what SWIFT's source does with them -----------------------------------------------


def swift_source(relative: str) -> Path:
    """A file of the installed SWIFT package (found without importing it)."""
    spec = importlib.util.find_spec("swift")
    return Path(next(iter(spec.submodule_search_locations))) / relative


def grep_source(relative: str, needle: str, context: int = 0) -> list[str]:
    """``file:line: text`` for the lines of an installed SWIFT file that contain ``needle``."""
    path = swift_source(relative)
    lines = path.read_text().splitlines()
    shown: list[str] = []
    for i, line in enumerate(lines):
        if needle in line:
            for j in range(max(0, i - context), min(len(lines), i + context + 1)):
                entry = f"swift/{relative}:{j + 1}: {lines[j].rstrip()}"
                if entry not in shown:
                    shown.append(entry)
    return shown


# --- gradient checkpointing: the trade-off -----------------------------------------------------------


def local_repo_path_in_use(model_dir, repo_dir) -> dict:
    """Run SWIFT's own DeepSeek-VL config loader (``DeepseekVLLoader.get_config``) with ``local_repo_path``
    set to ``repo_dir``, in which a stand-in ``deepseek_vl`` package is written, and with SWIFT's
    ``git_clone_github`` replaced by one that refuses: what the loader imported, and whether it cloned.

    The loader only reads ``model_dir``'s config (any local model will do); the processor class it picks
    up comes from the stand-in, so nothing from GitHub is needed. ``sys.path`` is restored afterwards.
    """
    from swift.model.models import deepseek

    package = Path(repo_dir) / "deepseek_vl" / "models"
    package.mkdir(parents=True, exist_ok=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text(
        '"""A stand-in for the DeepSeek-VL repository\'s code, written by the course."""\n\n\n'
        "class VLChatProcessor:\n    source = __file__\n"
    )
    clones: list[str] = []

    def refuse(url, **kwargs):
        clones.append(url)
        raise RuntimeError(f"git clone {url} was attempted: local_repo_path was not used")

    loader = deepseek.DeepseekVLLoader.__new__(deepseek.DeepseekVLLoader)  # only what get_config reads:
    loader.local_repo_path, loader.auto_config_cls, loader.auto_tokenizer_cls = str(repo_dir), None, None
    saved_path, saved_clone = list(sys.path), deepseek.git_clone_github
    deepseek.git_clone_github = refuse
    try:
        config = loader.get_config(str(model_dir))
        on_path = str(repo_dir) in sys.path
    finally:
        sys.path[:] = saved_path
        deepseek.git_clone_github = saved_clone
        for name in [m for m in sys.modules if m == "deepseek_vl" or m.startswith("deepseek_vl.")]:
            del sys.modules[name]
    return {
        "cloned": bool(clones),
        "repo on the import path": on_path,
        "processor class from": loader.auto_tokenizer_cls.source,
        "config read": type(config).__name__,
    }


def saving_and_slowdown(off: dict, on: dict) -> tuple[float, float]:
    """(fraction of the step's extra memory saved, step-time ratio) of checkpointing on vs off."""
    saved = 1 - on["peak_extra_mb"] / off["peak_extra_mb"]
    return saved, on["step_seconds"] / off["step_seconds"]


# --- a hang: stacks of the stuck ranks -------------------------------------------------------------


def py_spy() -> str | None:
    """The py-spy executable next to this Python (or on PATH), None if it is not installed."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def worker_pids(launch: launching.Launch, script_name: str) -> list[int]:
    """The pids of the processes under ``launch`` that run ``script_name`` (torchrun's workers)."""
    try:
        children = psutil.Process(launch.proc.pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for proc in children:
        try:
            if any(script_name in part for part in proc.cmdline()):
                found.append(proc.pid)
        except psutil.Error:
            pass
    return sorted(found)


PROC = Path("/proc")
CAP_SYS_PTRACE = 19  # the bit of CAP_SYS_PTRACE in the CapEff / CapBnd masks of /proc/<pid>/status
NOT_ALLOWED = "py-spy may not read this process:"  # how dump_stacks marks a process the kernel would refuse
PY_SPY_REFUSED = "Permission Denied"  # what py-spy itself prints when the kernel refuses it
RECORDED_HANG = paths.ROOT / "data" / "py-spy" / "hang.json"


def _status(pid, proc: Path) -> dict[str, str]:
    """The fields of ``/proc/<pid>/status`` (``pid`` may be "self")."""
    text = (proc / str(pid) / "status").read_text()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())}


def ptrace_scope(proc: Path | None = None) -> int | None:
    """``kernel.yama.ptrace_scope`` (0 to 3); None where the kernel has no Yama (only the classic rules apply)."""
    try:
        return int(((proc or PROC) / "sys" / "kernel" / "yama" / "ptrace_scope").read_text())
    except FileNotFoundError:
        return None


def _descends_from(pid: int, ancestor: int, proc: Path) -> bool:
    """Whether ``pid`` is a descendant of ``ancestor`` (following PPid up to the top)."""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            pid = int(_status(pid, proc)["PPid"])
        except (OSError, KeyError, ValueError):
            return False
        if pid == ancestor:
            return True
    return False


def ptrace_permission(target: int, tracer: int | None = None, proc: Path | None = None) -> tuple[bool, str]:
    """``(allowed, why)``: whether ``tracer`` may attach to ``target`` with ptrace, as ``py-spy dump --pid`` does
    (it stops the threads with ptrace and reads memory with process_vm_readv: the kernel checks both alike).

    ``tracer`` None is a program this process starts now, as :func:`dump_stacks` starts py-spy: it runs with
    our real uid and gid, the capabilities an execve gives it (a root process's child gets the inheritable and
    bounding sets, any other's only the ambient set: capabilities(7)), and it has no descendants. The rules:
    classic, the tracer's real uid and gid equal the target's real, effective and saved ones, or the tracer
    has CAP_SYS_PTRACE; then Yama (the kernel's Documentation/admin-guide/LSM/Yama.rst): scope 0 adds
    nothing, 1 allows only the tracer's own descendants without CAP_SYS_PTRACE (an inferior may name its
    debugger with prctl(PR_SET_PTRACER), which the course's scripts never do), 2 only CAP_SYS_PTRACE, 3 nobody.
    A seccomp filter or another security module may still refuse; :func:`hang_stacks` reads py-spy's answer too.
    """
    proc = proc or PROC
    who, runs = ("py-spy", "would run") if tracer is None else (f"process {tracer}", "runs")
    me = _status("self" if tracer is None else tracer, proc)
    if tracer is None:
        uid, euid = (int(v) for v in me["Uid"].split()[:2])
        caps = int(me["CapInh"], 16) | int(me["CapBnd"], 16) if euid == 0 else int(me["CapAmb"], 16)
    else:
        uid, caps = int(me["Uid"].split()[0]), int(me["CapEff"], 16)
    gid = int(me["Gid"].split()[0])
    capable = bool(caps >> CAP_SYS_PTRACE & 1)
    try:
        them = _status(target, proc)
    except OSError:
        return False, f"process {target} has ended"
    scope = ptrace_scope(proc)
    uids, gids = ({int(v) for v in them[key].split()[:3]} for key in ("Uid", "Gid"))  # real, effective, saved
    same_user = uids == {uid} and gids == {gid}
    if scope == 3:
        return False, "kernel.yama.ptrace_scope is 3, so no process may attach with ptrace"
    if not same_user and not capable:
        return False, f"process {target} belongs to another user and {who} {runs} without CAP_SYS_PTRACE"
    if scope == 2 and not capable:
        return False, f"kernel.yama.ptrace_scope is 2 (CAP_SYS_PTRACE only) and {who} {runs} without it"
    if scope == 1 and not capable and (tracer is None or not _descends_from(target, tracer, proc)):
        relation = "has no descendants" if tracer is None else f"is not an ancestor of process {target}"
        return False, (
            "kernel.yama.ptrace_scope is 1, which lets a process without CAP_SYS_PTRACE read only its own "
            f"descendants, and {who}{', started from here,' if tracer is None else ''} {runs} without it and {relation}"
        )
    if capable:
        return True, f"{who} {runs} with CAP_SYS_PTRACE"
    relation = "its descendant, " if scope == 1 else ""
    yama = "no Yama" if scope is None else f"kernel.yama.ptrace_scope {scope}"
    return True, f"process {target} is {relation}of the same user ({yama})"


def dump_stacks(pids, timeout: float = 20) -> dict[int, str]:
    """``py-spy dump --pid PID`` for every pid: the Python stack each one is standing in right now.

    The kernel's ptrace rules are checked first (:func:`ptrace_permission`): a process py-spy may not read
    gets the line ``NOT_ALLOWED why`` instead of a dump, and py-spy is not run for it."""
    exe = py_spy()
    dumps = {}
    for pid in pids:
        if exe is None:
            dumps[pid] = "py-spy is not installed (pip install py-spy)"
            continue
        allowed, why = ptrace_permission(pid)
        if not allowed:
            dumps[pid] = f"{NOT_ALLOWED} {why}"
            continue
        try:
            done = subprocess.run(
                [exe, "dump", "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, "NO_COLOR": "1", "CLICOLOR_FORCE": "0", "FORCE_COLOR": "0"},
            )
            dumps[pid] = _ANSI.sub("", done.stdout + done.stderr).strip()
        except subprocess.TimeoutExpired:
            dumps[pid] = f"py-spy dump did not answer within {timeout:g} s"
    return dumps


def run_and_dump(launch: launching.Launch, script_name: str, *, ready: str, ranks: int, timeout: float):
    """Run ``launch`` until it ends or ``timeout``; once it is stuck, dump its workers' stacks with py-spy.

    "Stuck" means: ``ranks`` output lines containing ``ready`` have arrived, plus one quiet second.
    Returns ``(result or the LaunchError it raised, {pid: stack}, seconds until it ended)``.
    """
    dumps: dict[int, str] = {}

    def watch():
        while launch.proc is None or sum(ready in line for line in list(launch.lines)) < ranks:
            if launch.proc is not None and launch.proc.poll() is not None:
                return
            time.sleep(0.1)
        time.sleep(1.0)
        if launch.proc.poll() is None:
            dumps.update(dump_stacks(worker_pids(launch, script_name)))

    watcher = threading.Thread(target=watch, daemon=True)
    start = time.perf_counter()
    watcher.start()
    try:
        outcome = launching.run(launch, timeout=timeout)[0]
    except launching.LaunchError as exc:
        outcome = exc
    watcher.join(timeout=30)
    return outcome, dumps, time.perf_counter() - start


def stack_frames(dump: str) -> list[str]:
    """The function names of a py-spy dump, innermost first (``name (file:line)`` lines)."""
    frames = []
    for line in _ANSI.sub("", dump).splitlines():
        match = re.match(r"^\s+(\S+) \((.*):(\d+)\)$", line)
        if match:
            frames.append(f"{match.group(1)} ({Path(match.group(2)).name}:{match.group(3)})")
    return frames


def recorded_hang() -> dict:
    """The stacks of notebook 12's hang as py-spy dumped them with permission: ``machine`` (where, and as
    whom), ``recorded`` (the date), ``how`` and ``dumps`` ({pid: the dump's text})."""
    recorded = json.loads(RECORDED_HANG.read_text())
    recorded["dumps"] = {int(pid): text for pid, text in recorded["dumps"].items()}
    return recorded


def hang_stacks(dumps: dict[int, str]) -> tuple[dict[int, list[str]], str | None]:
    """``({pid: frames}, note)``: the frames of ``dumps`` (from :func:`run_and_dump`), note None; or, where
    py-spy could not read a worker (the kernel's rules said no, or py-spy itself was refused), the frames
    of :func:`recorded_hang` with a one-sentence note saying why and where those were recorded."""
    refused = [text for text in dumps.values() if text.startswith(NOT_ALLOWED) or PY_SPY_REFUSED in text]
    if not refused:
        return {pid: stack_frames(text) for pid, text in dumps.items()}, None
    first = refused[0]
    why = (
        first[len(NOT_ALLOWED) :].strip()
        if first.startswith(NOT_ALLOWED)
        else f"py-spy itself was refused ({PY_SPY_REFUSED}) although the ptrace rules read here allow it, "
        "so a seccomp filter or a security module forbids it"
    )
    recorded = recorded_hang()
    note = (
        f"py-spy may not read the workers here: {why}; below are the workers' stacks of this hang as recorded on "
        f"{recorded['machine']} with permission ({recorded['recorded']})."
    )
    return {pid: stack_frames(text) for pid, text in recorded["dumps"].items()}, note
