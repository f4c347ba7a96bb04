"""SWIFT's Web-UI, driven by a headless Chromium: it starts, renders its training page, and stops cleanly."""

import os
import shutil
import struct

import pytest

from conftest import processes_mentioning
from helpers import finetune


def chromium() -> str:
    found = finetune.chromium()
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed; .ci/run installs it with apt-get install -y chromium")
    pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); CI installs it")


def png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    return struct.unpack(">II", head[16:24])


def test_webui_renders_its_training_page_and_stops_cleanly(tmp_path):
    chromium()
    ui = finetune.WebUI(lang="en")
    try:
        ui.start()
        status, _ = ui.wait(timeout=300)
        assert status == 200
        dom = finetune.browse(ui.url, "--dump-dom")
        assert "SWIFT" in dom and "LLM PT/SFT" in dom and "--tuner_type" in dom, dom[:2000]
        shot = tmp_path / "webui.png"
        finetune.browse(ui.url, f"--screenshot={shot}")
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


def test_the_field_table_is_swifts_own_labels():
    """notebook 06 maps the page's fields to flags from SWIFT's locale tables, parsed from its source."""
    from swift.ui.llm_train.lora import LoRA
    from swift.ui.llm_train.self_cog import SelfCog

    rows = {
        r["flag"]: r for r in finetune.webui_fields(["lora_rank", "model_author", "use_cpu", "no_such_flag"])
    }
    assert rows["--lora_rank"]["field (en)"] == LoRA.locale_dict["lora_rank"]["label"]["en"]
    assert rows["--model_author"]["字段 (zh)"] == SelfCog.locale_dict["model_author"]["label"]["zh"]
    assert set(rows) == {"--lora_rank", "--model_author"}  # no field for --use_cpu, nor for a made-up flag
