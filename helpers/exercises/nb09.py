"""Notebook 09's exercise checkers: accumulation steps, placeholders, SWIFT's log, a changed LoRA rank."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from helpers.exercises import Wrong, brief, call, checker, close, integer, items, number
from helpers.paths import write_jsonl
from helpers.selfcog import fill_placeholders, self_cognition_rows


@checker("09.1")
def _check_grad_accum(fn):
    """fn(global_batch, nproc, per_device) -> gradient accumulation steps that keep the global batch."""
    import random

    rng = random.Random(6)
    cases = [
        (16, 1, 1),
        (16, 2, 1),
        (16, 4, 2),
        (4, 2, 2),
        (4, 1, 4),
        (32, 8, 1),
        (64, 4, 4),
        (8, 2, 4),
        (12, 3, 4),
    ]
    for _ in range(20):
        nproc, per_device, accum = (
            rng.choice([1, 2, 3, 4, 8]),
            rng.choice([1, 2, 3, 4, 16]),
            rng.randint(1, 16),
        )
        cases.append((nproc * per_device * accum, nproc, per_device))
    for global_batch, nproc, per_device in cases:
        want = global_batch // (nproc * per_device)
        got = integer(*call(fn, global_batch, nproc, per_device), "accumulation steps")
        if got == want:
            continue
        why = f"{per_device} x {nproc} x {want} = {global_batch}"
        if got == global_batch // nproc and per_device > 1:
            why += "; each process takes per_device samples per micro-batch, so divide by that too"
        raise Wrong(
            f"for a global batch of {global_batch} on {nproc} process(es) with {per_device} sample(s) "
            f"each, you gave {got!r}; {want} accumulation steps are needed ({why})."
        )
    return True, "the global batch stays the same whatever the number of processes."


def _fill_cases() -> list[tuple[dict, list, list]]:
    """Rows to fill for 09.2: the course's data, placeholders in queries, repeats, other tags, no tag."""
    import random

    rng = random.Random(62)
    extra = [
        {
            "query": "{{NAME}}是谁开发的？",
            "response": "{{NAME}}由{{AUTHOR}}开发，{{AUTHOR}}也维护它。",
            "tag": "zh",
        },
        {
            "query": "Are you {{NAME}} by {{AUTHOR}}?",
            "response": "Yes, {{NAME}} ({{NAME}}) by {{AUTHOR}}.",
            "tag": "en",
        },
        {"query": "Wer bist du, {{NAME}}?", "response": "Ich bin {{NAME}} von {{AUTHOR}}.", "tag": "de"},
        {"query": "ハロー", "response": "{{NAME}}です。{{AUTHOR}}が作りました。", "tag": "ja", "source": "x"},
        {"query": "Hello", "response": "Hi, no placeholder here.", "tag": "en"},
    ]
    names = [(["小课", "XiaoKe"], ["DDP课程", "the DDP Course"]), (["甲", "A"], ["乙", "B"])]
    names += [
        (
            [f"名{rng.randint(0, 99)}", f"N{rng.randint(0, 99)}"],
            [f"作{rng.randint(0, 99)}", f"W{rng.randint(0, 99)}"],
        )
    ]
    return [(row, n, a) for n, a in names for row in self_cognition_rows() + extra]


