"""The README as a landing page: short, how to start near the top, and a syllabus whose times are the notebooks'."""

import json
import re

import pytest
import swift_cli

from conftest import need_chromium
from course import printable
from course.runner import course_notebooks
from helpers import paths

README = paths.ROOT / "README.md"
README_ZH = paths.ROOT / "README.zh-CN.md"
ROW = re.compile(
    r"^\| (\d\d) \| .*\| (?:about|约) (\d+) (?:min|分钟)(?: \+ (\d+) further| \+ 进阶 (\d+) 分钟)? \| (\d+) (?:s|秒) \|$", re.M
)


STATED = re.compile(r"\*\*(\d\d\.\d)\*\* \*\(about (\d+) min(, going further)?\)\*")  # "**03.3** *(about 25 min)*"


def learner_minutes(notebook) -> tuple[float, int]:
    """The README's estimate: prose at 150 words a minute, a minute per code cell, each exercise's stated minutes;
    the exercises marked "going further" apart, as (the lesson, the further exercises)."""
    cells = json.loads(notebook.read_text())["cells"]
    words = sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    code = sum(c["cell_type"] == "code" for c in cells)
    exercises = set(re.findall(r'check\("(\d\d\.\d+)"', "\n".join("".join(c["source"]) for c in cells)))
    stated = {n: (int(m), bool(f)) for n, m, f in STATED.findall("\n".join("".join(c["source"]) for c in cells
                                                                           if c["cell_type"] == "markdown"))}
    assert set(stated) == exercises, f"{notebook.name}: exercises that state no minutes: {sorted(exercises - set(stated))}"
    further = sum(minutes for minutes, apart in stated.values() if apart)
    return words / 150 + code + sum(minutes for minutes, apart in stated.values() if not apart), further


def test_the_readme_is_a_landing_page_that_says_how_to_start_first():
    words = README.read_text().split()
    assert len(words) <= 820, f"README.md has {len(words)} words; a landing page has about 800 at most"
    first = " ".join(words[:150])
    assert "make lab" in first and "notebooks/00_check_your_machine.ipynb" in first, first
    text = README.read_text()
    assert "make run" in text and "make test" in text  # the two set-up commands (.ci/run calls make test)


def test_both_syllabi_give_each_notebook_its_learner_time_and_its_recorded_cpu_time():
    notebooks = {nb.name[:2]: nb for nb in course_notebooks()}
    for readme in (README, README_ZH):
        rows = {n: (int(minutes), int(en or zh or 0), int(seconds)) for n, minutes, en, zh, seconds in ROW.findall(readme.read_text())}
        assert sorted(rows) == sorted(notebooks), f"{readme.name}: syllabus rows {sorted(rows)}"
        for number, (minutes, further, seconds) in rows.items():
            recorded = json.loads(notebooks[number].read_text())["metadata"]["course_run"]["seconds"]
            assert seconds == recorded, f"{readme.name}: {number} says {seconds} s, its last run took {recorded} s"
            estimate, stated_further = learner_minutes(notebooks[number])
            assert abs(minutes - estimate) <= 5, f"{readme.name}: {number} says {minutes} min, the estimate is {estimate:.0f}"
            assert further == stated_further, f"{readme.name}: {number} says {further} min going further, its exercises {stated_further}"


def test_no_lesson_is_over_about_75_minutes_without_its_going_further_exercises():
    for notebook in course_notebooks():
        lesson, _ = learner_minutes(notebook)
        assert lesson <= 78, f"{notebook.name}: about {lesson:.0f} min; mark an exercise going further or split the lesson"


WORKSHOP = paths.ROOT / "WORKSHOP.md"
SECTION = re.compile(r"§(\d+[a-z]?)(?:–§?(\d+))? ([^;§(]+?)(?=\s*(?:\(|;|,\s*§|$))")


def headings(number: str) -> dict[str, str]:
    """Section number -> heading text of one notebook, from its '## 1. ...' and '### 2a. ...' lines."""
    [notebook] = [nb for nb in course_notebooks() if nb.name.startswith(number)]
    found = {}
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            for m in re.finditer(r"^#{2,3} (\d+[a-z]?)\. (.+)$", "".join(cell["source"]), re.M):
                found[m.group(1)] = m.group(2)
    return found


