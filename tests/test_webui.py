"""SWIFT's Web-UI, driven by a headless Chromium: it starts, renders its training page, and stops cleanly."""

import os
import shutil
import struct
import subprocess

import pytest

from conftest import processes_mentioning
from helpers import finetune

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
    "--virtual-time-budget=10000",  # let Gradio's scripts build the page before the capture
]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed; .ci/run installs it with apt-get install -y chromium")
    pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); CI installs it")


def browse(browser, url, profile_dir, *extra, timeout=240):
    done = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", *extra, url],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    return struct.unpack(">II", head[16:24])


def test_webui_renders_its_training_page_and_stops_cleanly(tmp_path):
    browser = chromium()
    ui = finetune.WebUI(lang="en")
    try:
        ui.start()
        status, _ = ui.wait(timeout=300)
        assert status == 200
        dom = browse(browser, ui.url, tmp_path / "profile-dom", "--dump-dom")
        assert "SWIFT" in dom and "LLM PT/SFT" in dom and "--tuner_type" in dom, dom[:2000]
        shot = tmp_path / "webui.png"
        browse(browser, ui.url, tmp_path / "profile-shot", f"--screenshot={shot}")
        width, height = png_size(shot)
        assert (width, height) == (1280, 900)
        assert shot.stat().st_size > 20_000, "a blank page compresses to almost nothing"
        if os.environ.get("COURSE_KEEP_SCREENSHOT"):
            shutil.copy(shot, os.environ["COURSE_KEEP_SCREENSHOT"])
    finally:
        left = ui.stop()
    assert left == 0
    assert finetune.http_status(ui.url, timeout=2) is None, "the page still answers after stop()"
    assert processes_mentioning(f"--server_port {ui.port}") == []
