"""SWIFT's Web-UI: notebook 06 maps its fields to flags. Starting it, checking its training page in a headless
Chromium and stopping it cleanly are checked by 06 itself (section 8), which the notebooks stage runs."""

from helpers import web


def test_the_field_table_is_swifts_own_labels():
    """notebook 06 maps the page's fields to flags from SWIFT's locale tables, parsed from its source."""
    from swift.ui.llm_train.lora import LoRA
    from swift.ui.llm_train.self_cog import SelfCog

    rows = {
        r["flag"]: r for r in web.webui_fields(["lora_rank", "model_author", "use_cpu", "no_such_flag"])
    }
    assert rows["--lora_rank"]["field (en)"] == LoRA.locale_dict["lora_rank"]["label"]["en"]
    assert rows["--model_author"]["字段 (zh)"] == SelfCog.locale_dict["model_author"]["label"]["zh"]
    assert set(rows) == {"--lora_rank", "--model_author"}  # no field for --use_cpu, nor for a made-up flag
