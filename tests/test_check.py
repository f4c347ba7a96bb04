"""`make check`: one line per thing the course needs, from a fresh clone, and a NO that says what to do."""

import os
import shutil
import subprocess

from course import machine as check
from helpers import paths

NEEDS = ["Linux x86-64", "Python 3.11", "make", "a C++ compiler", "2 CPU cores", "about 8 GB of memory",
         "5 GB of free disk", "network for set-up"]  # fmt: skip


def make_check(**env) -> tuple[int, list[str]]:
    done = subprocess.run(["make", "--no-print-directory", "check"], cwd=paths.ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)  # fmt: skip
    return done.returncode, (done.stdout + done.stderr).splitlines()


def requirement_lines(lines: list[str]) -> list[str]:
    found = [line for line in lines if line.startswith(("ok  ", "NO  "))]
    assert [next(n for n in NEEDS if line[4:].startswith(n)) for line in found] == NEEDS, lines
    return found


def test_it_prints_one_line_per_need_and_its_status_follows_them():
    status, lines = make_check()
    found = requirement_lines(lines)
    assert (status != 0) == any(line.startswith("NO") for line in found), lines  # make says 2 when the check says 1


def test_a_machine_without_a_compiler_or_python_311_gets_a_no_saying_what_to_do(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("python3", "make", "sh", "bash"):  # what make and the check need, and no compiler
        os.symlink(shutil.which(tool), bare / tool)
    status, lines = make_check(PATH=str(bare), PYTHON="python3.9")
    found = requirement_lines(lines)
    missing = sum(line.startswith("NO") for line in found)  # these two, and whatever else this machine lacks
    assert status != 0 and any(line.startswith(f"make check: {missing} of 8 missing") for line in lines), lines
    assert found[1] == "NO  Python 3.11: python3.9 is not on PATH; install Python 3.11 (e.g. uv python install 3.11)"
    assert found[3] == "NO  a C++ compiler: none of g++, c++ on PATH; install g++ (Debian/Ubuntu: apt-get install -y g++)"


def test_each_need_says_no_below_its_floor():
    assert check.system_line("Darwin", "arm64", ("", ""))[0] is False
    assert "use WSL2, a Linux VM" in check.system_line("Darwin", "arm64", ("", ""))[1]
    assert check.system_line("Linux", "x86_64", ("glibc", "2.17"))[0] is False
    assert check.system_line("Linux", "x86_64", ("glibc", "2.28"))[0] is True
    assert check.python_line("python3", (3, 12, 1), "/usr/bin/python3.11") == (
        False, "Python 3.11: python3 is 3.12.1; run set-up with PYTHON=/usr/bin/python3.11")
    assert check.python_line("python3", (3, 11, 4), None)[0] is True
    assert check.cores_line(1)[0] is False and check.cores_line(2)[0] is True
    assert check.memory_line(4e9)[0] is False and check.memory_line(7.8e9)[0] is True
    assert check.disk_line(3e9, venv_present=False)[0] is False and check.disk_line(3e9, venv_present=True)[0] is True
    assert check.network_line(venv_present=False, reachable=False)[0] is False
    assert check.network_line(venv_present=True, reachable=False)[0] is True
