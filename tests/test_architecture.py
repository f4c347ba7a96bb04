"""ARCHITECTURE.md's rooms: `helpers`, the learner's library, leans on nothing of the course's tooling."""

import ast
from pathlib import Path

HELPERS = Path(__file__).resolve().parent.parent / "helpers"


def imported_modules(source: Path) -> list[str]:
    """Every module ``source`` imports, absolute names (a relative import is inside helpers)."""
    names = []
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_helpers_never_import_the_course_tooling_nor_drive_a_browser():
    sources = sorted(HELPERS.rglob("*.py"))
    assert len(sources) > 10
    found = [f"{path.relative_to(HELPERS.parent)}: {name}" for path in sources
             for name in imported_modules(path) if name.split(".")[0] in ("course", "websocket")]  # fmt: skip
    assert not found, f"helpers imports the course's tooling or a browser driver: {found}"


def test_each_helpers_module_is_one_idea_under_500_lines_opening_with_a_one_line_summary():
    for path in sorted(HELPERS.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        assert lines <= 500, f"{path.name} has {lines} lines: split it by concept (ARCHITECTURE.md)"
        doc = ast.get_docstring(ast.parse(text))
        assert doc, f"{path.name} opens with no docstring"
        assert doc.split("\n\n")[0].count("\n") == 0, f"{path.name}'s docstring does not open with a one-line summary"
