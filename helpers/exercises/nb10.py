"""Notebook 10's exercise checkers: merging a LoRA weight, reading swift infer's answers, a merge's scale from its weights."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.exercises import Wrong, brief, call, checker, close, number, tensor, tensors_close


def _lora_case(
    seed: int, out_features: int = 6, in_features: int = 5, r: int = 2, alpha: float = 8, dtype=None
):
    import torch

    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen, dtype=dtype)
    a = torch.randn(r, in_features, generator=gen, dtype=dtype)
    b = torch.randn(out_features, r, generator=gen, dtype=dtype)
    return weight, a, b, alpha, r


@checker("10.1")
def _check_merge_weight(fn):
    """fn(W, A, B, alpha, r) -> the merged weight W + (alpha / r) * B @ A."""
    import random

    import torch

    rng = random.Random(71)
    cases = [
        (0, 6, 5, 2, 8),
        (1, 6, 5, 4, 32),
        (2, 6, 5, 1, 1),
        (3, 7, 4, 3, 16),
        (4, 5, 8, 16, 8),
        (5, 3, 3, 2, 1),
    ]
    cases += [(6, 4, 6, 4, 12.5)]  # alpha / r not a whole number; alpha a float
    cases += [
        (10 + i, rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 8), rng.randint(1, 64))
        for i in range(8)
    ]
    for seed, out_f, in_f, r, alpha in cases:
        dtype = torch.float64 if seed % 2 else torch.float32
        weight, a, b, alpha, r = _lora_case(seed, out_f, in_f, r, alpha, dtype)
        want = weight.double() + (alpha / r) * b.double() @ a.double()
        label = f"merge_weight(W {out_f}x{in_f}, A {r}x{in_f}, B {out_f}x{r}, alpha={alpha!r}, r={r!r})"
        got = tensor(*call(fn, weight.clone(), a.clone(), b.clone(), alpha, r, show=label), weight)
        if tensors_close(got, want):
            continue
        if tensors_close(got, weight.double() + b.double() @ a.double()):
            raise Wrong(
                f"{label}: the update B @ A is scaled by alpha / r = {alpha / r!r} before it is added."
            )
        if tensors_close(got, weight.double() + (alpha // r) * b.double() @ a.double()):
            raise Wrong(
                f"{label}: alpha // r rounds the scale down to {alpha // r!r}; it is alpha / r = {alpha / r!r}."
            )
        if tensors_close(got, weight.double() + (r / alpha) * b.double() @ a.double()):
            raise Wrong(f"{label}: the scale is upside down; it is alpha / r = {alpha / r!r}.")
        if tensors_close(got, (alpha / r) * b.double() @ a.double()):
            raise Wrong(f"{label}: that is the update alone; the merged weight is W plus it.")
        raise Wrong(
            f"{label} does not give W + (alpha/r) B A; the update is B @ A (shape out x in), scaled by alpha / r."
        )
    return (
        True,
        "one matrix now does what W and the adapter did together: that is all swift export --merge_lora does.",
    )


def _infer_cases(rng) -> list[list[dict]]:
    """swift infer result files for 10.2: one or several conversations, a system prompt, several turns."""

    def line(*turns, response, system=None):
        messages = [{"role": "system", "content": system}] if system else []
        for question, answer in turns:
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": answer})
        return {"response": response, "labels": None, "messages": messages}

    files = [
        [
            line(("Who are you?", "I am XiaoKe."), response="I am XiaoKe."),
            line(("法国的首都是哪里？", "巴黎。"), response="巴黎。", system="Be brief."),
        ],
        [
            line(("Hi", "Hello!"), ("What is 2 + 2?", "4"), response="4"),
            line(
                ("你好", "你好！"),
                ("你叫什么？", "我是小课。"),
                ("谁训练的你？", "DDP课程。"),
                response="DDP课程。",
                system="S",
            ),
        ],
        [line(("Only one line?", "Yes."), response="Yes.")],
    ]
    for _ in range(3):
        rows = []
        for i in range(rng.randint(1, 5)):
            turns = [(f"q{i}.{t}-{rng.randint(0, 999)}", f"a{i}.{t}") for t in range(rng.randint(1, 3))]
            system = "You are helpful." if rng.random() < 0.5 else None
            rows.append(line(*turns, response=turns[-1][1], system=system))
        files.append(rows)
    return files


@checker("10.2")
def _check_read_answers(fn):
    """fn(path) -> {question: answer} from a swift infer result file."""
    import random
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for case, rows in enumerate(_infer_cases(random.Random(72))):
            path = Path(tmp) / f"answers{case}.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
            got, said = call(fn, str(path), show=f"answers_from on a file of {len(rows)} line(s)")
            if not isinstance(got, dict):
                raise Wrong(f"{said} {brief(got)}; the answer is a dict from question to answer.")
            want = {
                [m["content"] for m in r["messages"] if m["role"] == "user"][-1]: r["response"] for r in rows
            }
            if got == want:
                continue
            shown_rows = "\n".join(json.dumps(r, ensure_ascii=False) for r in rows)
            if len(got) < len(want) and all(want.get(k) == v for k, v in got.items()):
                why = "one entry per line of the file: every line is a question of its own"
            else:
                why = "each line's question is its last user message (a system message or earlier turns may come first) and its answer is `response`"
            raise Wrong(f"for the file\n{shown_rows}\nthe answer is {want!r}, not {brief(got, 300)}: {why}.")
    return True, "that is how the table above was read from swift infer's file."


def _merge_folders(root: Path, case: int, scale: float, config_scale: float, dtype: str, shards: int) -> dict:
    """A base model, an adapter and a merge of the two, as safetensors folders like the ones on disk here:
    the adapter's ``adapter_config.json`` says ``alpha / r = config_scale``; the merge added ``scale``·B·A."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(100 + case)
    r = 2 + case % 3
    base, lora, merged = {"model.embed_tokens.weight": torch.randn(11, 6, generator=gen)}, {}, {}
    along_w = across = 0.0  # for the s of a fit that forgets to subtract W: s + <W, BA> / <BA, BA>
    for layer in range(3):
        for proj, (out_f, in_f) in {"self_attn.q_proj": (6, 6), "mlp.down_proj": (6, 9)}.items():
            name = f"model.layers.{layer}.{proj}"
            weight = torch.randn(out_f, in_f, generator=gen)
            a, b = torch.randn(r, in_f, generator=gen) / 2, torch.randn(out_f, r, generator=gen) / 2
            base[f"{name}.weight"] = weight
            lora[f"base_model.model.{name}.lora_A.weight"] = a
            lora[f"base_model.model.{name}.lora_B.weight"] = b
            update = b.double() @ a.double()
            merged[f"{name}.weight"] = (weight.double() + scale * update).to(getattr(torch, dtype))
            along_w += float((weight.double() * update).sum())
            across += float((update * update).sum())
        base[f"model.layers.{layer}.input_layernorm.weight"] = torch.ones(6)  # not adapted: merged as is
    merged = {**{k: v.to(getattr(torch, dtype)) for k, v in base.items()}, **merged}
    folders = {kind: root / f"{kind}{case}" for kind in ("base", "adapter", "merged")}
    for kind, tensors in (("base", base), ("merged", merged)):
        folders[kind].mkdir()
        names = sorted(tensors)
        for shard in range(shards):  # a large model is saved in several files: model-00001-of-00002...
            part = {k: tensors[k].contiguous() for k in names[shard::shards]}
            file = (
                "model.safetensors" if shards == 1 else f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
            )
            save_file(part, str(folders[kind] / file))
    folders["adapter"].mkdir()
    save_file(lora, str(folders["adapter"] / "adapter_model.safetensors"))
    config = {
        "r": r,
        "lora_alpha": config_scale * r,
        "peft_type": "LORA",
        "target_modules": ["q_proj", "down_proj"],
    }
    (folders["adapter"] / "adapter_config.json").write_text(json.dumps(config))
    return {**{kind: str(folder) for kind, folder in folders.items()}, "without_w": scale + along_w / across}


