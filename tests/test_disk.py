"""helpers.disk: where modelscope keeps a model (asked of modelscope), and the gpu route's space check."""

import shutil

import pytest

from helpers import disk, models
from helpers.errors import CourseError

GB = 10**9


def free(monkeypatch, gb: float) -> None:
    """Every disk has ``gb`` GB free."""
    monkeypatch.setattr(
        shutil,
        "disk_usage",
        lambda path: shutil._ntuple_diskusage(10**13, 10**13 - int(gb * GB), int(gb * GB)),
    )


def complete(folder):
    """A downloaded model's folder: its config.json and a weights file."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"0")
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cache_is_modelscope_cache_or_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "mine"))
    assert disk.modelscope_cache() == (tmp_path / "mine").resolve()
    monkeypatch.delenv("MODELSCOPE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert disk.modelscope_cache() == (tmp_path / "home" / ".cache" / "modelscope").resolve()


def test_a_model_in_the_new_layout_counts_as_cached(cache):
    folder = complete(cache / "models" / "Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "master")
    assert disk._cached("Qwen/Qwen2.5-7B-Instruct") == folder
    assert disk._cached("Qwen/Qwen2.5-7B") is None  # the other one is not there


def test_a_model_in_the_new_layout_under_the_default_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("MODELSCOPE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = complete(
        tmp_path / ".cache" / "modelscope" / "models" / "Qwen--Qwen2.5-7B" / "snapshots" / "master"
    )
    assert disk._cached("Qwen/Qwen2.5-7B") == folder


@pytest.mark.parametrize(
    "layout",
    ["models/Qwen/Qwen2___5-7B", "hub/models/Qwen/Qwen2___5-7B", "Qwen/Qwen2.5-7B"],
)
def test_a_model_in_an_older_layout_modelscope_still_reuses_counts_as_cached(cache, layout):
    folder = complete(cache / layout)
    assert disk._cached("Qwen/Qwen2.5-7B") == folder


def test_a_partial_or_other_revision_download_does_not_count(cache):
    partial = cache / "models" / "Qwen--Qwen2.5-7B" / "snapshots" / "master"
    partial.mkdir(parents=True)
    (partial / "model-00001-of-00004.safetensors").write_bytes(b"0")  # no config.json yet
    assert disk._cached("Qwen/Qwen2.5-7B") is None
    complete(cache / "models" / "Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "v1.0")
    assert disk._cached("Qwen/Qwen2.5-7B-Instruct") is None  # the course downloads "master", not this one


def test_a_cached_7b_model_asks_for_no_download_space(cache, monkeypatch):
    """11 and 12 load a model that is cached: no 16 GB free asked for on a disk 10's merged copy has filled."""
    import modelscope

    folder = complete(cache / "models" / "Qwen--Qwen2.5-7B" / "snapshots" / "master")
    free(monkeypatch, 4)
    monkeypatch.setattr(modelscope, "snapshot_download", lambda model_id, **k: str(folder))
    assert models.from_modelscope("Qwen/Qwen2.5-7B").path == str(folder)


def test_the_route_checks_the_sum_of_downloads_and_outputs_on_one_disk(cache, tmp_path, monkeypatch):
    free(monkeypatch, 40)  # downloads 30.6 + 1 fit, the outputs' 17 fit, their 49 do not
    with pytest.raises(CourseError) as info:
        disk.gpu_route_space(tmp_path / "outputs")
    said = str(info.value)
    assert "needs about 49 GB" in said and "40.0 GB free" in said
    assert "Qwen/Qwen2.5-7B-Instruct and Qwen/Qwen2.5-7B" in said and "what notebooks 09 and 10 write" in said
    free(monkeypatch, 49)
    assert "Still to download: 30.6 GB" in disk.gpu_route_space(tmp_path / "outputs")


def test_the_route_counts_a_cached_model_out_of_the_sum(cache, tmp_path, monkeypatch):
    complete(cache / "models" / "Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "master")
    free(monkeypatch, 34)  # 15.3 + 1 still to download, 17.3 to write: 33.6
    assert "Still to download: 15.3 GB" in disk.gpu_route_space(tmp_path / "outputs")
    complete(cache / "models" / "Qwen--Qwen2.5-7B" / "snapshots" / "master")
    free(monkeypatch, 17.5)  # only the outputs are left
    assert "Both models are in the cache already." in disk.gpu_route_space(tmp_path / "outputs")
    free(monkeypatch, 17)
    with pytest.raises(CourseError, match="what notebooks 09 and 10 write .* needs about 17 GB"):
        disk.gpu_route_space(tmp_path / "outputs")


def test_on_two_disks_each_part_is_checked_on_its_own(cache, tmp_path, monkeypatch):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    cache.mkdir()
    monkeypatch.setattr(
        disk, "_device", lambda folder: 1 if disk._existing(folder) == disk._existing(outputs) else 2
    )
    free(monkeypatch, 40)  # each fits on its own disk
    assert "Still to download: 30.6 GB" in disk.gpu_route_space(outputs)
    free(monkeypatch, 31)
    with pytest.raises(CourseError, match="downloading .* needs about 32 GB"):
        disk.gpu_route_space(outputs)
