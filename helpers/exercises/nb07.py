"""Notebook 07's exercise checker: the least time a two-node all-reduce takes on a link of a given rate."""

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
