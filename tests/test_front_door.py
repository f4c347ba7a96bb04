"""The README as a landing page: short, how to start near the top, and a syllabus whose times are the notebooks'."""

import json
import re

from course.runner import course_notebooks
from helpers import paths

README = paths.ROOT / "README.md"
README_ZH = paths.ROOT / "README.zh-CN.md"
ROW = re.compile(r"^\| (\d\d) \| .*\| (?:about|约) (\d+) (?:min|分钟) \| (\d+) (?:s|秒) \|$", re.M)


def learner_minutes(notebook) -> float:
    """The README's estimate: prose at 150 words a minute, a minute per code cell, eight per exercise."""
    cells = json.loads(notebook.read_text())["cells"]
    words = sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    code = sum(c["cell_type"] == "code" for c in cells)
    exercises = set(re.findall(r'check\("(\d\d\.\d+)"', "\n".join("".join(c["source"]) for c in cells)))
    return words / 150 + code + 8 * len(exercises)


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
        rows = {n: (int(minutes), int(seconds)) for n, minutes, seconds in ROW.findall(readme.read_text())}
        assert sorted(rows) == sorted(notebooks), f"{readme.name}: syllabus rows {sorted(rows)}"
        for number, (minutes, seconds) in rows.items():
            recorded = json.loads(notebooks[number].read_text())["metadata"]["course_run"]["seconds"]
            assert seconds == recorded, f"{readme.name}: {number} says {seconds} s, its last run took {recorded} s"
            estimate = learner_minutes(notebooks[number])
            assert abs(minutes - estimate) <= 5, f"{readme.name}: {number} says {minutes} min, the estimate is {estimate:.0f}"