@checker("09.2")
def _check_fill(fn):
    """fn(row, name, author) -> the row with SWIFT's placeholders filled."""
    cases = _fill_cases()
    for row, name, author in cases:
        want = fill_placeholders(row, name, author)
        given = dict(row)
        got, said = call(fn, given, list(name), list(author), show=f"fill_row({row!r}, {name!r}, {author!r})")
        if not isinstance(got, dict):
            raise Wrong(f"{said} {brief(got)}; the answer is the filled row, a dict.")
        if given != row:
            raise Wrong(f"{said} a row, but it changed the row it was given; return a copy (dict(row)).")
        for key in ("query", "response"):
            if got.get(key) == want[key]:
                continue
            hint = "SWIFT uses the zh value for tag zh and the en value for every other tag"
            if got.get(key) == row[key] and "{{" in row[key]:
                hint = f"the {key} still holds its placeholders; fill both query and response"
            elif isinstance(got.get(key), str) and "{{" in got[key]:
                hint = "every occurrence of a placeholder is replaced, not only the first"
            raise Wrong(
                f"row {row[key]!r} (tag {row['tag']}) should become {want[key]!r}, not {brief(got.get(key))}; {hint}."
            )
        if {k: v for k, v in got.items() if k not in ("query", "response")} != {
            k: v for k, v in row.items() if k not in ("query", "response")
        }:
            raise Wrong(f"{said} {brief(got)}: keep the row's other fields (tag, ...) as they were.")
    return True, f"all {len(cases)} rows filled as SWIFT fills them."


def _log_cases(rng) -> list[tuple[list[dict], tuple[int, float]]]:
    """logging.jsonl files for 09.3 and their (last step, loss): finished, logged every k steps, killed, with eval."""

    def step(k, total, loss):
        return {"loss": loss, "token_acc": 0.5, "global_step/max_steps": f"{k}/{total}"}

    def summary(total):
        return {"train_runtime": 12.0, "train_loss": 1.5, "global_step/max_steps": f"{total}/{total}"}

    closing = {"last_model_checkpoint": "/x/checkpoint-3", "global_step": 3, "log_history": []}
    cases = [
        ([step(1, 3, 2.5), step(2, 3, 1.25), step(3, 3, 0.75), summary(3), closing], (3, 0.75)),
        ([step(5, 13, 2.0), step(10, 13, 1.5), step(13, 13, 1.0), summary(13), closing], (13, 1.0)),
        (
            [step(5, 12, 2.0), step(10, 12, 1.25), summary(12), closing],
            (10, 1.25),
        ),  # 12 is not a multiple of 5
        ([step(1, 40, 3.0), step(2, 40, 2.75), step(7, 40, 2)], (7, 2.0)),  # killed: no summary, integer loss
        (
            [step(10, 20, 1.75), {"eval_loss": 1.9, "global_step/max_steps": "10/20"}, step(20, 20, 0.5)]
            + [{"eval_loss": 0.4, "global_step/max_steps": "20/20"}, summary(20)],
            (20, 0.5),
        ),
    ]
    for _ in range(4):
        every, logged = rng.randint(1, 5), rng.randint(1, 9)
        total = every * logged + rng.randint(0, every - 1)
        lines = [step(every * (i + 1), total, round(rng.uniform(0.1, 3), 4)) for i in range(logged)]
        cases.append((lines + [summary(total), closing], (every * logged, lines[-1]["loss"])))
    return cases


@checker("09.3")
def _check_last_logged(fn):
    """fn(path_to_logging_jsonl) -> (last step, its loss)."""
    import random
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for case, (lines, want) in enumerate(_log_cases(random.Random(63))):
            path = write_jsonl(Path(tmp) / f"run{case}" / "logging.jsonl", lines)
            got, said = call(fn, str(path), show=f"last_logged on a log of {len(lines)} lines")
            step, loss = items(got, said, 2, what="a tuple (step, loss)")
            if isinstance(step, bool) or not isinstance(step, int):
                raise Wrong(f"{said} step {brief(step)}; the step is an int.")
            loss = number(loss, f"{said} loss", "(the loss, a float)")
            if (step, loss) == want:
                continue
            total = int(lines[0]["global_step/max_steps"].split("/")[1])
            shown_lines = "\n".join(json.dumps(line) for line in lines)
            if step == total != want[0]:
                why = "that is max_steps, the planned total; the step is the number before the slash on the last loss line"
            elif step == sum("loss" in line for line in lines) != want[0]:
                why = (
                    "that counts the loss lines; a run may log every k steps, so read the step from the line"
                )
            else:
                why = "the summary line (train_runtime) and the closing line (log_history) are not steps, nor is eval_loss"
            raise Wrong(f"for the log\n{shown_lines}\nthe answer is {want!r}, not {(step, loss)!r}: {why}.")
    return True, "that is how the curves in this notebook are read."


