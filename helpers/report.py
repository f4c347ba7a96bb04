"""Record a notebook's key metrics; the runner collects them into build/report.{md,json}.

``record("max_grad_diff", 3e-17)`` shows the value in the cell and tags the output so that
``course.runner`` finds it in the executed notebook. No files, no globals: the notebook is the record.
"""

from __future__ import annotations

import numbers

MIME = "application/vnd.course.metric+json"


def _plain(value):
    """JSON-friendly: numpy and torch scalars become Python numbers."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def record(name: str, value, unit: str = "", note: str = "") -> None:
    """Mark ``name = value unit`` as a metric of this notebook's run, for the run report and the site.

    It shows nothing: the sentence the learner reads carries the number. In a notebook the metric is an
    output of its own MIME type, which JupyterLab leaves blank; outside one it is not kept.
    """
    payload = {"name": name, "value": _plain(value), "unit": unit, "note": note}
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    if get_ipython() is not None:
        display({MIME: payload}, raw=True)


def reset_gpu_peak() -> None:
    """Start a new GPU memory measurement: forget the peaks so far on every GPU this process sees."""
    import torch

    if torch.cuda.is_available():
        for device in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(device)


def gpu_peak(label: str) -> float | None:
    """Record and say the most GPU memory this process held since :func:`reset_gpu_peak`, summed over every GPU it
    sees (a model placed with device_map lies on several), as ``<label>_gpu_peak_gib``; nothing without
    CUDA. Returns the value in GiB, or None. Each device's peak may fall at another moment, so the sum is an
    upper bound on what was held at once."""
    import torch

    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    peak = sum(torch.cuda.max_memory_allocated(d) for d in range(count)) / 2**30
    where = f"summed over {count} GPUs" if count > 1 else "one GPU"
    record(f"{label}_gpu_peak_gib", peak, "GiB", note=f"torch.cuda.max_memory_allocated since the reset, {where}")
    print(f"The most GPU memory held since the reset: {peak:.2f} GiB ({where}).")
    return peak


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A list of dicts as the text of a Markdown table (pipes inside a cell escaped, lists joined)."""
    if not rows:
        return ""
    columns = columns or list(rows[0])

    def cell(value) -> str:
        text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else _fmt(value)
        return text.replace("|", "\\|")

    return "\n".join(
        ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
        + ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    )


def table(rows: list[dict], columns: list[str] | None = None) -> None:
    """Show a list of dicts as a Markdown table (plain text outside Jupyter). It returns nothing, as
    ``display`` does, so a cell that ends with it shows the table once, not its text a second time."""
    if rows:
        markdown(markdown_table(rows, columns))


def show_source(fn) -> str:
    """Display a function's source code as a Markdown code block, so a lesson shows what it runs."""
    import inspect

    source = inspect.getsource(fn)
    markdown(f"```python\n{source.rstrip()}\n```", plain=source)
    return source


def markdown(text: str, plain: str | None = None) -> None:
    """Render ``text`` as Markdown in Jupyter; print ``plain`` (default: the text) elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(Markdown(text))
    else:
        print(text if plain is None else plain)
