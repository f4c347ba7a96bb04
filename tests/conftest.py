"""Shared fixtures: a private build folder for each test, so tests never touch the real build/."""

import json
import os

import psutil
import pytest

from course import browser
from helpers import paths


@pytest.fixture
def build(tmp_path, monkeypatch):
    """Point helpers.paths.build_dir() at a temporary folder for this test."""
    folder = tmp_path / "build"
    monkeypatch.setenv("COURSE_BUILD_DIR", str(folder))
    return folder


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``text`` (zombies excluded)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and text in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            pass
    return found


def notebook_cell(stem: str, cell_id: str) -> str:
    """The source of one code cell of a committed notebook (a cell whose helper keeps a copy is run against it)."""
    [path] = paths.NOTEBOOKS.glob(f"{stem}*.ipynb")
    [cell] = [c for c in json.loads(path.read_text())["cells"] if c.get("id") == cell_id]
    return "".join(cell["source"])


def need_chromium() -> None:
    """CI must have Chromium (.ci/run installs it); elsewhere a test that needs it is skipped."""
    if browser.chromium() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed; .ci/run installs it with apt-get install -y chromium")
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); CI installs it")
