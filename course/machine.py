"""`make check`: one line per thing the course needs from this machine, before anything is installed.

``python3 -m course.machine``, by the system's python3: the standard library only (course/__init__.py imports
nothing), so that a learner can run it on a fresh clone and paste its lines back (docs/room.md, "Before and after the day"). Each line starts with ok or
NO; a NO says what to do. The exit status is 1 when a line says NO.
"""

import os
import platform
import re
import shutil
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what one learner needs (course/hub.py asks as much per learner of the room's server) (docs/room.md, "Machines"): the lock is resolved for CPython 3.11 on Linux x86-64
# with glibc 2.28 or newer (scripts/lock.py), every rank is a CPU process, 09 peaks near 6 GB, and .venv,
# the models and one merge take about 5 GB
PYTHON_VERSION = (3, 11)
GLIBC = (2, 28)
CORES, MEMORY_GB, DISK_GB = 2, 7.5, 5  # 7.5: a machine sold as 8 GB shows a little less to the system
INDEX = ("pypi.org", 443)


def which(name):
    """``name`` on PATH, leaving out the course's own .venv/bin (which make puts first): the system's tools."""
    venv_bin = os.path.join(ROOT, ".venv", "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if os.path.abspath(p) != venv_bin)
    return shutil.which(name, path=path)


def system_line(system, machine, libc):
    """Linux on x86-64 with glibc GLIBC or newer."""
    what = "Linux x86-64, glibc {}.{}+".format(*GLIBC)
    if system != "Linux" or machine not in ("x86_64", "AMD64"):
        return False, f"{what}: this is {system} {machine}; the locked packages are Linux x86-64 wheels: use WSL2, a Linux VM or " \
                      "container, or the room's server"
    version = tuple(int(n) for n in re.findall(r"\d+", libc[1])[:2]) if libc[0] == "glibc" else ()
    if version and version < GLIBC:
        return False, f"{what}: glibc {libc[1]}; a newer Linux (Debian 10, Ubuntu 20.04 or later) is needed"
    return True, "{}: {} {}, {} {}".format(what, system, machine, libc[0] or "libc", libc[1] or "?")


def python_line(python, version, found_311):
    """``python`` (what set-up runs: $PYTHON or python3) is Python 3.11, or one is on PATH to name."""
    what = "Python {}.{}".format(*PYTHON_VERSION)
    hint = f"run set-up with PYTHON={found_311}" if found_311 else "install Python 3.11 (e.g. uv python install 3.11)"
    if version is None:
        return False, f"{what}: {python} is not on PATH; {hint}"
    if version[:2] == PYTHON_VERSION:
        return True, "{}: {} is {}".format(what, python, ".".join(map(str, version)))
    return False, "{}: {} is {}; {}".format(what, python, ".".join(map(str, version)), hint)


def tool_line(what, names, install):
    found = next((which(name) for name in names if which(name)), None)
    if found:
        return True, f"{what}: {found}"
    return False, "{}: none of {} on PATH; {}".format(what, ", ".join(names), install)


def cores_line(cores):
    if cores >= CORES:
        return True, f"{CORES} CPU cores or more: {cores}"
    return False, f"{CORES} CPU cores or more: {cores}; the lessons start 2 processes at once and would crawl"


def memory_line(total_bytes):
    gb = total_bytes / 1e9
    if gb >= MEMORY_GB:
        return True, f"about 8 GB of memory: {gb:.1f} GB"
    return False, f"about 8 GB of memory: {gb:.1f} GB; 09 and 11 would run out (their peaks are 5-6 GB)"


def disk_line(free_bytes, venv_present):
    gb = free_bytes / 1e9
    if gb >= DISK_GB or venv_present and gb >= 1:
        return True, "{} GB of free disk here: {:.0f} GB{}".format(DISK_GB, gb, " (.venv already there)" if venv_present else "")
    return False, f"{DISK_GB} GB of free disk here: {gb:.1f} GB; free some, or clone the course elsewhere"


def network_line(venv_present, reachable):
    if venv_present:
        return True, "network for set-up: not needed, .venv is there"
    if reachable:
        return True, f"network for set-up: {INDEX[0]} answers"
    return False, f"network for set-up: {INDEX[0]} does not answer; set-up downloads the locked packages (a room without " \
                  "network: docs/room.md)"


def version_of(python):
    try:
        out = subprocess.run([which(python) or python, "-c", "import sys; print(*sys.version_info[:3])"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30)  # noqa: UP021 (3.6)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return tuple(int(n) for n in out.stdout.split()) if out.returncode == 0 else None


def reachable(address, timeout=5):
    try:
        socket.create_connection(address, timeout=timeout).close()
        return True
    except OSError:
        return False


def memory_bytes():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main():
    python = os.environ.get("PYTHON") or "python3"
    found = which("python3.11")
    venv = os.path.exists(os.path.join(ROOT, ".venv", "bin", "python"))
    lines = [
        system_line(platform.system(), platform.machine(), platform.libc_ver()),
        python_line(python, version_of(python), found),
        tool_line("make", ["make"], "install make (Debian/Ubuntu: apt-get install -y make)"),
        tool_line("a C++ compiler", ["g++", "c++"], "install g++ (Debian/Ubuntu: apt-get install -y g++)"),
        cores_line(cores()),
        memory_line(memory_bytes()),
        disk_line(shutil.disk_usage(ROOT).free, venv),
        network_line(venv, venv or reachable(INDEX)),
    ]
    print("make check: what this machine has for the course (docs/room.md, \"Machines\")")
    for ok, text in lines:
        print("{:<3} {}".format("ok" if ok else "NO", text))
    missing = sum(not ok for ok, _ in lines)
    if missing:
        print(f"make check: {missing} of {len(lines)} missing; fix the lines marked NO, then run make check again.")
        return 1
    print("make check: all {} present{}.".format(len(lines), "" if venv else "; next: make setup"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
