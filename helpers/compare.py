"""How far apart two results are: the largest absolute difference, element by element, in float64."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
from torch import nn

from helpers.errors import CourseError


def _tensors(value, name: str) -> dict:
    """``value`` as named tensors: a model's parameters, a state dict, a list of tensors, or one tensor."""
    if isinstance(value, nn.Module):
        return {k: p.detach() for k, p in value.named_parameters()}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, torch.Tensor):
        return {"": value.detach()}
    if isinstance(value, (list, tuple)):
        if any(t is None for t in value):
            raise CourseError(
                f"{name} holds None where a tensor should be (a gradient before backward()); run backward() first."
            )
        return {str(i): t.detach() for i, t in enumerate(value)}
    raise CourseError(
        f"{name} is a {type(value).__name__}; give a tensor, a list of tensors, a state dict or a model."
    )


def largest_difference(a, b) -> float:
    """The largest ``|a - b|`` over every element of two results of the same layout: two tensors, two lists
    of tensors (gradients), two state dicts with the same keys, or two models' parameters. Computed in
    float64, so the difference of two float32 results is not rounded back to float32."""
    left, right = _tensors(a, "the first result"), _tensors(b, "the second result")
    if left.keys() != right.keys():
        extra = sorted(set(left) ^ set(right))
        raise CourseError(
            f"the two results do not have the same parts ({extra[:4]} are in only one); compare like with like."
        )
    shapes = {
        k: (tuple(left[k].shape), tuple(right[k].shape)) for k in left if left[k].shape != right[k].shape
    }
    if shapes:
        key, (one, two) = next(iter(shapes.items()))
        raise CourseError(
            f"part {key!r} has shape {one} in one result and {two} in the other; compare like with like."
        )
    gaps = [(left[k].double() - right[k].double()).abs().max().item() for k in left if left[k].numel()]
    return max(gaps, default=0.0)


def gradients(model: nn.Module) -> list:
    """A model's gradients, parameter by parameter, for :func:`largest_difference`."""
    return [p.grad for p in model.parameters()]


def fingerprint(module) -> str:
    """A short hash of every parameter's exact bytes: equal fingerprints mean bit-identical replicas."""
    digest = hashlib.sha256()
    for p in module.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]
