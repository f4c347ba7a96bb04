"""pytest, for the unit tests and for the notebooks under nbval alike: tests write only under build/test/.

Every folder the course writes to (build/, build/outputs/, build/models/) is pointed into build/test/
before any test runs, whatever the shell had set, so the adapters, merged models and ``latest-*``
records a learner made are never touched. At the end of the session the learner's build/outputs/ is
compared with what it held at the start; any difference fails the run and is listed, as does any
network-lab namespace (helpers/netlab.py) made during the session and still there at its end.
"""

import os
from pathlib import Path

from helpers import netlab
from helpers.paths import differences, snapshot

ROOT = Path(__file__).resolve().parent
TEST_BUILD = ROOT / "build" / "test"
USER_OUTPUTS = ROOT / "build" / "outputs"
FOLDERS = {"COURSE_BUILD_DIR": TEST_BUILD, "COURSE_OUTPUTS_DIR": TEST_BUILD / "outputs",
           "COURSE_MODELS_DIR": TEST_BUILD / "models"}  # fmt: skip


def pytest_configure(config):
    for variable, folder in FOLDERS.items():
        os.environ[variable] = str(folder)
    config._user_outputs = snapshot(USER_OUTPUTS)
    config._namespaces = set(netlab.namespaces())


def pytest_sessionfinish(session, exitstatus):
    changed = differences(session.config._user_outputs, snapshot(USER_OUTPUTS))
    left = sorted(set(netlab.namespaces()) - session.config._namespaces)
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
