"""Exercise checkers: a learner's answer goes in, a clear verdict comes out.

Each notebook's checkers live in a module of their own here (``nb01`` ... ``nb12``), one per exercise,
registered with ``@checker("01.1")``; the notebook calls ``check("01.1", answer)``, which imports that
module first. The solution cell (collapsed) asserts ``check(...)`` so CI proves that the reference answer
passes.

Every verdict on a learner's answer is kept in ``progress.json`` in the build folder (:func:`record`): on the
room's hub, ``make hub-progress`` prints every learner's as one table.

A checker returns ``(ok, message)`` or raises :class:`Wrong` with the message. The small core below
fails closed: a number must be a finite real number (no bool, no string), a tensor must be finite, and
every message names the unit it expects and shows values with ``repr``. The learner's function runs
through :func:`call`, which keeps what it does to the process (streams, working directory) to itself.
"""

from __future__ import annotations

import contextlib
import dis
import importlib
import inspect
import io
import math
import numbers
import os
import pickle
import pkgutil
import queue
import sys
import time
import traceback
from collections.abc import Callable

from helpers.errors import CourseError

_CHECKERS: dict[str, Callable] = {}


class NotAnswered(Exception):
    """Raised by a checker that finds the learner's function still returning None (its body is ``...``)
    where it cannot be watched from here, e.g. on ranks forked by ``exercises.on_ranks``."""


class Wrong(Exception):
    """Raised inside a checker: the answer is wrong, and the message says why."""


def checker(exercise: str):
    """Register ``fn(answer) -> (ok, message)`` as the checker of ``exercise``."""

    def register(fn):
        _CHECKERS[exercise] = fn
        return fn

    return register


def _load(exercise) -> None:
    """Import the checker module of ``exercise``'s notebook (``"03.2"``: ``nb03``), if there is one."""
    if not (isinstance(exercise, str) and exercise[:2].isdigit()):
        return
    name = f"{__name__}.nb{exercise[:2]}"
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as missing:
        if missing.name != name:  # the module is there, but something it imports is not
            raise


def registered() -> list[str]:
    """The exercises that have a checker, in order (every notebook's checker module is imported)."""
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("nb"):
            _load(module.name[2:])
    return sorted(_CHECKERS)


class Verdict:
    """True or False for ``assert``; shows nothing itself, the verdict is already printed."""

    def __init__(self, ok: bool):
        self.ok = bool(ok)

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"Verdict({self.ok})"

    def _ipython_display_(self) -> None:
        pass


SCRIPT_PLACEHOLDER = 'raise NotImplementedError("write your script here")'


def is_placeholder(fn) -> bool:
    """True for a function whose body is still the placeholder (``...`` or ``pass``): it returns None; and
    for the path of a script that still holds the line :data:`SCRIPT_PLACEHOLDER`."""
    if isinstance(fn, os.PathLike):
        path = os.fspath(fn)
        return os.path.isfile(path) and SCRIPT_PLACEHOLDER in open(path, encoding="utf-8").read()
    code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
    if code is None:
        return False
    skip = {"RESUME", "NOP", "COPY_FREE_VARS", "MAKE_CELL", "CACHE"}
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in skip]
    return ops in ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)])


def check(exercise: str, answer, solution: bool = False) -> Verdict:
    """Print a verdict for ``answer``; the result is truthy when it is right.

    ``answer`` may be a value or, for a function exercise, the learner's function: one whose body is still
    the placeholder ``...`` counts as not answered (a function that returns None for some inputs is wrong).
    ``solution=True`` (the collapsed solution cells) prints only that the reference answer passes: its
    output is visible before the cell is opened, so it must not give the answer or the explanation away.
    """
    if exercise not in _CHECKERS:
        _load(exercise)
    if exercise not in _CHECKERS:
        raise KeyError(f"no checker is registered for exercise {exercise!r}; known: {registered()}")
    unanswered = f"Exercise {exercise}: not answered yet. Replace the placeholder and run the cell again."
    if answer is None or answer is Ellipsis or is_placeholder(answer):
        print(unanswered)
        if not solution:
            record(exercise, None)
        return Verdict(False)
    try:
        ok, message = _CHECKERS[exercise](answer)
    except Wrong as wrong:
        ok, message = False, str(wrong)
    except NotAnswered as none:  # None from a function that is no longer the placeholder: a wrong answer
        ok, message = False, str(none) or "your function returned None: is a `return` missing?"
    except Exception as exc:  # a wrong type of answer is feedback, not a crash
        ok, message = False, f"the answer could not be checked ({type(exc).__name__}: {exc})."
    if solution and ok:
        print(f"Exercise {exercise}: ✅ the reference solution passes the checker.")
    else:
        print(f"Exercise {exercise}: {'✅ correct' if ok else '❌ not yet'}. {message}".rstrip())
    if not solution:
        record(exercise, ok)
    return Verdict(ok)