def routes() -> dict[str, tuple[int, list[list[str]]]]:
    """Each route of WORKSHOP.md: the minutes its heading states, and its table's rows (cells: time, notebook and
    sections, minutes, what learners run and do, ...), breaks and lunch included."""
    found = {}
    text = WORKSHOP.read_text() + "\n## end\n"
    for m in re.finditer(r"^## ([^\n]+?): (\d+) minutes of teaching\n(.*?)(?=^## )", text, re.M | re.S):
        rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in m.group(3).splitlines()
                if line.startswith("| ") and not line.startswith("| time")]
        found[m.group(1)] = (int(m.group(2)), rows)
    return found


PAUSES = ("*break*", "*lunch*")


def test_each_workshop_route_adds_up_to_the_minutes_it_states():
    found = routes()
    assert set(found) == {"One-day route", "Two-day route"}, set(found)
    for name, (stated, rows) in found.items():
        teaching = sum(int(row[2]) for row in rows if row[1] not in PAUSES)
        assert teaching == stated, f"{name}: its rows teach {teaching} minutes"


def minutes_of_day(clock: str) -> int:
    hours, minutes = clock.split(":")
    return int(hours) * 60 + int(minutes)


def test_each_workshop_route_keeps_its_clock_opens_with_20_minutes_and_breaks_at_least_every_90():
    """Each row starts when the one before it ends; a row that starts earlier begins the next day. No stretch of
    teaching runs past 90 minutes without a break or lunch, and each route opens with a 20-minute opening."""
    for name, (_, rows) in routes().items():
        assert rows[0][1].startswith("Opening") and int(rows[0][2]) == 20, f"{name}: no 20-minute opening"
        end = stretch = None
        for row in rows:
            start, minutes = minutes_of_day(row[0]), int(row[2])
            if end is not None and start < end:  # the next day
                assert stretch <= 90, f"{name}: {stretch} minutes of teaching end the day without a break"
                end = stretch = None
            assert end is None or start == end, f"{name}: {row[0]} should be {end // 60:02d}:{end % 60:02d}"
            assert row[1] not in PAUSES or minutes >= 10, f"{name}: a {minutes}-minute break at {row[0]}"
            stretch = 0 if row[1] in PAUSES else (stretch or 0) + minutes
            assert stretch <= 90, f"{name}: {stretch} minutes of teaching without a break by {row[0]}"
            end = start + minutes


EXERCISE = re.compile(r"(\d\d\.\d) \((\d+) min\)")


def test_each_workshop_exercise_takes_its_stated_minutes_and_each_notebook_fits_its_estimate():
    """An exercise's minutes in the run sheet are the ones its notebook states; the minutes a route gives a notebook
    hold the exercises done in the room, and stay within the README's estimate for the whole notebook (its lesson
    and its going-further exercises). The afternoons are hands-on too."""
    stated = {}
    for notebook in course_notebooks():
        text = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
        stated |= {n: int(m) for n, m, _ in STATED.findall(text)}
    estimate = {nb.name[:2]: sum(learner_minutes(nb)) for nb in course_notebooks()}
    for name, (_, rows) in routes().items():
        given, exercises, afternoon, after_lunch = {}, {}, 0, False
        for row in rows:
            after_lunch = after_lunch or row[1] == "*lunch*"
            if row[0] == "09:00":
                after_lunch = False
            m = re.match(r"(\d\d) · ", row[1])
            for number, minutes in EXERCISE.findall(row[3]):
                assert int(minutes) == stated[number], f"{name}: {number} says {minutes} min, its notebook {stated[number]}"
                assert m and number.startswith(m.group(1)), f"{name}: {number} in a row of another notebook"
                exercises[m.group(1)] = exercises.get(m.group(1), 0) + int(minutes)
                afternoon += after_lunch
            if m:
                given[m.group(1)] = given.get(m.group(1), 0) + int(row[2])
        for number, minutes in given.items():
            assert exercises.get(number, 0) + 5 <= minutes, f"{name}: {number}'s {minutes} min leave no time to teach"
            assert minutes <= estimate[number], f"{name}: {number} gets {minutes} min, over its {estimate[number]:.0f}"
        assert afternoon >= 3, f"{name}: {afternoon} exercises after lunch"


