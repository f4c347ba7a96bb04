"""The GitHub Actions workflow (.github/workflows/course.yml), the CI a fork runs: actionlint and zizmor find
nothing in it, and it runs what .ci/run runs, in the same order, so the two CIs cannot drift apart."""

import re
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import environment, paths

WORKFLOW = paths.ROOT / ".github" / "workflows" / "course.yml"
CI_RUN = paths.ROOT / ".ci" / "run"
BIN = Path(sys.executable).parent  # the venv's: requirements-dev.txt pins actionlint, shellcheck and zizmor


def run_tool(*command) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], cwd=paths.ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def shown(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"


def the_job() -> dict:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    [job] = workflow["jobs"].values()
    return job


def ci_run_commands() -> list[str]:
    """What .ci/run does, line by line: its comments, `set`, `cd` and `export CI` left out (checked apart)."""
    lines = [line.split(" #")[0].strip() for line in CI_RUN.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "set ", "cd ", "export CI="))]


def test_actionlint_finds_nothing():
    # shellcheck from the venv, so every machine checks each step's script alike (it is on GitHub's runner,
    # not everywhere); no step runs Python, and pyflakes is not pinned: off
    result = run_tool(
        BIN / "actionlint", "-no-color", "-shellcheck", BIN / "shellcheck", "-pyflakes=", WORKFLOW
    )
    assert result.returncode == 0, shown(result)


def test_zizmor_finds_nothing():
    # offline: the audits that ask GitHub's API need a token; exit 0 only when there is no finding at all
    result = run_tool(BIN / "zizmor", "--offline", "--color", "never", "--no-progress", WORKFLOW)
    assert result.returncode == 0 and "No findings" in result.stdout, shown(result)


def test_the_workflow_runs_what_ci_run_runs_in_the_same_order():
    """Every command of .ci/run (Chromium's install, then `make test`) is a line of the workflow's steps, in
    that order; as root needs no sudo and the runner's user does, the workflow's `sudo` is not counted."""
    job = the_job()
    lines = [
        re.sub(r"\bsudo ", "", line).strip()
        for step in job["steps"]
        for line in step.get("run", "").splitlines()
    ]
    at = 0
    for command in ci_run_commands():
        assert command in lines[at:], (
            f".ci/run runs {command!r}; the workflow does not, or not after the last one"
        )
        at = lines.index(command, at) + 1
    assert ci_run_commands()[-1] == "make test"
    [test_step] = [step for step in job["steps"] if step.get("run", "").strip() == "make test"]
    assert test_step is job["steps"][-1], "make test is the workflow's last step, as it is .ci/run's"
    # .ci/run sets CI=true (tests that need Chromium fail instead of skipping); so does the workflow
    assert 'export CI="${CI:-true}"' in CI_RUN.read_text()
    assert {**job.get("env", {}), **test_step.get("env", {})}.get("CI") == "true"


def test_the_workflow_sets_up_the_python_and_platform_of_the_lock():
    job = the_job()
    lock_script = (paths.ROOT / "scripts" / "lock.py").read_text()
    lock_python = re.search(r'^PYTHON = "([\d.]+)"', lock_script, re.M).group(
        1
    )  # what `make lock` resolves for
    [python] = [
        step["with"]["python-version"] for step in job["steps"] if "/setup-python@" in step.get("uses", "")
    ]
    assert python == lock_python == "3.11"
    assert job["env"]["PYTHON"] == f"python{lock_python}"  # what scripts/setup.sh creates .venv with
    assert job["runs-on"] == "ubuntu-latest"  # Linux x86-64, the lock's platform
    # torch's CPU build is not on PyPI: its index, handed to uv by scripts/setup.sh
    assert job["env"]["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert environment.read_lock()["torch"]["version"].endswith("+cpu")


def test_the_cache_is_keyed_on_what_the_set_up_installs_from():
    job = the_job()
    [restore] = [step for step in job["steps"] if "/cache/restore@" in step.get("uses", "")]
    key = restore["with"]["key"]
    assert "hashFiles('requirements-lock.txt', 'requirements-lock-dev.txt', 'pyproject.toml')" in key and "py3.11" in key
    # saved after a set-up of everything make test installs: the development group too
    [setup] = [step for step in job["steps"] if step.get("name") == "make setup"]
    assert setup["run"].strip() == "make setup GROUP=dev"
    assert "build/" not in restore["with"]["path"]  # the tests build their models afresh under build/test