@checker("10.3")
def _check_merge_scale(fn):
    """fn(base_dir, adapter_dir, merged_dir) -> the s of merged = W + s·B·A, read from the weights."""
    import tempfile

    # (scale the merge used, the scale adapter_config.json states, the merged files' dtype, files per model)
    cases = [(2.0, 4.0, "float32", 1), (4.0, 4.0, "float32", 1), (0.5, 2.0, "float32", 2), (3.0, 1.5, "bfloat16", 1),
             (8.0, 8.0, "float64", 3)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for case, (scale, config_scale, dtype, shards) in enumerate(cases):
            folders = _merge_folders(Path(tmp), case, scale, config_scale, dtype, shards)
            label = (f"merge_scale on a merge with s = {scale:g}, whose adapter_config.json says alpha/r = "
                     f"{config_scale:g} ({dtype}, {shards} weight file{'s' * (shards > 1)})")  # fmt: skip
            got = number(
                *call(fn, folders["base"], folders["adapter"], folders["merged"], show=label), "times B·A"
            )
            if close(got, scale, rel=1e-2 if dtype == "bfloat16" else 1e-4):
                continue
            if close(got, config_scale, rel=1e-3):
                raise Wrong(f"{label}: {got:g} is what adapter_config.json says; the merge added {scale:g}·B·A. "
                            "The config can be wrong: read s from the tensors (merged weight minus base weight).")  # fmt: skip
            if close(got, 1 / scale, rel=1e-2):
                raise Wrong(
                    f"{label}: {got:g} is 1/s; fit the change M - W as s times B·A, not the other way round."
                )
            if close(got, folders["without_w"], rel=1e-3):
                raise Wrong(f"{label} returned {got:g}, a fit of the merged weight M itself; the change the merge "
                            f"made is M - W, which is {scale:g}·B·A. Subtract the base model's weight first.")  # fmt: skip
            raise Wrong(f"{label} returned {got!r}; the answer is {scale:g}. Fit M - W = s·B·A over every adapted "
                        "weight, W from the base model and M from the merge (an element-wise ratio divides by "
                        "entries of B·A near zero).")  # fmt: skip
    return True, "a merge is checked from its weights: what adapter_config.json says is only what was meant."
