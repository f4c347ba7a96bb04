"""What a learner's distributed code calls, on a rank forked by ``exercises.on_ranks``: each call noted once, a forbidden one refused by name.

Everything here replaces functions of ``torch.distributed`` in the forked rank only (the kernel that forked it
keeps its own). torch's functions call each other (``dist.send`` posts ``dist.isend`` and waits for it,
``all_gather_into_tensor`` calls ``all_gather_single``): a call made from inside another watched call is
torch's own, and is not noted a second time.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from helpers.exercises import Wrong

_inside = [0]  # watched calls in progress in this process: only the outermost is the learner's


def replace(name: str, fn: Callable) -> Callable:
    """Put ``fn`` in place of ``dist.<name>`` and of torch's own ``distributed_c10d.<name>`` (which its other
    functions, ``P2POp`` and ``batch_isend_irecv`` among them, look up); return the function it replaces."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    real = getattr(c10d, name)
    setattr(c10d, name, fn)
    setattr(dist, name, fn)
    return real


def watch(names, note: Callable[[str, dict], None], instead: Callable | None = None) -> None:
    """For each of ``names``: ``note(name, arguments)`` at every call the learner makes (its arguments by
    name, defaults filled in), then the call itself, or ``instead(real, name, arguments)`` when given."""
    import torch.distributed.distributed_c10d as c10d

    for name in names:
        real = getattr(c10d, name)
        signature = inspect.signature(real)

        def watched(*args, _name=name, _real=real, _signature=signature, **kwargs):
            if _inside[0]:  # torch calling its own functions
                return _real(*args, **kwargs)
            bound = _signature.bind(*args, **kwargs)
            bound.apply_defaults()
            note(_name, dict(bound.arguments))
            _inside[0] += 1
            try:
                return instead(_real, _name, dict(bound.arguments)) if instead else _real(*args, **kwargs)
            finally:
                _inside[0] -= 1

        watched.__name__ = watched.__qualname__ = name
        replace(name, watched)


def forbid(names, why: Callable[[str], str]) -> None:
    """Make each of ``names`` raise :class:`Wrong` with ``why(name)``, which names the call."""
    for name in names:

        def refuse(*args, _name=name, **kwargs):
            raise Wrong(why(_name))

        refuse.__name__ = refuse.__qualname__ = name
        replace(name, refuse)


def peer(arguments: dict, key: str) -> int | None:
    """The rank a send or receive goes to or comes from: ``dst``/``src``, else ``group_dst``/``group_src``."""
    value = arguments.get(key)
    return value if value is not None else arguments.get(f"group_{key}")


class _Waited:
    """A work or future of a watched collective: ``wait()`` is noted first, the rest is the real object's."""

    def __init__(self, real, waited: Callable[[], None]):
        self._real, self._waited = real, waited

    def wait(self, *args, **kwargs):
        self._waited()
        return self._real.wait(*args, **kwargs)

    def get_future(self):
        return _Waited(self._real.get_future(), self._waited)

    def __getattr__(self, name):
        return getattr(self._real, name)


def unwrap(value):
    """The real work or future behind what a watched collective handed out (others unchanged): what DDP gets back."""
    return value._real if isinstance(value, _Waited) else value


def watch_waits(names, note: Callable[[str, dict], None], waited: Callable[[], None], when: Callable[[], bool]) -> None:
    """For each collective of ``names`` called while ``when()``: ``note(name, arguments)``, and ``waited()`` each
    time the learner waits on its work or on that work's future (``async_op=True``)."""

    def instead(real, name, arguments):
        result = real(**arguments)
        return _Waited(result, waited) if result is not None else None

    def noting(name, arguments):
        if when():
            note(name, arguments)

    watch(names, noting, lambda real, name, arguments: instead(real, name, arguments) if when() else real(**arguments))
