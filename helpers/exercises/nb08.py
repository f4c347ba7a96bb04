"""Notebook 08's exercise checker: how many gigabytes a model's weights take in a given dtype."""

from __future__ import annotations

from helpers.exercises import Wrong, call, checker, close, number

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


@checker("08.1")
def _weights_gb(weights_gb):
    """A function (parameters, dtype) -> gigabytes (10**9 bytes) of the weights alone."""
    for parameters, dtype in ((7.6e9, "bfloat16"), (135e6, "float32"), (0.5e9, "float16"), (7.6e9, "int8"), (1e9, "float32")):
        want = parameters * BYTES[dtype] / 1e9
        got = number(*call(weights_gb, parameters, dtype), "(gigabytes)")
        if close(got, want, rel=1e-9):
            continue
        if close(got, parameters * BYTES[dtype] / 2**30, rel=1e-9):
            raise Wrong(f"{parameters:g} parameters in {dtype}: {got!r} counts GiB (2**30 bytes); a GB is 10**9 bytes.")
        if close(got, parameters * 4 / 1e9, rel=1e-9):
            raise Wrong(f"{parameters:g} parameters in {dtype}: {got!r} GB counts 4 bytes each; {dtype} takes {BYTES[dtype]}.")
        raise Wrong(f"{parameters:g} parameters in {dtype} take {want:g} GB; your function gives {got!r}.")
    return True, "parameters × bytes per parameter: why the 7B model takes about 15 GB in bfloat16."
