"""Exercise checkers: a learner's answer goes in, a clear verdict comes out.

A lesson module registers one checker per exercise with ``@checker("01.1")``; the notebook calls
``check("01.1", answer)``. The solution cell (collapsed) asserts ``check(...)`` so CI proves that
the reference answer passes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

_CHECKERS: dict[str, Callable] = {}
NOT_ANSWERED = (None, Ellipsis)


class NotAnswered(Exception):
    """Raised by a checker that finds the learner's function still returning None (its body is ``...``)
    where it cannot be watched from here, e.g. on ranks forked by ``ddp.on_ranks``."""


def checker(exercise: str):
    """Register ``fn(answer) -> (ok, message)`` as the checker of ``exercise``."""

    def register(fn):
        _CHECKERS[exercise] = fn
        return fn

    return register


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


def check(exercise: str, answer, solution: bool = False) -> Verdict:
    """Print a verdict for ``answer``; the result is truthy when it is right.

    ``answer`` may be a value or, for a function exercise, the learner's function: one that still
    returns None whenever the checker calls it (its body is ``...``) counts as not answered.
    ``solution=True`` (the collapsed solution cells) prints only that the reference answer passes: its
    output is visible before the cell is opened, so it must not give the answer or the explanation away.
    """
    if exercise not in _CHECKERS:
        raise KeyError(f"no checker is registered for exercise {exercise!r}; known: {sorted(_CHECKERS)}")
    unanswered = f"Exercise {exercise}: not answered yet. Replace the placeholder and run the cell again."
    if answer is None or answer is Ellipsis:
        print(unanswered)
        return Verdict(False)
    returned: list = []
    if callable(answer):  # a function exercise: watch what the learner's function returns
        learner_fn = answer

        @functools.wraps(learner_fn)
        def answer(*args, **kwargs):
            returned.append(learner_fn(*args, **kwargs))
            return returned[-1]

    try:
        ok, message = _CHECKERS[exercise](answer)
    except NotAnswered:
        print(unanswered)
        return Verdict(False)
    except Exception as exc:  # a wrong type of answer is feedback, not a crash
        ok, message = False, f"the answer could not be checked ({type(exc).__name__}: {exc})"
    if returned and all(r is None for r in returned):  # the body is still `...`
        print(unanswered)
        return Verdict(False)
    if solution and ok:
        print(f"Exercise {exercise}: ✅ the reference solution passes the checker.")
    else:
        print(f"Exercise {exercise}: {'✅ correct' if ok else '❌ not yet'}. {message}".rstrip())
    return Verdict(ok)


def close(a, b, rel: float = 1e-6, abs_: float = 1e-9) -> bool:
    """True when two numbers (or equal-length sequences of numbers) agree within tolerance."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(close(x, y, rel, abs_) for x, y in zip(a, b, strict=True))
    a, b = float(a), float(b)
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))