PROGRESS = "progress.json"  # in the build folder: exercise -> {"status", "tries", "last"}


def record(exercise: str, ok: bool | None) -> None:
    """Keep one more verdict on ``exercise`` (``None``: not answered yet) in the build folder's PROGRESS:
    its latest status, the answers tried, when. Once correct, it stays correct."""
    import json

    from helpers import paths

    path = paths.build_dir() / PROGRESS
    with contextlib.suppress(OSError), paths.locked(path):  # a read-only build folder loses the record, not the verdict
        try:
            seen = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            seen = {}
        entry = seen.get(exercise, {"status": "not answered", "tries": 0})
        if ok is not None:
            entry["tries"] += 1
            entry["status"] = "correct" if ok or entry["status"] == "correct" else "not yet"
        entry["last"] = time.strftime("%Y-%m-%d %H:%M:%S")
        seen[exercise] = entry
        paths.write_atomic(path, json.dumps(seen, indent=1, sort_keys=True))


def brief(value, limit: int = 100) -> str:
    """``repr(value)``, shortened to about ``limit`` characters; a tensor by its shape and dtype."""
    if type(value).__module__.startswith("torch") and hasattr(value, "shape"):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + " ...)"


@contextlib.contextmanager
def _isolated():
    """Give the learner's code its own sys streams; restore them, fds 0-2 and the working directory after."""
    cwd, streams = os.getcwd(), (sys.stdin, sys.stdout, sys.stderr)
    saved = []
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            saved.append((fd, os.dup(fd)))
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()  # what it prints is not shown
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
        for fd, copy in saved:  # a function that closed fd 1 (open(1) ...) must not close the kernel's
            os.dup2(copy, fd)
            os.close(copy)
        try:
            moved = os.getcwd() != cwd
        except OSError:  # it removed the folder it moved into
            moved = True
        if moved:
            os.chdir(cwd)


def call(fn, *args, show: str | None = None) -> tuple:
    """``(fn(*args), "fn(args) returned")``, run isolated; an exception becomes :class:`Wrong` naming the call."""
    name = getattr(fn, "__name__", "your function")
    said = show or f"{name}({', '.join(brief(a, 60) for a in args)})"
    if not callable(fn):
        raise Wrong(f"answer with a function (def ...), not {brief(fn)}.")
    failure = None
    with _isolated():
        try:
            result = fn(*args)
        except (Exception, SystemExit) as exc:
            frames = traceback.extract_tb(exc.__traceback__)[1:]
            mine = [f for f in frames if "site-packages" not in f.filename and "/helpers/" not in f.filename]
            where = f" (line {mine[-1].lineno}, in {mine[-1].name})" if mine else ""
            failure = f"{said} raised {type(exc).__name__}: {exc}{where}."
    if failure:  # raised here, after the exception (and any file it held open) is gone
        raise Wrong(failure)
    return result, f"{said} returned"


def _real(value):
    """``value`` as a float when it is one real number (numpy and 0-d tensor scalars too), else None."""
    if not isinstance(value, numbers.Number) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except (OverflowError, ValueError):
        return math.inf