@pytest.mark.parametrize("sheet", sorted(printable.SHEETS))
def test_each_printed_sheet_takes_two_pages_at_most(sheet, tmp_path):
    need_chromium()
    pages = printable.print_sheet(sheet, tmp_path)
    assert 1 <= pages <= printable.PAGES, f"{sheet} prints on {pages} pages"
    assert printable.page_count(b"<< /Type /Pages /Kids [3 0 R 4 0 R] >> << /Type /Page >> << /Type/Page >>") == 2


CHEATSHEET = printable.CHEATSHEET


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", CHEATSHEET.read_text(encoding="utf-8"), re.M | re.S)


def test_the_cheat_sheets_ddp_script_trains_on_two_ranks_and_leaves_one_whole_checkpoint(tmp_path):
    import torch

    from helpers import launching

    [script] = blocks("python")
    (tmp_path / "train.py").write_text(script)
    launch = launching.prepare_torchrun(tmp_path / "train.py", nproc=2, timeout=180, env={"CUDA_VISIBLE_DEVICES": ""})
    launch.cwd = tmp_path
    launching.run(launch, show=False)  # raises, with the failing rank's traceback, unless both ranks finish
    saved = torch.load(tmp_path / "checkpoint.pt")
    assert saved["epoch"] == 1 and set(saved["model"]) == {"weight", "bias"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "train.py"]  # no .tmp left behind


def commands(program: str) -> list[str]:
    """Each ``program`` command of the cheat sheet's shell blocks, its continuation lines joined, comments cut."""
    found = []
    for block in blocks("bash"):
        for command in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = command.split("#")[0].split()
            while words and "=" in words[0]:
                words.pop(0)
            if words and words[0] == program:
                found.append(command.split(" #")[0].strip())
    return found


def test_the_cheat_sheets_commands_are_ones_torchrun_and_swift_accept():
    from swift.arguments import ExportArguments, InferArguments, SftArguments
    from torch.distributed.run import get_args_parser

    launches = commands("torchrun")
    assert len(launches) == 2
    for command in launches:
        parsed = get_args_parser().parse_args(command.split()[1:])
        assert parsed.training_script == "train.py" and parsed.nproc_per_node in ("2", "8"), command
    kinds = {"sft": SftArguments, "export": ExportArguments, "infer": InferArguments}
    swift = commands("swift")
    assert sorted(command.split("swift ")[1].split()[0] for command in swift) == ["export", "infer", "sft"]
    for command in swift:
        swift_cli.parse(command, kinds[command.split("swift ")[1].split()[0]])  # fails on a flag SWIFT does not know


def test_each_workshop_run_all_is_the_notebooks_recorded_cpu_time():
    """The room's timings are the README's: each route row's "Run All (N s)" (or "about N min") is the notebook's
    last recorded cpu run, and the room's rule of thumb spans the recorded times."""
    recorded = {nb.name[:2]: json.loads(nb.read_text())["metadata"]["course_run"]["seconds"] for nb in course_notebooks()}
    said = 0
    for name, (_, rows) in routes().items():
        for row in rows:
            m = re.match(r"(\d\d) · ", row[1])
            for seconds in re.findall(r"Run All \((\d+) s\)", row[3]) if m else ():
                assert int(seconds) == recorded[m.group(1)], f"{name}: {m.group(1)} says {seconds} s, its last run took {recorded[m.group(1)]} s"
                said += 1
    assert said >= 10
    rest = [seconds for number, seconds in recorded.items() if number != "09"]
    rule = f"a whole notebook runs in {min(rest)} s to {max(rest)} s; 09 takes about {round(recorded['09'] / 60)} min"
    assert rule in " ".join(WORKSHOP.read_text().split())


def test_each_workshop_route_names_sections_the_notebooks_have():
    named = 0
    for name, (_, rows) in routes().items():
        for row in rows:
            m = re.match(r"(\d\d) · (.*)", row[1])
            if not m:
                continue  # a wrap-up block, not a notebook's sections
            have = headings(m.group(1))
            for number, last, title in SECTION.findall(re.sub(r"\([^)]*\)", "", m.group(2))):
                assert number in have, f"{name}: {m.group(1)} has no section {number}"
                if last:
                    assert last in have, f"{name}: {m.group(1)} has no section {last}"
                title = title.strip().rstrip(".")
                if title:
                    assert have[number].startswith(title), f"{name}: {m.group(1)} §{number} is {have[number]!r}, not {title!r}"
                    named += 1
    assert named >= 20  # the routes name sections by their headings, not only by number
