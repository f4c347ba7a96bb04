"""Notebook 10's exercise checkers: merging a LoRA weight, reading swift infer's answers."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.exercises import Wrong, brief, call, checker, tensor, tensors_close


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
