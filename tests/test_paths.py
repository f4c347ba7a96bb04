"""Output folders: every run gets its own, nothing earlier is overwritten."""

from helpers import paths


def test_new_output_dirs_are_numbered_and_never_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_OUTPUTS_DIR", str(tmp_path))
    first = paths.new_output_dir("lora")
    (first / "adapter_model.safetensors").write_bytes(b"trained")
    second = paths.new_output_dir("lora")
    assert (first.name, second.name) == ("v1", "v2")
    assert (first / "adapter_model.safetensors").read_bytes() == b"trained"
    (tmp_path / "lora" / "v7").mkdir()
    assert paths.new_output_dir("lora").name == "v8"


def test_build_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path / "b"))
    assert paths.run_dir("logs") == (tmp_path / "b" / "logs").resolve()
    assert (tmp_path / "b" / "logs").is_dir()
