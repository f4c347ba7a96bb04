"""make student: the notebooks handed out hold no solution and no output, keep every exercise, and run."""

import ast
import json
import re

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from course import student
from course.runner import execute
from helpers.errors import CourseError

EXERCISE_CALL = re.compile(r'check\("(\d\d\.\d+)"')


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    out = tmp_path_factory.mktemp("student")
    written = student.write(out)
    return out, {target: source for (source, _), target in zip(student.editions(), written, strict=True)}


def python_of(cell) -> str:
    return TransformerManager().transform_cell(cell.source)


def defined_names(cells) -> set[str]:
    names = set()
    for cell in cells:
        for node in ast.walk(ast.parse(python_of(cell))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def read(path):
    return nbformat.read(path, as_version=4)


def test_every_notebook_of_both_editions_is_written(copies):
    out, pairs = copies
    assert len(pairs) == 2 * len(student.course_notebooks())
    assert {p.parent for p in pairs} == {out, out / "zh"}


def test_no_solution_and_no_output_is_left(copies):
    _, pairs = copies
    for target, source in pairs.items():
        original, copy = read(source), read(target)
        solutions = [c for c in original.cells if student.is_solution(c)]
        assert solutions, f"{source.name}: no solution cell to remove"  # every notebook has exercises
        assert not any(student.is_solution(c) for c in copy.cells)
        assert all(not c.outputs and c.execution_count is None for c in copy.cells if c.cell_type == "code")
        assert "course_run" not in copy.metadata
        text = "\n".join(c.source for c in copy.cells)
        assert not re.search(r"\w+_solution\b|\bSOLUTION_\w+|solution=True", text), target
        lesson = {line.strip() for c in original.cells if not student.is_solution(c) for line in c.source.splitlines()}
        own = {line.strip() for c in solutions for line in c.source.splitlines()} - lesson  # not also the lesson's
        own = {line for line in own if len(line) > 25 and not line.startswith("#")}
        assert own, f"{source.name}: its solutions hold no line of their own"
        left = sorted(own & {line.strip() for line in text.splitlines()})
        assert not left, f"{target.name}: lines of a solution are still there: {left}"


def test_the_lesson_and_every_exercise_stay_in_order(copies):
    _, pairs = copies
    for target, source in pairs.items():
        original, copy = read(source), read(target)
        kept = [(c.get("id"), c.source) for c in original.cells if not student.is_solution(c)]
        assert [(c.get("id"), c.source) for c in copy.cells] == kept, target
        asked = EXERCISE_CALL.findall("\n".join(c.source for c in original.cells if not student.is_solution(c)))
        assert asked and asked == EXERCISE_CALL.findall("\n".join(c.source for c in copy.cells))


def test_removing_the_solutions_breaks_no_later_cell(copies):
    """No cell outside the solutions reads a name only a solution defines, and the cells up to the first
    exercise are the cells `make notebooks` runs, so a student copy runs as far as the course's own does."""
    _, pairs = copies
    for source in set(pairs.values()):
        cells = [c for c in read(source).cells if c.cell_type == "code"]
        solutions = [c for c in cells if student.is_solution(c)]
        others = [c for c in cells if not student.is_solution(c)]
        only_in_solutions = defined_names(solutions) - defined_names(others)
        for cell in others:
            used = {n.id for n in ast.walk(ast.parse(python_of(cell))) if isinstance(n, ast.Name)}
            assert not used & only_in_solutions, f"{source.name} {cell.get('id')} uses {used & only_in_solutions}"
        first_exercise = next(i for i, c in enumerate(cells) if EXERCISE_CALL.search(c.source))
        first_solution = next(i for i, c in enumerate(cells) if student.is_solution(c))
        assert first_exercise < first_solution, source.name


@pytest.mark.parametrize("name", ["00_check_your_machine.ipynb", "zh/03_first_collectives.ipynb"])
def test_a_student_notebook_runs_to_its_first_exercise(copies, name, tmp_path):
    out, _ = copies
    nb = read(out / name)
    first = next(i for i, c in enumerate(nb.cells) if EXERCISE_CALL.search(c.source))
    nb.cells = nb.cells[: first + 1]
    cut = tmp_path / "cut.ipynb"
    nbformat.write(nb, cut)
    run = execute(cut, tmp_path / "ran.ipynb", {"PROFILE": "smoke"}, progress=False, cell_timeout=300, cwd=tmp_path)
    assert run.status == "passed", run.error
    last = read(tmp_path / "ran.ipynb").cells[-1]
    said = "".join(o.get("text", "") for o in last.outputs)
    assert "not answered yet" in said or "还没有作答" in said or "尚未作答" in said, said


def test_a_copy_someone_changed_is_never_overwritten(tmp_path):
    student.write(tmp_path)
    edited = tmp_path / "03_first_collectives.ipynb"
    nb = json.loads(edited.read_text())
    nb["cells"][0]["source"] = "my notes"
    edited.write_text(json.dumps(nb))
    before = edited.read_bytes()
    with pytest.raises(CourseError, match=r"03_first_collectives.ipynb was changed after `make student` wrote it"):
        student.write(tmp_path)
    assert edited.read_bytes() == before
    student.write(tmp_path / "fresh")  # an untouched folder is written again without complaint
    student.write(tmp_path / "fresh")