def number(value, said: str, unit: str) -> float:
    """``value`` as a float, or :class:`Wrong` unless it is a finite real number (not a bool or a string)."""
    got = _real(value)
    if got is None:
        hint = " (is a `return` missing?)" if value is None else ""
        hint = " (text, not a number)" if isinstance(value, str) else hint
        raise Wrong(f"{said} {brief(value)}{hint}; the answer is a number of {unit}.")
    if not math.isfinite(got):
        raise Wrong(f"{said} {brief(value)}, not a finite number of {unit}.")
    return got


def integer(value, said: str, unit: str) -> int:
    """``value`` as an int, or :class:`Wrong` unless it is a finite whole number (an integral float is fine)."""
    got = number(value, said, unit)
    if not got.is_integer():
        raise Wrong(f"{said} {brief(value)}, not a whole number of {unit}.")
    return int(value) if isinstance(value, numbers.Integral) else int(got)


def items(value, said: str, n: int | None, kind: type = tuple, what: str = "a tuple") -> list:
    """The items of ``value``, or :class:`Wrong` unless it is a ``kind`` (of ``n`` items when given)."""
    if not isinstance(value, kind):
        hint = " (is a `return` missing?)" if value is None else ""
        raise Wrong(f"{said} {brief(value)}{hint}; the answer is {what}.")
    if n is not None and len(value) != n:
        raise Wrong(f"{said} {brief(value)}, {len(value)} item(s); the answer is {what}, {n} item(s).")
    return list(value)


def close(a, b, rel: float = 1e-6, abs_: float = 1e-9) -> bool:
    """True when two finite numbers (or equal-length lists/tuples of them) agree within tolerance."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(close(x, y, rel, abs_) for x, y in zip(a, b, strict=True))
        )
    a, b = _real(a), _real(b)
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


def tensor(value, said: str, like):
    """``value`` as a float64 tensor shaped like ``like``, or :class:`Wrong`; any float dtype is fine."""
    import torch

    if not isinstance(value, torch.Tensor):
        hint = " (is a `return` missing?)" if value is None else ""
        raise Wrong(f"{said} {brief(value)}{hint}; the answer is one torch tensor.")
    if tuple(value.shape) != tuple(like.shape):
        raise Wrong(
            f"{said} a tensor of shape {tuple(value.shape)}; it should have shape {tuple(like.shape)}."
        )
    if not value.is_floating_point():
        raise Wrong(f"{said} a {value.dtype} tensor; the answer holds floating-point numbers.")
    value = value.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(value).all()):
        raise Wrong(f"{said} a tensor holding NaN or infinity.")
    return value


def tensors_close(got, want, rel: float = 1e-5) -> bool:
    """True when two tensors agree within ``rel`` of the larger one's largest entry (compared in float64)."""
    import torch

    got, want = got.detach().double(), want.detach().double()
    scale = max(float(want.abs().max()) if want.numel() else 0.0, 1e-12)
    return bool(torch.isfinite(got).all()) and bool(((got - want).abs() <= rel * scale).all())


