"""The notebooks' list and the time each may take: every notebook has a budget, and the cell timeout of each
profile is longer than every launch timeout a cell asks for on it (so that a launch's own timeout, which
names the job and prints its last lines, fires first)."""

import ast

import nbformat
import pytest

from course import lessons
from helpers import paths


def test_the_notebooks_are_in_course_order_and_each_has_a_title():
    found = lessons.course_notebooks()
    assert [nb.name for nb in found] == sorted(nb.name for nb in paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert [nb.name[:2] for nb in lessons.course_notebooks(["9", "11"])] == ["09", "11"]
    for notebook in found:
        assert lessons.title_of(nbformat.read(notebook, as_version=4)).startswith(notebook.name[:2] + " · ")


def test_every_notebook_has_a_budget_on_every_profile_make_run_measures():
    """The run report marks a notebook over its budget, and gives the whole course's time against its own
    only when every notebook ran: a notebook without one would pass unmeasured."""
    numbers = [nb.name[:2] for nb in lessons.course_notebooks()]
    assert sorted(lessons.BUDGETS) == numbers, "BUDGETS must hold exactly the notebooks of notebooks/"
    for number, budget in lessons.BUDGETS.items():
        assert set(budget) == {"cpu", "smoke"} and all(seconds > 0 for seconds in budget.values()), number
        assert budget["cpu"] < lessons.CELL_TIMEOUT["cpu"] and budget["smoke"] < lessons.CELL_TIMEOUT["smoke"]


# --- the cell timeout against the launch timeouts ---------------------------------------------------------

PROFILES = ("cpu", "smoke", "gpu")
UNREAD = object()  # an expression the check cannot evaluate (a condition: the branch may run)


def timeout_defaults() -> dict[str, float]:
    """Each function and method of helpers/ that takes a ``timeout``: its name -> its default, the largest
    where several share a name. A call that leaves ``timeout`` out runs with it."""
    found = {}
    for path in sorted(paths.ROOT.joinpath("helpers").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = {id(f): c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                args = node.args.args + node.args.kwonlyargs
                defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults
                defaults += node.args.kw_defaults
                name = classes.get(id(node)) if node.name == "__init__" else node.name  # a class: its constructor
                for arg, default in zip(args, defaults, strict=True):
                    if name and arg.arg == "timeout" and isinstance(default, ast.Constant) and default.value:
                        found[name] = max(found.get(name, 0), default.value)
    for name in ("swift", "swift_shell"):  # they pass their options on to prepare_swift
        found[name] = found["prepare_swift"]
    return found


class Profile:
    """The resolved profile of a run on ``name``, as far as a timeout or a branch depends on it; how many
    GPUs or ranks it has is left unread (a branch on it may run)."""

    def __init__(self, name: str):
        self.name, self.device, self.smoke = name, "cuda" if name == "gpu" else "cpu", name == "smoke"
        self.backend = "nccl" if name == "gpu" else "gloo"

    def pick(self, cpu, *, gpu=None, smoke=None):
        return gpu if self.name == "gpu" else smoke if self.smoke and smoke is not None else cpu

    def knob(self, name, value, *, cpu, gpu=None, smoke=None, lo=1, hi=None):
        return self.pick(cpu, gpu=gpu, smoke=smoke) if value is None else value


class Profiles:
    """helpers.profiles as a notebook's set-up uses it, on ``name``: ``ranks_on_cpu`` gives a lesson the cpu
    profile's values on the gpu profile."""

    def __init__(self, name: str):
        self.profile = Profile(name)

    def resolve(self, *args, **kwargs):
        return self.profile

    def ranks_on_cpu(self, profile, *args, **kwargs):
        return Profile("cpu") if profile.name == "gpu" else profile

    def check_int(self, parameter, value, *args, **kwargs):
        return value


class Names(dict):
    """A notebook's names as they stood at one point of it, each evaluated on demand on one profile."""

    def __init__(self, bindings: dict, profile: str):
        super().__init__()
        self.bindings, self.profile = bindings, profile

    def __missing__(self, name):
        if name == "profiles":
            return Profiles(self.profile)
        expression, earlier = self.bindings.get(name, (None, None))
        if expression is None:  # never assigned, or assigned where it may not run (a branch, a loop)
            raise NameError(name)
        return evaluate(expression, earlier, self.profile)


def evaluate(expression: ast.expr, bindings: dict, profile: str):
    code = compile(ast.Expression(expression), "<notebook>", "eval")
    return eval(code, {"__builtins__": {}}, Names(bindings, profile))  # noqa: S307 (the course's own notebooks)


def read(expression: ast.expr, bindings: dict, profile: str):
    try:
        return evaluate(expression, bindings, profile)
    except Exception:
        return UNREAD


def may_run(guards: list, profile: str) -> bool:
    """Whether a branch under ``guards`` ((condition, the value it needs, the names then)) may run on
    ``profile``: no condition it can read says otherwise."""
    for test, wanted, snapshot in guards:
        value = read(test, snapshot, profile)
        if value is not UNREAD and bool(value) != wanted:
            return False
    return True


def launch_timeouts(notebook) -> list[tuple[str, dict]]:
    """Every call in ``notebook``'s code to a helpers function that takes a timeout: (the call, {profile: its
    timeout in seconds}) for each profile on which its branch may run with the notebook's own parameters (what
    make run executes), UNREAD where its value cannot be read. Scripts a cell writes (``%%writefile``) are left
    out: their timeouts are their own process group's."""
    defaults = timeout_defaults()
    cells = [c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    bindings, found = {}, []

    def call(node: ast.Call, guards: list):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name not in defaults:
            return
        given = next((k.value for k in node.keywords if k.arg == "timeout"), None)
        seconds = {
            profile: defaults[name] if given is None else read(given, dict(bindings), profile)
            for profile in PROFILES
            if may_run(guards, profile)
        }
        found.append((ast.unparse(node)[:100], seconds))

    def visit(node, guards: list):
        if isinstance(node, ast.If):
            visit(node.test, guards)
            for child in node.body:
                visit(child, [*guards, (node.test, True, dict(bindings))])
            for child in node.orelse:
                visit(child, [*guards, (node.test, False, dict(bindings))])
            return
        if isinstance(node, ast.Call):
            call(node, guards)
        for child in ast.iter_child_nodes(node):
            visit(child, guards)

    for source in cells:
        if source.lstrip().startswith("%%"):
            continue
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        for statement in ast.parse("\n".join(lines)).body:
            visit(statement, [])
            if isinstance(statement, ast.Assign) and [type(t) for t in statement.targets] == [ast.Name]:
                bindings[statement.targets[0].id] = (statement.value, dict(bindings))
            elif not isinstance(statement, ast.FunctionDef | ast.ClassDef):  # what it assigns may not run
                for node in ast.walk(statement):
                    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                        bindings[node.id] = (None, None)
    return found


@pytest.mark.parametrize("notebook", lessons.course_notebooks(), ids=lambda nb: nb.name[:2])
def test_the_cell_timeout_is_longer_than_every_launch_timeout_a_cell_asks_for(notebook):
    for text, seconds in launch_timeouts(notebook):
        for profile, timeout in seconds.items():
            assert timeout is not UNREAD, (
                f"{notebook.name}: the timeout of `{text}` cannot be read on {profile}; give it as a number, "
                "profile.pick(...) or a name assigned one"
            )
            assert timeout < lessons.CELL_TIMEOUT[profile], (notebook.name, text, profile, timeout)


def test_the_launch_timeout_check_reads_the_timeouts_and_the_branches_of_a_notebook():
    """09's training launches: 600 s on cpu, 240 on smoke, 3600 on gpu; its sft_main runs in processes of their
    own on gpu only; 11's FSDP2 run on GPUs (1800 s) is not asked for on cpu, where the refusal (240 s) is."""
    [nine] = lessons.course_notebooks(["09"])
    found = dict(launch_timeouts(nine))
    assert found["swiftcli.swift_shell(sft_single, timeout=TIMEOUT)"] == {"cpu": 600, "smoke": 240, "gpu": 3600}
    [process] = [seconds for text, seconds in found.items() if text.startswith("sft.sft_process(")]
    assert process == {"gpu": 3600}
    [eleven] = lessons.course_notebooks(["11"])
    fsdp = [seconds for text, seconds in launch_timeouts(eleven) if text.startswith("swiftcli.swift_shell(fsdp_command")]
    assert fsdp == [{"cpu": 240}, {"gpu": 1800}]


def test_every_launch_timeout_a_helper_fixes_itself_is_shorter_than_every_cell_timeout():
    """A helper that launches with a timeout of its own (an exercise's checker starting ranks or a script)
    runs on every profile."""
    defaults = timeout_defaults()
    shortest = min(lessons.CELL_TIMEOUT.values())
    for path in sorted(paths.ROOT.joinpath("helpers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                given = next((k.value for k in node.keywords if k.arg == "timeout"), None)
                if name in defaults and isinstance(given, ast.Constant):
                    assert given.value < shortest, (path.name, ast.unparse(node)[:100])
