"""Shared fixtures: a private build folder for each test, so tests never touch the real build/."""

import psutil
import pytest


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
