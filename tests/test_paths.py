"""Output folders: every run gets its own, nothing earlier is overwritten."""

from course import snapshots
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


def test_tests_write_only_under_build_test():
    """The root conftest.py points every folder the course writes to into build/test/."""
    test_build = paths.ROOT / "build" / "test"
    for folder in (paths.build_dir(), paths.outputs_dir(), paths.models_dir()):
        assert folder.is_relative_to(test_build), folder
    assert not paths.outputs_dir().is_relative_to(paths.ROOT / "build" / "outputs")


def test_a_snapshot_sees_files_added_removed_and_changed(tmp_path):
    (tmp_path / "run" / "v1").mkdir(parents=True)
    (tmp_path / "run" / "v1" / "adapter.bin").write_bytes(b"1234")
    (tmp_path / "latest.json").write_text("{}")
    before = snapshots.snapshot(tmp_path)
    assert snapshots.differences(before, snapshots.snapshot(tmp_path)) == []
    (tmp_path / "run" / "v2").mkdir()
    (tmp_path / "latest.json").write_text('{"smoke": 1}')
    (tmp_path / "run" / "v1" / "adapter.bin").unlink()
    assert snapshots.differences(before, snapshots.snapshot(tmp_path)) == [
        "added run/v2",
        "removed run/v1/adapter.bin",
        "changed latest.json",
        "changed run",  # a folder's modification time changes when an entry is added or removed
        "changed run/v1",
    ]


def make_versions(root, run, count, size=10):
    for n in range(1, count + 1):
        folder = root / run / f"v{n}"
        folder.mkdir(parents=True)
        (folder / "weights.bin").write_bytes(b"x" * size)


def test_prune_keeps_the_newest_and_every_version_recorded_as_latest(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("COURSE_OUTPUTS_DIR", str(tmp_path))
    make_versions(tmp_path, "self-cognition-cpu", 5)
    make_versions(tmp_path, "self-cognition-merged", 2)
    (tmp_path / "self-cognition-cpu" / "notes").mkdir()  # not a version: never touched
    recorded = tmp_path / "self-cognition-cpu" / "v1" / "checkpoint-40"
    recorded.mkdir()
    (tmp_path / "latest-self-cognition.json").write_text(json.dumps({"cpu": {"checkpoint": str(recorded)}}))
    plan = paths.prune_outputs(2, dry_run=True)
    assert [str(f.relative_to(tmp_path)) for f, _ in plan] == [
        "self-cognition-cpu/v3",
        "self-cognition-cpu/v2",
    ]
    assert all(size == 10 for _, size in plan)
    assert (tmp_path / "self-cognition-cpu" / "v2").is_dir(), "a dry run deletes nothing"
    assert paths.prune_outputs(2) == plan
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("*/*"))
    assert left == [
        "self-cognition-cpu/notes", "self-cognition-cpu/v1", "self-cognition-cpu/v4", "self-cognition-cpu/v5",
        "self-cognition-merged/v1", "self-cognition-merged/v2",
    ]  # fmt: skip
    assert paths.prune_outputs(0, dry_run=True) == [
        (tmp_path / "self-cognition-cpu" / "v5", 10), (tmp_path / "self-cognition-cpu" / "v4", 10),
        (tmp_path / "self-cognition-merged" / "v2", 10), (tmp_path / "self-cognition-merged" / "v1", 10),
    ]  # fmt: skip


def test_prune_refuses_a_keep_that_is_not_a_count(tmp_path, monkeypatch):
    import pytest

    monkeypatch.setenv("COURSE_OUTPUTS_DIR", str(tmp_path))
    for keep in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="must be a whole number"):
            paths.prune_outputs(keep)


def test_paths_are_shown_relative_to_the_repository(tmp_path):
    assert paths.relative(paths.ROOT / "build" / "outputs" / "x") == "build/outputs/x"
    assert paths.relative(tmp_path / "y") == str(tmp_path / "y")  # outside the repository: as it is


def test_relative_text_drops_the_checkout_and_home_folders():
    from pathlib import Path

    text = f"--model {paths.ROOT}/build/models/m --cache {Path.home()}/.cache/modelscope cwd={paths.ROOT}"
    assert paths.relative_text(text) == "--model build/models/m --cache ~/.cache/modelscope cwd=."
    assert paths.relative_text("/usr/bin/python") == "/usr/bin/python"


def test_an_atomic_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "deep" / "record.json"
    assert paths.write_atomic(target, "old") == target and target.read_text() == "old"
    paths.write_atomic(target, "新的")
    assert target.read_text(encoding="utf-8") == "新的"
    assert sorted(p.name for p in target.parent.iterdir()) == ["record.json"]


def test_a_lock_lets_one_process_in_at_a_time(tmp_path):
    import multiprocessing
    import time

    target = tmp_path / "model"
    with paths.locked(target):
        child = multiprocessing.get_context("fork").Process(target=_take_lock, args=(target,))
        child.start()
        time.sleep(0.5)
        assert child.is_alive(), "the second process got the lock while the first held it"
    child.join(10)
    assert child.exitcode == 0


def _take_lock(target):
    with paths.locked(target):
        pass
