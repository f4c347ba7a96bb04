"""Metrics, tables and exercise verdicts: what a notebook shows and what the run report collects."""

import numpy as np

from course import metrics
from helpers import report


def test_record_shows_nothing_and_collect_keeps_the_last_value(capsys, monkeypatch):
    import IPython
    import IPython.display

    report.record("loss", np.float32(0.25), "nats")  # outside Jupyter: nothing printed, nothing kept
    assert capsys.readouterr().out == ""
    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda data, raw: shown.append(data))
    report.record("loss", np.float32(0.25), "nats")
    assert shown == [{report.MIME: {"name": "loss", "value": 0.25, "unit": "nats", "note": ""}}]  # no text/plain
    first = {report.MIME: {"name": "loss", "value": 1.0, "unit": "", "note": ""}}
    later = {report.MIME: {"name": "loss", "value": 0.5, "unit": "", "note": ""}}
    other = {report.MIME: {"name": "steps", "value": 3, "unit": "", "note": ""}}
    notebook = {"cells": [{"outputs": [{"data": first}, {"data": other}]}, {"outputs": [{"data": later}]}]}
    assert [(m["name"], m["value"]) for m in metrics.collect(notebook)] == [("steps", 3), ("loss", 0.5)]


def test_table_escapes_pipes_and_joins_lists(capsys):
    rows = [{"a": "x|y", "b": [1, 2], "c": 0.123456}]
    assert report.table(rows) is None  # a cell ending with it shows the table, not its text again
    assert report.markdown_table([{"|x|": 1}]).splitlines()[0] == "| \\|x\\| |"  # a column's name too
    text = report.markdown_table(rows)
    assert text.splitlines() == ["| a | b | c |", "|---|---|---|", "| x\\|y | 1, 2 | 0.1235 |"]
    assert capsys.readouterr().out.strip() == text


def test_markdown_prints_the_plain_form_outside_jupyter(capsys):
    report.markdown("```python\nx = 1\n```", plain="x = 1")
    assert capsys.readouterr().out.strip() == "x = 1"


def test_the_run_report_keeps_a_note_with_a_pipe_in_its_cell(tmp_path):
    from course import run_report

    run = run_report.NotebookRun(name="10_x", title="10 · x", status="passed", seconds=1.0)
    run.metrics = [{"name": "gap", "value": 0.5, "unit": "", "note": "|a - b| over\ntwo lines"}]
    context = {"profile": "smoke", "started": "now", "total_seconds": 1.0}
    md, _ = run_report.write_report(tmp_path, [run], context)
    [row] = [line for line in md.read_text().splitlines() if line.startswith("| gap")]
    assert row == "| gap | 0.5 | \\|a - b\\| over two lines |"


def test_the_whole_course_is_measured_against_its_budget_only_when_every_notebook_ran(tmp_path):
    """Where every notebook of the course ran, the report gives their time against the course's budget, whether
    or not each has a budget of its own; where some did not run, it says nothing of the whole course."""
    from course import lessons, run_report

    runs = [run_report.NotebookRun(name=nb.stem, title="", status="passed", seconds=10.0,
                                   budget_seconds=lessons.BUDGETS.get(nb.name[:2], {}).get("cpu"))
            for nb in lessons.course_notebooks()]  # fmt: skip
    runs[-1].budget_seconds = None  # a notebook without a budget still counts in the whole course
    context = {"profile": "cpu", "started": "now", "total_seconds": 2000.0}
    md, _ = run_report.write_report(tmp_path, runs, context)
    assert f"Whole course: 2000 s, OVER the {lessons.COURSE_BUDGET['cpu']} s budget." in md.read_text()
    md, _ = run_report.write_report(tmp_path, runs[:-1], {**context, "total_seconds": 100.0})
    assert "Whole course" not in md.read_text()
    md, _ = run_report.write_report(tmp_path, runs, {**context, "profile": "smoke"})  # no budget for the course
    assert "Whole course" not in md.read_text()


class FakeAllocator:
    """torch.cuda's peak counters for ``devices`` GPUs: each device's peak, and which devices were reset."""

    def __init__(self, devices: int):
        self.peaks = {d: 0 for d in range(devices)}
        self.reset = []

    def install(self, monkeypatch):
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.peaks))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peaks[device or 0])
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self._reset)

    def _reset(self, device=None):
        self.reset.append(device or 0)
        self.peaks[device or 0] = 0


def test_gpu_peak_records_only_where_cuda_ran(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report.reset_gpu_peak()  # nothing to reset without CUDA
    assert report.gpu_peak("10") is None and capsys.readouterr().out == ""
    fake = FakeAllocator(1)
    fake.install(monkeypatch)
    fake.peaks[0] = 3 * 2**30
    assert report.gpu_peak("10") == 3.0
    assert capsys.readouterr().out == "The most GPU memory held since the reset: 3.00 GiB (one GPU).\n"


def test_gpu_peak_starts_at_the_reset_and_sums_every_device(monkeypatch):
    """A model placed with device_map lies on several GPUs, and an earlier measurement's peak is not this one's."""
    fake = FakeAllocator(2)
    fake.install(monkeypatch)
    fake.peaks.update({0: 20 * 2**30, 1: 0})  # an earlier, larger load on GPU 0
    report.reset_gpu_peak()
    assert sorted(fake.reset) == [0, 1]
    fake.peaks.update({0: 4 * 2**30, 1: 3 * 2**30})  # this measurement: a model split over two GPUs
    assert report.gpu_peak("11") == 7.0
