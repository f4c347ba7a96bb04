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


def test_each_helpers_module_has_its_job_in_architecture_md_and_a_one_line_summary():
    """The rule is one job a module, not a line count: ARCHITECTURE.md names each helpers module in its row (the
    concept a lesson teaches, or the small library they share), and the module opens by saying what it is."""
    architecture = (HELPERS.parent / "ARCHITECTURE.md").read_text(encoding="utf-8")
    helpers_row = next(line for line in architecture.splitlines() if line.startswith("| `helpers/`"))
    for path in sorted(HELPERS.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        text = path.read_text(encoding="utf-8")
        name = path.stem if path.parent == HELPERS else path.parent.name
        assert f"`{name}`" in helpers_row, f"{path.name}: ARCHITECTURE.md's helpers row does not say what it is for"
        doc = ast.get_docstring(ast.parse(text))
        assert doc, f"{path.name} opens with no docstring"
        assert doc.split("\n\n")[0].count("\n") == 0, f"{path.name}'s docstring does not open with a one-line summary"

ROOT = HELPERS.parent
# The one module whose import acts: SWIFT loads it by path (--external_plugins), so its import is its work.
ACTS_ON_IMPORT = {"helpers.swift_local_code_only"}
IMPORT_PROBE = r"""
import ast, atexit, json, logging, os, signal, sys, threading
from pathlib import Path

modules, acting = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
for name in modules:  # their libraries first: what torch or SWIFT do on import is theirs, not the course's
    for node in ast.walk(ast.parse(Path(name.replace(".", "/") + ".py").read_text(encoding="utf-8"))):
        for lib in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []):
            if lib.split(".")[0] not in ("helpers", "course", "__future__"):
                try:
                    __import__(lib)
                except ImportError:
                    pass


def state():
    loggers = [logging.getLogger()] + [v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)]
    return {
        "atexit callbacks": atexit._ncallbacks(),
        "environment": dict(os.environ),
        "threads": sorted(t.name for t in threading.enumerate()),
        "signal handlers": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)},
        "files in the working folder": sorted(os.listdir(".")),
        "log handlers and filters": sorted(f"{l.name}:{len(l.handlers)}:{len(l.filters)}" for l in loggers),
    }


found = []
for name in modules:
    if name in acting:
        continue
    before = state()
    __import__(name)
    after = state()
    found += [f"importing {name} changed its {key}" for key in before
              if key != "log handlers and filters" and before[key] != after[key]]
    found += [f"importing {name} added log handlers or filters: {sorted(set(after[key]) - set(before[key]))}"
              for key in ["log handlers and filters"] if set(before[key]) - set(after[key])]
print(json.dumps(found))
"""


def test_importing_a_helpers_module_does_nothing_but_define_names(tmp_path):
    """ARCHITECTURE.md: importing a module defines names and does nothing else (no exit handler, environment
    variable, thread, signal handler, file or log filter), except ACTS_ON_IMPORT, named there."""
    import json
    import subprocess
    import sys

    modules = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in HELPERS.rglob("*.py")
        if path.name != "__init__.py"
    )
    probe = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, json.dumps(modules), json.dumps(sorted(ACTS_ON_IMPORT))],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert json.loads(probe.stdout.splitlines()[-1]) == []
    assert all(name.removeprefix("helpers.") in (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
               for name in ACTS_ON_IMPORT), "ARCHITECTURE.md must name the module that acts on import"  # fmt: skip


def read_variables() -> set[str]:
    """The COURSE_* environment variables the code reads or sets (quoted, after $, or assigned in a shell)."""
    import json
    import re

    pattern = re.compile(r"""["'$]\{?(COURSE_[A-Z_]+)\b|(?<![\w.])(COURSE_[A-Z_]+)=""")
    sources = [*HELPERS.rglob("*.py"), *(ROOT / "course").rglob("*.py"), *(ROOT / "scripts").iterdir(),
               ROOT / "conftest.py", ROOT / "Makefile"]  # fmt: skip
    texts = [p.read_text(encoding="utf-8") for p in sources if p.is_file()]
    for notebook in (ROOT / "notebooks").glob("[0-9]*.ipynb"):
        texts += ["".join(c["source"]) for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"]]
    return {a or b for text in texts for a, b in pattern.findall(text)}


def test_every_course_variable_is_listed_in_one_place():
    import re

    page = (ROOT / "docs" / "running.md").read_text(encoding="utf-8")
    table = page.split("## The `COURSE_*` variables", 1)[1]
    listed = {name for row in table.splitlines() if row.startswith("| `COURSE_")
              for name in re.findall(r"`(COURSE_[A-Z_]+)`", row.split("|")[1])}  # fmt: skip
    read = read_variables()
    assert read - listed == set(), f"read but not listed in docs/running.md: {sorted(read - listed)}"
    assert listed - read == set(), f"listed in docs/running.md but read nowhere: {sorted(listed - read)}"
