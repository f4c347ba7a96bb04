"""pytest, for the unit tests and for the notebooks under nbval alike: tests write only under build/test/.

Every folder the course writes to (build/, build/outputs/, build/models/) is pointed into build/test/
before any test runs, whatever the shell had set, so the adapters, merged models and ``latest-*``
records a learner made are never touched. At the end of the session the learner's build/outputs/ is
compared with what it held at the start; any difference fails the run and is listed, as does any
network-lab namespace (helpers/netlab.py) made during the session and still there at its end.
"""

import os
from pathlib import Path

from course.snapshots import differences, snapshot
from helpers import netlab

ROOT = Path(__file__).resolve().parent
# COURSE_TEST_BUILD gives a session its own folder under build/test (the Makefile runs the longest unit
# tests in a session beside the others, each session in its own folder).
TEST_BUILD = Path(os.environ.get("COURSE_TEST_BUILD", ROOT / "build" / "test")).resolve()
USER_OUTPUTS = ROOT / "build" / "outputs"
FOLDERS = {"COURSE_BUILD_DIR": TEST_BUILD, "COURSE_OUTPUTS_DIR": TEST_BUILD / "outputs",
           "COURSE_MODELS_DIR": TEST_BUILD / "models"}  # fmt: skip


def pytest_configure(config):
    for variable, folder in FOLDERS.items():
        os.environ[variable] = str(folder)
    config._user_outputs = snapshot(USER_OUTPUTS)
    config._namespaces = set(netlab.namespaces())


def _ours_or_orphaned(namespace: str) -> bool:
    """A lab namespace this session left: its owner is this process or one it started, or is gone. A live
    owner elsewhere is another session's lab (a test session running side by side), not a leak."""
    import psutil

    owner = netlab._owner(namespace)
    if owner == os.getpid() or not psutil.pid_exists(owner):
        return True
    return owner in {child.pid for child in psutil.Process().children(recursive=True)}


def pytest_sessionfinish(session, exitstatus):
    changed = differences(session.config._user_outputs, snapshot(USER_OUTPUTS))
    left = sorted(n for n in set(netlab.namespaces()) - session.config._namespaces if _ours_or_orphaned(n))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for failed, message in (
        (
            changed,
            f"the tests changed {USER_OUTPUTS}, which holds what a learner trained:\n  "
            + "\n  ".join(changed[:20]),
        ),
        (left, "the tests left network-lab namespaces behind: " + ", ".join(left)),
    ):
        if failed:
            if reporter:
                reporter.ensure_newline()
                reporter.write_line(message, red=True)
            session.exitstatus = 1