def on_ranks(fn, world: int = 2, timeout: float = 60) -> list:
    """Run ``fn(rank, world)`` on ``world`` ranks of a gloo process group and return each rank's result.

    For exercises: the ranks are processes *forked* from this one, so a function written in a notebook
    cell runs on real ranks without being saved to a file first. A failure on any rank stops all of them
    and comes back as one sentence naming the rank; so does a rank still waiting after ``timeout`` seconds.
    """
    import multiprocessing
    from datetime import timedelta

    from helpers.launching import free_port

    context = multiprocessing.get_context("fork")
    results, port = context.Queue(), free_port()

    def rank_main(rank):
        import torch.distributed as dist

        try:
            import torch

            torch.set_num_threads(1)  # the fork copies no thread pool: stay single-threaded in the child
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                timeout=timedelta(seconds=timeout),
            )  # fmt: skip
            # every rank connected before any runs fn: else a rank that is done tears the group down while a
            # slow peer is still connecting, which then reports gloo's "Connection closed by peer" instead of
            # its own error (seen on a loaded 2-core machine)
            dist.barrier()
            report = (rank, True, fn(rank, world))
        except NotAnswered as none:
            report = (rank, None, str(none))
        except Wrong as wrong:  # the checker's own verdict on this rank, already one sentence
            report = (rank, "wrong", str(wrong))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, whatever it was
            frames = traceback.extract_tb(exc.__traceback__)
            mine = [f for f in frames if "site-packages" not in f.filename and "/helpers/" not in f.filename]
            where = (mine or frames)[-1]  # the deepest line of the learner's own code, when there is one
            report = (rank, False, f"{type(exc).__name__}: {exc} (line {where.lineno}, in {where.name})")
        try:
            # sent as plain pickle bytes: multiprocessing's own pickler, with torch's reducers, would pass a
            # returned tensor's storage as a file descriptor that the parent fetches from this process, which
            # exits at once below (the parent then read EOFError or ConnectionResetError: seen returning tensors)
            try:
                message = pickle.dumps(report)
            except Exception as exc:  # noqa: BLE001 - an unpicklable answer is the rank's error, said as such
                message = pickle.dumps((rank, False, f"its result could not be sent back ({type(exc).__name__}: {exc})"))
            # heard before the teardown: destroy_process_group waits for a group's pending works when it has
            # completion hooks (pg._wait_for_pending_works() in torch 2.13), then shuts the backend down
            results.put(message)
            results.close()
            results.join_thread()  # the result is in the pipe before the group goes
            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            os._exit(0)  # leave at once: the kernel's exit handlers belong to the parent

    ranks = [context.Process(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    for process in ranks:
        process.start()
    found, deadline = {}, time.monotonic() + timeout
    try:
        while len(found) < world:
            try:
                rank, ok, value = pickle.loads(results.get(timeout=max(0.01, min(0.5, deadline - time.monotonic()))))
            except queue.Empty:
                if time.monotonic() <= deadline:
                    continue
                if any(ok is not True for ok, _ in found.values()):
                    break  # a rank failed and the others are stuck behind it: report the failure
                raise CourseError(
                    f"the {world} ranks did not all finish within {timeout:g} s: is one rank waiting in a "
                    "collective that another never calls?"
                ) from None
            found[rank] = (ok, value)
            if ok is not True:  # the peers of a failed rank fail too, a moment later: hear them out
                # a rank that only lost its peer says nothing of the cause: wait longer for the rank that has it
                grace = PEER_GONE_GRACE_S if lost_its_peer(ok, value) else PEER_GRACE_S
                deadline = min(deadline, time.monotonic() + grace)
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)
    failed = first_cause({rank: report for rank, report in found.items() if report[0] is not True})
    if failed is not None:
        rank, (ok, value) = failed
        if ok is None:
            raise NotAnswered(value)
        if ok == "wrong":
            raise Wrong(value)
        raise CourseError(f"rank {rank} failed: {value}")
    return [found[r][1] for r in range(world)]


def mistake_on_ranks(rank_part, mistake, timeout: float = 30, worlds=(2, 3)) -> tuple[dict, str | None]:
    """Run ``rank_part`` with :func:`on_ranks` on each number of ranks in ``worlds``, stopping at the first where a
    rank fails or ``mistake(results, world)`` names what is wrong: ``({world: results}, that sentence or None)``."""
    seen: dict = {}
    for world in worlds:
        try:
            seen[world] = on_ranks(rank_part, world, timeout=timeout)
        except CourseError as error:
            return seen, str(error)
        wrong = mistake(seen[world], world)
        if wrong:
            return seen, wrong
    return seen, None


PEER_GRACE_S = 3.0
PEER_GONE_GRACE_S = 15.0  # on a busy machine the failing rank's own report can come seconds after its peer's
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "connectFullMesh")


def lost_its_peer(ok, value) -> bool:
    """A rank's error that only says another rank went away (gloo's "Connection closed by peer")."""
    return ok is False and any(s in value for s in PEER_GONE)


def first_cause(failures: dict):
    """The failure to report among ``{rank: (ok, message)}``: an unanswered or wrong answer first, then a
    rank's own error, and a rank that only lost its peer (gloo's "Connection closed by peer") last."""

    def rank_order(item):
        rank, (ok, value) = item
        kind = 0 if ok is None else 1 if ok == "wrong" else 3 if lost_its_peer(ok, value) else 2
        return kind, rank

    return min(failures.items(), key=rank_order, default=None)
