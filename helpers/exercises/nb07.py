"""Notebook 07's exercise checkers: a two-node all-reduce's least time on a link, overlap's best speed-up."""

from __future__ import annotations

from helpers.exercises import Wrong, call, checker, close, number


@checker("07.1")
def _allreduce_on_the_link(allreduce_seconds):
    """A function (nbytes, rate_mbit) -> seconds: a 2-node ring all-reduce of nbytes on a link of rate_mbit."""
    for nbytes, rate in ((2**20, 500), (2**22, 1500), (2**24, 4000), (10**6, 8), (3 * 2**20, 200)):
        want = nbytes * 8 / (rate * 1e6)  # each node sends its whole tensor once: 2(n - 1)/n = 1 for n = 2
        got = number(*call(allreduce_seconds, nbytes, rate), "(the all-reduce's time on the link, in seconds)")
        if close(got, want, rel=1e-9):
            continue
        if close(got, want / 8, rel=1e-9):
            raise Wrong(f"{nbytes} bytes at {rate} Mbit/s: {got!r} s leaves out that a byte is 8 bits.")
        if close(got, 2 * want, rel=1e-9):
            raise Wrong(
                f"{nbytes} bytes at {rate} Mbit/s: {got!r} s sends the tensor twice; with 2 nodes a ring sends "
                "2(n - 1)/n = 1 tensor per node."
            )
        if close(got, want * 1e6 / 2**20, rel=1e-9):
            raise Wrong(f"{nbytes} bytes at {rate} Mbit/s: {got!r} s; a Mbit is 10**6 bits, not 2**20.")
        raise Wrong(f"{nbytes} bytes at {rate} Mbit/s take at least {want:.4g} s; your function gives {got!r}.")
    return True, "bytes × 8 / rate: the floor that the fitted line of section 1 approaches for large messages."


@checker("07.2")
def _best_overlap_speedup(best_speedup):
    """A function (forward, backward, comm, update) -> the no-overlap step over the perfectly overlapped one."""
    cases = (  # seconds: all-reduces shorter than backward, longer, equal, none; forward and update both matter
        (0.010, 0.040, 0.020, 0.005),
        (0.010, 0.020, 0.060, 0.005),
        (0.002, 0.030, 0.030, 0.001),
        (0.020, 0.050, 0.0, 0.010),
        (0.200, 0.050, 0.040, 0.300),
    )
    for forward, backward, comm, update in cases:
        said = f"best_speedup({forward}, {backward}, {comm}, {update})"
        got = number(call(best_speedup, forward, backward, comm, update)[0], f"{said} returned", "(a ratio)")
        serial = forward + backward + comm + update
        want = serial / (forward + max(backward, comm) + update)
        if close(got, want, rel=1e-9):
            continue
        if close(got, 1 / want, rel=1e-9):
            raise Wrong(
                f"{said} returned {got!r}: that is the overlapped step over the serial one; invert it."
            )
        if close(got, serial / (forward + backward + update), rel=1e-9):
            raise Wrong(
                f"{said} returned {got!r}: here the all-reduces ({comm} s) outlast backward ({backward} s), so "
                "only backward's share of them can hide; the rest still shows."
            )
        if close(got, (backward + comm) / max(backward, comm), rel=1e-9):
            raise Wrong(
                f"{said} returned {got!r}: forward and the update take their time in both steps; keep them."
            )
        if close(got, serial / (forward + min(backward, comm) + update), rel=1e-9):
            raise Wrong(
                f"{said} returned {got!r}: the shorter part hides behind the longer one, not the other way."
            )
        if close(got, serial - (forward + max(backward, comm) + update), rel=1e-9):
            raise Wrong(f"{said} returned {got!r}, the seconds saved; the answer is a ratio of step times.")
        raise Wrong(f"{said} should be {want:.4g}; your function gives {got!r}.")
    return True, (
        "Overlap saves at most the shorter of backward and the all-reduces: nothing when either is near zero, "
        "most when they are equal."
    )