@functools.cache
def rank_change(seeds: int = 5, alpha: int = 32) -> tuple[float, bool, float]:
    """LoRA of rank 2 beside rank 8 (alpha 32) on a small random Llama: the ratio of trainable parameters,
    whether the loss before any update is equal, and the ratio of the first gradients' norms (mean over seeds)."""
    import copy

    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    counts, equal, norms = [], True, []
    for seed in range(seeds):
        torch.manual_seed(seed)
        base = transformers.LlamaForCausalLM(config).eval()
        ids = torch.randint(0, config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(seed))
        found = {}
        for rank in (2, 8):
            lora = LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear", lora_dropout=0.0)
            model = get_peft_model(copy.deepcopy(base), lora)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            trained = [p for p in model.parameters() if p.requires_grad]
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in trained]))
            found[rank] = (sum(p.numel() for p in trained), loss.item(), norm.item())
        counts.append(found[2][0] / found[8][0])
        equal = equal and found[2][1] == found[8][1]
        norms.append(found[2][2] / found[8][2])
    return sum(counts) / seeds, equal, sum(norms) / seeds


@checker("09.4")
def _check_rank_change(answer):
    """(trainable ratio, same step-1 loss, step-1 gradient-norm ratio): rank 2 over rank 8, lora_alpha 32."""
    parts = items(answer, "your answer is", 3, what="a tuple (trainable_ratio, same_first_loss, grad_norm_ratio)")
    ratio = number(parts[0], "your trainable_ratio is", "(a ratio)")
    if not isinstance(parts[1], bool):
        raise Wrong(f"your same_first_loss is {brief(parts[1])}; it is True or False.")
    norm_ratio = number(parts[2], "your grad_norm_ratio is", "(a ratio)")
    want_ratio, want_equal, want_norm = rank_change()
    if not close(ratio, want_ratio, rel=1e-9):
        if close(ratio, 1 / want_ratio, rel=1e-9):
            why = "upside down: rank 2 over rank 8, and the smaller rank trains fewer parameters"
        elif close(ratio, want_ratio**2, rel=1e-9):
            why = "each LoRA pair holds r × in + out × r numbers: linear in r, not quadratic"
        else:
            why = "each LoRA pair beside a linear layer holds A (r × in) and B (out × r): r × (in + out) numbers"
        return False, f"the trainable ratio is {want_ratio:g}, not {ratio!r}: {why}."
    if parts[1] != want_equal:
        return False, (
            "step 1's loss is computed before any update, and PEFT starts every B at zero: B A = 0, so at step 1 "
            "the adapted model is the base model, whatever the rank."
        )
    if not close(norm_ratio, want_norm, rel=0.25):
        hints = {
            1.0: "the rank does change it: the adapter's output is scaled by lora_alpha / lora_rank",
            4.0: "the scale alpha / r is 4 times larger at rank 2, but A x has r entries, so its size goes as √r",
            0.5: "A x has r entries, so its size goes as √r, but the scale alpha / r also changes, 4 times",
            0.25: "that is the parameters' ratio; a gradient's size is another thing",
        }
        hint = next((h for v, h in hints.items() if close(norm_ratio, v, rel=0.05)), "")
        hint = hint or "B's gradient is (alpha / r) × (the error) × (A x)ᵀ, and ‖A x‖ grows as √r"
        return False, f"measured here the gradient-norm ratio is about {want_norm:.1f}, not {norm_ratio!r}: {hint}."
    return True, (
        f"a quarter of the parameters, the same first loss, and about {want_norm:.1f}× the first gradient: "
        "alpha / r is 16 at rank 2 and 4 at rank 8."
    )
