"""What a test session must leave alone: a folder's files listed before and after, and what changed."""

from __future__ import annotations

from pathlib import Path


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every file and folder under ``folder``: relative path -> (size, modification time in ns)."""
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.rglob("*"):
        info = path.lstat()
        found[str(path.relative_to(folder))] = (info.st_size if path.is_file() else None, info.st_mtime_ns)
    return found


def differences(before: dict, after: dict) -> list[str]:
    """What changed between two :func:`snapshot` s of a folder, one line each."""
    lines = [f"added {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return lines
