"""SWIFT's command line from a notebook: the `swift` command as text, run in its own process group, its environment."""

from __future__ import annotations

import os
import re
import shlex

from helpers import launching, paths
from helpers.errors import CourseError
from helpers.launching import NOT_SHOWN, RANK_PREFIX, Launch, LaunchResult, env_text, free_port, log_folder


def prepare_swift(
    subcommand: str, *args, nproc: int = 1, timeout: float = 1800, env=None, torchrun: bool = False
) -> Launch:
    """A ``swift`` CLI launch; with ``nproc`` > 1, or ``torchrun``, SWIFT starts torchrun itself.

    SWIFT's entry point starts torchrun whenever NPROC_PER_NODE is set (swift/cli/main.py, use_torchrun).
    ``torchrun=True`` does that for one process too: DeepSpeed needs the RANK and WORLD_SIZE torchrun
    sets, and without them looks for MPI instead (deepspeed/comm/comm.py, mpi_discovery).
    """
    launch_env = dict(env or {})
    log_dir = None
    if nproc > 1 or torchrun:
        log_dir = log_folder(f"swift-{subcommand}")
        launch_env = {
            "NPROC_PER_NODE": nproc,
            "MASTER_PORT": free_port(),
            # torchrun reads PET_* for its options: tee each rank to the console with its rank
            "PET_TEE": "3",
            "PET_LOG_DIR": log_dir,
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX,
            **launch_env,
        }
    return Launch(
        ["swift", subcommand, *args],
        env=launch_env,
        label=f"swift {subcommand}",
        timeout=timeout,
        log_dir=log_dir,
        finished=_swift_finished(subcommand, launch_env),
    )


def _swift_finished(subcommand: str, env: dict) -> str:
    """The line that proves a ``swift`` job's work is done (see :meth:`Launch.exited_late`).

    SWIFT's last log line, "End time of running main" (swift/pipelines/base.py, main), is an INFO line:
    with ``LOG_LEVEL=WARNING`` it is never printed. Training then proves itself with rank 0's summary,
    the dict holding 'train_runtime': swift/trainers/patcher.py saves the last checkpoint at max_steps
    (DefaultFlowCallbackNew.on_step_end), and PrinterCallbackNew.on_log prints each log after writing it
    to logging.jsonl, the summary last.
    """
    quiet = str(env.get("LOG_LEVEL", "INFO")).upper() in ("WARNING", "ERROR", "CRITICAL")
    if quiet and subcommand in ("sft", "pt", "rlhf"):
        return "'train_runtime'"
    return "End time of running main"


def words(args) -> str:
    """Arguments as typed at the repository root: quoted for the shell, the checkout's paths relative to it."""
    return paths.relative_text(shlex.join(map(str, args)))


def swift_text(subcommand: str, args, env=None) -> str:
    """A ``swift`` command as text to type in a terminal at the repository root: its environment, then one
    option per line (paths in the checkout relative to it)."""
    lines = [env_text(env) + f"swift {subcommand}"]
    for arg in map(str, args):
        if arg.startswith("--") or len(lines) == 1:
            lines.append("    " + shlex.quote(arg))
        else:
            lines[-1] += " " + shlex.quote(arg)
    return paths.relative_text(" \\\n".join(lines))


def swift(subcommand: str, *args, show: bool = True, **options) -> LaunchResult:
    """Run the ``swift`` CLI and wait; see :func:`prepare_swift` for the options."""
    return launching.run(prepare_swift(subcommand, *args, **options), show=show)[0]


def parse_swift_text(text: str) -> tuple[dict, str, list[str]]:
    """``"A=1 swift sft --x y"`` (line continuations allowed) -> ``({"A": "1"}, "sft", ["--x", "y"])``."""
    words = [os.path.expanduser(w) for w in shlex.split(text.replace("\\\n", " "))]
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if len(words) < 2 or words[0] != "swift":
        raise CourseError(
            f"{text.splitlines()[0]!r} is not a swift command; write it as "
            "'[VAR=value ...] swift <subcommand> --option value ...'."
        )
    return env, words[1], words[2:]


def swift_shell(text: str, show: bool = True, **options) -> LaunchResult:
    """Run exactly the command ``text`` shows (as :func:`swift_text` writes it), from the repository root;
    NPROC_PER_NODE in its environment starts torchrun, as in a terminal. Where it does, the launcher adds
    MASTER_PORT (a free port) and torchrun's output options (PET_*, the rank prefix), and says so."""
    env, subcommand, args = parse_swift_text(text)
    launch = prepare_swift(subcommand, *args, nproc=int(env.get("NPROC_PER_NODE", 1)), env=env, **options)
    launch.cwd = paths.ROOT  # the text's paths are relative to the repository root
    added = " ".join(f"{k}={v}" for k, v in launch.extra_env.items() if k not in env and k not in NOT_SHOWN)
    launch.shown_as = f"▶ swift {subcommand}: the command above" + (
        f", with {paths.relative_text(added)}" if added else ""
    )
    return launching.run(launch, show=show)[0]

