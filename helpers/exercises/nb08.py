"""Notebook 08's exercise checkers: a model's weights in gigabytes by dtype, and the bytes it saves to disk."""

from __future__ import annotations

from helpers.exercises import Wrong, call, checker, close, integer, number

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


def _saved_models():
    """Small Llama models saved with safetensors' save_model, which drops a tensor's second name as
    save_pretrained does (same bytes, without its progress bar): (what it is, model, tensor bytes on disk)."""
    import tempfile
    from pathlib import Path

    import torch
    from safetensors.torch import save_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cases = (("float32", True, False), ("bfloat16", True, False), ("float32", False, False), ("bfloat16", True, True))
    for dtype, tied, norms_in_float32 in cases:
        config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(getattr(torch, dtype))
        if norms_in_float32:  # mixed dtypes, as when some layers are kept in float32
            for name, module in model.named_modules():
                if name.endswith("norm"):
                    module.float()
        said = f"a {dtype} model" + (", embeddings tied to the output layer" if tied else "")
        said += ", norms in float32" if norms_in_float32 else ""
        with tempfile.TemporaryDirectory() as folder:
            save_model(model, Path(folder) / "model.safetensors")
            raw = (Path(folder) / "model.safetensors").read_bytes()  # header length (8 bytes), JSON header, tensors
            on_disk = len(raw) - 8 - int.from_bytes(raw[:8], "little")
        yield said, model, on_disk


@checker("08.2")
def _saved_bytes(saved_bytes):
    """A function model -> the bytes its tensors take in the model.safetensors that save_pretrained writes."""
    for said, model, want in _saved_models():
        got = integer(*call(saved_bytes, model, show=f"saved_bytes({said})"), "bytes")
        if got == want:
            continue
        state = list(model.state_dict().values())
        if got == sum(t.numel() * t.element_size() for t in state):
            raise Wrong(
                f"For {said} you count {got} bytes; the file holds {want}. The embedding and the output layer "
                "are one tensor under two names in state_dict(): it is saved once."
            )
        elements = sum(p.numel() for p in model.parameters())
        if got == elements:
            raise Wrong(f"For {said}, {got} is the number of elements; the answer is in bytes.")
        if got in {elements * 4, elements * 2}:
            raise Wrong(
                f"For {said}, {got} bytes gives every tensor one element size; take each tensor's own "
                "(element_size())."
            )
        raise Wrong(f"For {said} the file's tensors take {want} bytes, not {got}.")
    return True, (
        "Each distinct tensor once, at its own dtype's size: the file adds only a JSON header of names, "
        "dtypes and shapes."
    )
